"""Issue a one-time code for a staff account to set up its authenticator app (TOTP).

A staff account cannot set up two-factor authentication with its password alone: whoever
first held the password (a temporary one handed over, one that leaked) would make the
second factor their own. The code this prints is that second proof. Hand it to the person
in person or over a channel other than the account's own mail; it works once, within 24
hours, signed in as that account, on the authenticator page (/accounts/2fa/totp/activate/).
Issuing another voids the one before.

    python manage.py staffenrol ada@example.com
"""

from __future__ import annotations

import getpass
from typing import Any

from allauth.mfa.models import Authenticator
from allauth.mfa.utils import is_mfa_enabled
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.services import STAFF_ENROLMENT_VALIDITY, staff_enrolment_issue


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="The staff account's email address.")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model().objects.filter(email__iexact=options["email"].strip())
        if users.count() != 1:
            raise CommandError(f"No single account has the address {options['email']}.")
        user = users.get()
        if is_mfa_enabled(user, [Authenticator.Type.TOTP]):
            raise CommandError(f"{user.email} already has an authenticator app: they turn it "
                               "off on /accounts/2fa/ first to set up another.")
        try:
            code = staff_enrolment_issue(user=user,
                                         issued_by=f"staffenrol (shell, {_operator()})")
        except ValidationError as error:
            raise CommandError(error.messages[0]) from None
        host = settings.ANEX_ADMIN_HOST
        page = f"https://{host}" if host else ""
        hours = int(STAFF_ENROLMENT_VALIDITY.total_seconds() // 3600)
        self.stdout.write(
            f"Enrolment code for {user.email}: {code}\n"
            f"Hand it over in person, never by mail. Signed in as {user.email}, they enter it "
            f"with their app's first code on {page}/accounts/2fa/totp/activate/ within "
            f"{hours} hours; it works once.")


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return "unknown user"
