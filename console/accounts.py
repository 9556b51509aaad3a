"""allauth's hook into the console: a sign-up gets its own organization (its free grant
once the address is verified), and a sign-up with an address that already has an account
costs the same work as one without."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.forms import SignupForm
from allauth.account.models import EmailAddress
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest
from django.utils.crypto import get_random_string

from console.services import organization_signup, signup_grant


class ConsoleAccountAdapter(DefaultAccountAdapter):
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
