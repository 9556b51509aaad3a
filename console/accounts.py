"""allauth's hook into the console: a sign-up gets its own organization (its free grant
once the address is verified), a sign-up with an address that already has an account
costs the same work as one without, a sign-in that just completed counts as a recent
authentication, and a staff account sets up its authenticator app only with a one-time
code issued from a shell."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.forms import SignupForm
from allauth.account.internal.flows.login import record_authentication
from allauth.account.models import EmailAddress
from allauth.mfa.totp.forms import ActivateTOTPForm
from django import forms
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest
from django.utils.crypto import get_random_string

from console.services import organization_signup, signup_grant, staff_enrolment_redeem

# The authentication method a completed sign-in is recorded as (settings.py names it among
# ACCOUNT_REAUTHENTICATION_METHODS, so that a recent one counts).
SIGN_IN = "sign-in"


class ConsoleAccountAdapter(DefaultAccountAdapter):
    def login(self, request: HttpRequest, user: AbstractBaseUser) -> None:
        """Every allauth sign-in ends here once all of its steps passed (the password, the
        second factor when one is on, a mailed code, the confirmation link that signs in
        the session that signed up). Re-authentication asks for a secret again when the
        last proof is not recent; allauth counts only its re-authentication page as one,
        so a person who had just signed up, confirmed and signed in was asked for the
        password again on creating their first key (issue 40). The sign-in is recorded as
        a proof made now, in allauth's own log of this session, so every
        re-authentication check (the console's and allauth's own pages alike) counts it
        for ACCOUNT_REAUTHENTICATION_TIMEOUT, and no longer."""
        super().login(request, user)
        record_authentication(request, user, method=SIGN_IN, reauthenticated=True)

    def save_user(self, request: HttpRequest, user: User, form: Any,
                  commit: bool = True) -> User:
        # The user and their organization land together or not at all; signing in still
        # waits for the address to be verified (ACCOUNT_EMAIL_VERIFICATION).
        with transaction.atomic():
            saved: User = super().save_user(request, user, form, commit=commit)
            if commit:
                organization_signup(user=saved)
        return saved


    def confirm_email(self, request: HttpRequest, email_address: EmailAddress) -> bool:
        # The free grant waits for a verified address, one per mailbox (L8).
        confirmed: bool = super().confirm_email(request, email_address)
        if confirmed:
            signup_grant(user=email_address.user, email=email_address.email)
        return confirmed


class ConsoleSignupForm(SignupForm):
    """allauth's sign-up form. For an address that has an account allauth creates nothing
    and mails its owner instead (enumeration prevention), which skipped the password
    hashing a new account costs: hundreds of milliseconds that told the two apart. The
    password is hashed either way (and, for an existing address, thrown away)."""

    def try_save(self, request: HttpRequest) -> Any:
        if self.account_already_exists:
            make_password(self.cleaned_data.get("password1") or get_random_string(32))
        return super().try_save(request)


class StaffActivateTOTPForm(ActivateTOTPForm):
    """allauth's form that turns an authenticator app on (settings.MFA_FORMS). For a staff
    account it also takes the one-time enrolment code `manage.py staffenrol` issued to
    that account (issue 40 L10): the admin sends staff without an app here, and with the
    password alone whoever first held it would make the second factor theirs. Everyone
    else sets one up as before."""

    enrolment_code = forms.CharField(
        label="Enrolment code", strip=True,
        help_text="Staff accounts only: the one-time code you were given in person "
                  "(issued with manage.py staffenrol).",
        widget=forms.TextInput(attrs={"autocomplete": "off"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.user.is_staff:
            del self.fields["enrolment_code"]

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        # Only once the app's code is right, so a mistyped one does not use the enrolment
        # code up.
        if self.user.is_staff and not self.errors:
            if not staff_enrolment_redeem(user=self.user,
                                          code=self.cleaned_data.get("enrolment_code", "")):
                self.add_error("enrolment_code", "This is not an open enrolment code for "
                               "this account: ask a superuser for a new one.")
        return cleaned
