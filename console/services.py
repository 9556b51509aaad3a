"""Every write to organizations, members, keys and the audit log (docs/dev/style.md rule 1)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from anex.errors import PaymentRequired
from billing.services import credits_grant, organization_lock
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction, Role
from console.keys import key_generate, secret_hash
from console.models import ApiKey, Invitation, Membership, Organization, StaffEnrolment
from console.selectors import member_spend_committed

INVITATION_VALIDITY = timedelta(days=7)
# Invitations an organization may send in 24 hours (each is a mail to any address).
INVITATIONS_PER_DAY = 50
LAST_OWNER = ("{email} is the last owner of {organization}: make another member an owner "
              "first, so someone can still manage its settings, members and billing.")
KEYS_MAX = ("{organization} has {count} active API keys, the most an organization may "
            "have: revoke one it no longer uses, then create the new one.")
MEMBER_KEY_BUDGET = ("A member's key needs a spend budget: only an owner can create a key "
                     "without one.")
NOT_YOUR_KEY = "Only an owner can revoke a key that someone else created."
MEMBER_LIMIT = ("Your spending limit in {organization} is {limit}, and {committed} of it is "
                "taken (the budgets of your active keys, what your other keys spent, your "
                "approvals): {what} {cents}, and {left} is left. An owner can raise the limit on "
                "the Members page.")
MEMBER_LIMIT_UNBUDGETED = ("Your spending limit in {organization} is {limit}, and one of "
                           "your active keys has no spend budget, which no limit covers: "
                           "revoke it (or ask an owner to) first.")


@transaction.atomic
def organization_create(*, name: str, actor: Actor, eu_data_routing: bool = False,
                        auto_approve: bool = False, progress_webhooks: bool = False,
                        free_grant: bool = True) -> Organization:
    """A new organization; with free_grant (createorg, the admin) the free credits at once.
    A console sign-up's organization gets them only once its owner's address is verified
    (signup_grant)."""
    organization = Organization.objects.create(
        name=name, eu_data_routing=eu_data_routing, auto_approve=auto_approve,
        progress_webhooks=progress_webhooks,
    )
    audit_record(
        organization=organization, actor=actor, action=AuditAction.ORGANIZATION_CREATED,
        target=organization,
        data={"name": name, "eu_data_routing": eu_data_routing, "auto_approve": auto_approve},
    )
    if free_grant and settings.ANEX_FREE_GRANT_CENTS > 0:
        credits_grant(organization=organization, cents=settings.ANEX_FREE_GRANT_CENTS,
                      reason="free grant for a new organization", actor=actor,
                      idempotency_key=f"grant:new-organization:{organization.pk}")
    return organization


# The organization settings a service may change, and how each is recorded. The webhook
# endpoint is not one of them: it is checked and given a secret by organization_webhook_set.
ORGANIZATION_SETTINGS = ("name", "auto_approve", "eu_data_routing", "progress_webhooks",
                         "stored_inputs_max", "stored_input_bytes_max")
# Set by us, never by a customer: a stored-input quota (jobs.services.quota).
STAFF_SETTINGS = ("stored_inputs_max", "stored_input_bytes_max")


@transaction.atomic
def organization_update(*, organization: Organization, actor: Actor,
                        **changes: Any) -> Organization:
    unknown = set(changes) - set(ORGANIZATION_SETTINGS)
    if unknown:
        raise ValueError(f"not an organization setting: {', '.join(sorted(unknown))}")
    owner_require(organization=organization, actor=actor,
                   message="Only an owner can change the organization's settings.")
    # EU data routing is turned on by us on request (the reference), never by a customer.
    if "eu_data_routing" in changes and not _staff_or_system(actor) and \
            changes["eu_data_routing"] != organization.eu_data_routing:
        raise PermissionDenied("EU data routing is turned on by anex staff on request.")
    if not _staff_or_system(actor) and any(
            name in changes and changes[name] != getattr(organization, name)
            for name in STAFF_SETTINGS):
        raise PermissionDenied("Storage quotas are set by anex staff on request.")
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    changed = {
        name: {"from": getattr(locked, name), "to": value}
        for name, value in changes.items()
        if getattr(locked, name) != value
    }
    if changed:
        Organization.objects.filter(pk=locked.pk).update(**{n: c["to"] for n, c in changed.items()})
        audit_record(
            organization=locked, actor=actor, action=AuditAction.ORGANIZATION_UPDATED,
            target=locked, data=changed,
        )
    organization.refresh_from_db()
    return organization


def _staff_or_system(actor: Actor) -> bool:
    return actor.system is not None or (actor.user is not None and actor.user.is_staff)


def _is_owner(*, organization: Organization, actor: Actor) -> bool:
    return actor.user is not None and Membership.objects.filter(
        organization=organization, user=actor.user, role=Role.OWNER).exists()


def owner_require(*, organization: Organization, actor: Actor, message: str) -> None:
    """Settings, members and the webhook are an owner's; staff and the system (createorg,
    the admin) act for them. A member, or a key, is refused."""
    if not _staff_or_system(actor) and not _is_owner(organization=organization, actor=actor):
        raise PermissionDenied(message)


def actor_named(actor: Actor) -> str:
    """Who did it, as a mail to people names them."""
    return actor.user.email if actor.user is not None and actor.user.email else "anex"


def owners_mail(*, organization: Organization, subject: str, message: str,
                but: User | None = None) -> None:
    """Tell the organization's owners (less `but`) what just changed, once the change
    commits (as an invitation is mailed): the changes that move its data or its money
    elsewhere, so an owner who did not make one hears of it (issue 40 L1)."""
    owners = Membership.objects.for_org(organization).filter(role=Role.OWNER)
    if but is not None:
        owners = owners.exclude(user=but)
    recipients = sorted({email for email in owners.values_list("user__email", flat=True)
                         if email})
    if not recipients:
        return
    transaction.on_commit(lambda: send_mail(
        subject=f"{settings.ACCOUNT_EMAIL_SUBJECT_PREFIX}{subject}",
        message=(f"{message}\n\nIf no owner of {organization.name} meant this, sign in to "
                 "the console, undo it, and change your password."),
        from_email=None, recipient_list=recipients))


def _owner_added_mail(*, organization: Organization, user: User, how: str) -> None:
    owners_mail(organization=organization, but=user,
                subject=f"{user.email} is now an owner of {organization.name}",
                message=(f"{user.email} is now an owner of {organization.name} on anex "
                         f"({how}): owners manage its members, keys, webhook endpoint and "
                         "billing."))


@transaction.atomic
def membership_add(*, organization: Organization, user: User, role: Role,
                   actor: Actor) -> Membership:
    membership, created = Membership.objects.get_or_create(
        organization=organization, user=user, defaults={"role": role}
    )
    if created:
        audit_record(
            organization=organization, actor=actor, action=AuditAction.MEMBER_ADDED,
            target=membership, data={"user": user.get_username(), "role": str(role)},
        )
        if role == Role.OWNER:
            _owner_added_mail(organization=organization, user=user,
                              how="by an invitation" if actor.user == user
                              else f"added by {actor_named(actor)}")
    return membership


def _owners_other_than(membership: Membership) -> int:
    return Membership.objects.for_org(membership.organization).filter(
        role=Role.OWNER).exclude(pk=membership.pk).count()


def membership_remove(*, membership: Membership, actor: Actor,
                      revoke_keys: bool = False) -> list[ApiKey]:
    """Remove a member (owners only; never the last owner), and with revoke_keys revoke
    the active keys they created in this organization, which otherwise keep working: a
    key belongs to the organization, not to whoever made it. Returns the keys revoked."""
    organization = membership.organization
    owner_require(organization=organization, actor=actor,
                   message="Only an owner can remove members.")
    with transaction.atomic():
        # Under the organization's row lock: two owners removing each other at once
        # cannot leave it with none.
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        locked = Membership.objects.filter(pk=membership.pk).select_related("user").first()
        if locked is None:
            return []
        if locked.role == Role.OWNER and not _owners_other_than(locked):
            raise ValidationError(LAST_OWNER.format(email=locked.user.email,
                                                    organization=organization.name),
                                  code="last_owner")
        revoked = []
        if revoke_keys:
            for key in ApiKey.objects.for_org(organization).filter(
                    created_by=locked.user, revoked_at__isnull=True):
                revoked.append(api_key_revoke(key=key, actor=actor))
        locked.delete()
        audit_record(organization=organization, actor=actor, action=AuditAction.MEMBER_REMOVED,
                     target=locked, data={"user": locked.user.get_username(),
                                          "role": locked.role,
                                          "keys_revoked": [key.prefix for key in revoked]})
    return revoked


def membership_role_set(*, membership: Membership, actor: Actor, role: Role) -> Membership:
    """Make a member an owner or an owner a member (owners only; the last owner stays)."""
    organization = membership.organization
    owner_require(organization=organization, actor=actor,
                   message="Only an owner can change roles.")
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        locked = Membership.objects.select_related("user").get(pk=membership.pk)
        if locked.role == role:
            return locked
        if locked.role == Role.OWNER and not _owners_other_than(locked):
            raise ValidationError(LAST_OWNER.format(email=locked.user.email,
                                                    organization=organization.name),
                                  code="last_owner")
        Membership.objects.filter(pk=locked.pk).update(role=role)
        audit_record(organization=organization, actor=actor,
                     action=AuditAction.MEMBER_ROLE_CHANGED, target=locked,
                     data={"user": locked.user.get_username(),
                           "from": locked.role, "to": str(role)})
        locked.role = role
        if role == Role.OWNER:
            _owner_added_mail(organization=organization, user=locked.user,
                              how=f"{actor_named(actor)} changed their role")
    return locked


def _usd(cents: int) -> str:
    return f"${cents / 100:,.2f}"


@transaction.atomic
def membership_spend_limit_set(*, membership: Membership, actor: Actor,
                               cents: int | None) -> Membership:
    """Set what a member may commit in all (None: no limit); owners only, audited. An owner
    is never held to it; it applies again if they are made a member. Lowering it below what
    is already committed takes nothing back: it refuses the next key or approval."""
    organization = membership.organization
    owner_require(organization=organization, actor=actor,
                  message="Only an owner can set a member's spending limit.")
    organization_lock(organization.pk)
    locked = Membership.objects.select_related("user").get(pk=membership.pk)
    if locked.spend_limit_cents != cents:
        Membership.objects.filter(pk=locked.pk).update(spend_limit_cents=cents)
        audit_record(organization=organization, actor=actor,
                     action=AuditAction.MEMBER_SPEND_LIMIT_SET, target=locked,
                     data={"user": locked.user.get_username(),
                           "from": locked.spend_limit_cents, "to": cents})
        locked.spend_limit_cents = cents
    return locked


def member_spend_require(*, organization: Organization, user: User, cents: int,
                         what: str) -> None:
    """Refuse a member whose spending limit does not cover `cents` more (a key's budget, a
    console approval's hold) with 402, as a key's own budget is refused (billing's
    hold_place). Owners, and members without a limit, pass. Call it inside the transaction
    that commits the spend: it takes the organization's row lock, so two at once cannot
    both fit under one limit (issue 40 L7)."""
    organization_lock(organization.pk)
    limit = Membership.objects.filter(organization=organization, user=user,
                                      role=Role.MEMBER).values_list(
        "spend_limit_cents", flat=True).first()
    if limit is None:
        return
    committed = member_spend_committed(organization=organization, user=user)
    if committed is None:
        raise PaymentRequired(MEMBER_LIMIT_UNBUDGETED.format(organization=organization.name,
                                                             limit=_usd(limit)))
    if committed + cents > limit:
        raise PaymentRequired(MEMBER_LIMIT.format(
            organization=organization.name, limit=_usd(limit), committed=_usd(committed),
            what=what, cents=_usd(cents), left=_usd(max(limit - committed, 0))))


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, actor: Actor) -> bool:
    """Withdraw an open invitation (owners only): its link stops working at once. A repeat,
    or an invitation already used or expired, changes nothing."""
    owner_require(organization=invitation.organization, actor=actor,
                   message="Only an owner can revoke invitations.")
    now = timezone.now()
    revoked = Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True,
                                        expires_at__gt=now).update(expires_at=now)
    if revoked == 1:
        audit_record(organization=invitation.organization, actor=actor,
                     action=AuditAction.INVITATION_REVOKED, target=invitation,
                     data={"email": invitation.email})
    return revoked == 1


@transaction.atomic
def organization_signup(*, user: User) -> Organization:
    """A new console user's own organization, with them as its owner (console.accounts
    calls it as allauth saves the user). The free grant waits for the address to be
    verified (signup_grant)."""
    actor = Actor(user=user)
    local_part = (user.email or user.get_username()).split("@")[0]
    organization = organization_create(name=f"{local_part}'s organization", actor=actor,
                                       free_grant=False)
    membership_add(organization=organization, user=user, role=Role.OWNER, actor=actor)
    return organization


# Mail providers that ignore dots in the local part: a.b@gmail.com is ab@gmail.com.
DOTLESS_DOMAINS = {"gmail.com": "gmail.com", "googlemail.com": "gmail.com"}


def mailbox_normalize(email: str) -> str:
    """The mailbox an address delivers to, as far as the free grant is concerned: lower
    case, without a +tag, and for Gmail without dots
    (docs/dev/decisions/2026-12-02-the-free-grant-after-verification-once-per-mailbox.md)."""
    local, _, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    domain = DOTLESS_DOMAINS.get(domain, domain)
    if domain == "gmail.com":
        local = local.replace(".", "")
    return f"{local}@{domain}"


@transaction.atomic
def signup_grant(*, user: User, email: str) -> bool:
    """The free grant for the organization a console sign-up made, once its owner has
    verified `email` (console.accounts calls it when allauth confirms an address): one
    grant per normalized mailbox, ever, so new accounts on a.b+1@gmail.com, ab+2@gmail.com
    and so on farm nothing. Returns whether the organization holds the mailbox's grant."""
    cents = settings.ANEX_FREE_GRANT_CENTS
    membership = (Membership.objects.filter(user=user, role=Role.OWNER)
                  .select_related("organization").order_by("created_at").first())
    if cents <= 0 or membership is None:
        return False
    mailbox = hashlib.sha256(mailbox_normalize(email).encode()).hexdigest()
    entry = credits_grant(organization=membership.organization, cents=cents,
                          reason="free grant after email verification", actor=Actor(user=user),
                          idempotency_key=f"grant:mailbox:{mailbox}")
    # The key is the mailbox's: an entry of another organization's means it was granted
    # there, and nothing was written here.
    return entry.organization_id == membership.organization_id


def _invitation_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_create(*, organization: Organization, actor: Actor, email: str,
                      role: Role = Role.MEMBER, accept_url: Callable[[str], str],
                      ) -> Invitation:
    """Invite an email address; the mail carries accept_url(token), sent after commit.
    Only the token's digest is stored, so the link works from the mail alone."""
    owner_require(organization=organization, actor=actor,
                   message="Only an owner can invite members.")
    email = email.strip().lower()
    if Membership.objects.for_org(organization).filter(user__email__iexact=email).exists():
        raise ValidationError(f"{email} is already a member of {organization.name}.",
                              code="member")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        # Counted under the organization's row lock: two owners at once cannot both pass.
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        sent = Invitation.objects.for_org(organization).filter(
            created_at__gt=timezone.now() - timedelta(days=1)).count()
        if sent >= INVITATIONS_PER_DAY:
            raise ValidationError(
                f"{organization.name} has sent {INVITATIONS_PER_DAY} invitations in the last "
                "24 hours, the most a day allows; invite more tomorrow.", code="rate")
        invitation = Invitation.objects.create(
            organization=organization, email=email, role=role,
            token_hash=_invitation_token_hash(token), invited_by=actor.user,
            expires_at=timezone.now() + INVITATION_VALIDITY,
        )
        audit_record(organization=organization, actor=actor, action=AuditAction.MEMBER_INVITED,
                     target=invitation, data={"email": email, "role": str(role)})
        link = accept_url(token)
        inviter = actor.user.email if actor.user is not None else "anex"
        transaction.on_commit(lambda: send_mail(
            subject=f"{settings.ACCOUNT_EMAIL_SUBJECT_PREFIX}You are invited to "
                    f"{organization.name}",
            message=(f"{inviter} invited you to join {organization.name} on anex as "
                     f"{role.label.lower()}.\n\nSign in (or sign up) with this address, "
                     f"then open this link to accept:\n\n{link}\n\nThe link works for "
                     f"{INVITATION_VALIDITY.days} days."),
            from_email=None, recipient_list=[email]))
        if role == Role.OWNER:
            owners_mail(organization=organization,
                        subject=f"{email} is invited to become an owner of {organization.name}",
                        message=(f"{actor_named(actor)} invited {email} to join "
                                 f"{organization.name} on anex as an owner. The invitation "
                                 f"works for {INVITATION_VALIDITY.days} days; an owner can "
                                 "revoke it on the console's Members page."))
    return invitation


def invitation_for_token(token: str) -> Invitation | None:
    """The open invitation this link's token is (not accepted, not expired), or None."""
    return (Invitation.objects.select_related("organization")
            .filter(token_hash=_invitation_token_hash(token), accepted_at__isnull=True,
                    expires_at__gt=timezone.now()).first())


@transaction.atomic
def invitation_accept(*, invitation: Invitation, user: User) -> Membership:
    """Join the organization. The user must have proved they own the invited address;
    an invitation is used once."""
    if not EmailAddress.objects.filter(user=user, email__iexact=invitation.email,
                                       verified=True).exists():
        raise PermissionDenied(f"This invitation is for {invitation.email}: sign in with "
                               "that address (verified) to accept it.")
    taken = Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True,
                                      expires_at__gt=timezone.now()).update(
        accepted_at=timezone.now(), accepted_by=user)
    if taken != 1:
        raise ValidationError("This invitation has already been used or has expired.",
                              code="invitation")
    return membership_add(organization=invitation.organization, user=user,
                          role=Role(invitation.role), actor=Actor(user=user))


@transaction.atomic
def api_key_create(*, organization: Organization, actor: Actor, name: str = "",
                   expires_at: datetime | None = None, model_scopes: Iterable[str] = (),
                   spend_budget_cents: int | None = None,
                   rate_limit_per_minute: int | None = None) -> tuple[ApiKey, str]:
    """Create a key; returns it with its plaintext, which is never available again. An
    organization has at most ANEX_API_KEYS_MAX active keys (each has its own request
    rate); a member's key carries a spend budget
    (docs/dev/decisions/2026-12-02-roles-and-offboarding.md)."""
    member = not _staff_or_system(actor) and not _is_owner(organization=organization,
                                                            actor=actor)
    if spend_budget_cents is None and member:
        raise ValidationError(MEMBER_KEY_BUDGET, code="budget")
    # Counted under the organization's row lock, so concurrent creations cannot overshoot.
    Organization.objects.select_for_update().filter(pk=organization.pk).first()
    if member and actor.user is not None and spend_budget_cents is not None:
        member_spend_require(organization=organization, user=actor.user,
                             cents=spend_budget_cents,
                             what="this key's budget is")
    active = ApiKey.objects.for_org(organization).filter(revoked_at__isnull=True).count()
    if active >= settings.ANEX_API_KEYS_MAX:
        raise ValidationError(KEYS_MAX.format(organization=organization.name, count=active),
                              code="keys")
    parts = key_generate()
    key = ApiKey.objects.create(
        organization=organization,
        name=name,
        prefix=parts.prefix,
        secret_hash=secret_hash(parts.secret),
        created_by=actor.user,
        expires_at=expires_at,
        model_scopes=sorted(set(model_scopes)),
        spend_budget_cents=spend_budget_cents,
        rate_limit_per_minute=rate_limit_per_minute,
    )
    audit_record(
        organization=organization, actor=actor, action=AuditAction.API_KEY_CREATED,
        target=key,
        data={
            "prefix": key.prefix,
            "name": name,
            "expires_at": expires_at.isoformat() if expires_at else None,
            "model_scopes": key.model_scopes,
            "spend_budget_cents": spend_budget_cents,
            "rate_limit_per_minute": rate_limit_per_minute,
        },
    )
    return key, parts.plaintext


@transaction.atomic
def api_key_revoke(*, key: ApiKey, actor: Actor) -> ApiKey:
    """Revoke a key. A repeat is a no-op: the first revocation time and audit entry stand.
    A member may revoke the keys they created; a key someone else created is an owner's
    to revoke."""
    if actor.user is not None and key.created_by_id != actor.user.pk:
        owner_require(organization=key.organization, actor=actor, message=NOT_YOUR_KEY)
    revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    key.refresh_from_db(fields=["revoked_at"])
    if revoked == 1:
        audit_record(
            organization=key.organization, actor=actor, action=AuditAction.API_KEY_REVOKED,
            target=key, data={"prefix": key.prefix},
        )
    return key


# How long a staff enrolment code works
# (docs/dev/decisions/2026-12-06-the-admin-on-a-host-of-its-own.md).
STAFF_ENROLMENT_VALIDITY = timedelta(hours=24)


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@transaction.atomic
def staff_enrolment_issue(*, user: User, issued_by: str) -> str:
    """A one-time code for this staff account to set up its authenticator app with; any
    code issued to it before stops working. Returns the code, which is stored only as its
    digest: the caller hands it over in person, never by the account's own mail."""
    if not user.is_staff or not user.is_active:
        raise ValidationError(f"{user.get_username()} is not an active staff account.",
                              code="staff")
    now = timezone.now()
    StaffEnrolment.objects.filter(user=user, used_at__isnull=True,
                                  expires_at__gt=now).update(expires_at=now)
    code = secrets.token_urlsafe(24)
    StaffEnrolment.objects.create(user=user, code_hash=_code_hash(code), issued_by=issued_by,
                                  expires_at=now + STAFF_ENROLMENT_VALIDITY)
    return code


def staff_enrolment_redeem(*, user: User, code: str) -> bool:
    """Use up this account's open enrolment code: True once, for the code issued to this
    very account, unused and unexpired (a conditional UPDATE, so two tries at once cannot
    both pass)."""
    return StaffEnrolment.objects.filter(
        user=user, code_hash=_code_hash(code.strip()), used_at__isnull=True,
        expires_at__gt=timezone.now()).update(used_at=timezone.now()) == 1
