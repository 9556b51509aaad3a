"""allauth's hook into the console: a sign-up gets its own organization."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest

from console.services import organization_signup


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
