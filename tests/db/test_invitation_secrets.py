"""Issue 22, L7: an invitation's token travels in its link's path, which the access log and
Django's request log write out, and in the sign-in page's ?next=. Each attack reads a log
or a redirect for the token and finds it masked or absent; and an organization cannot mail
invitations without bound."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.utils import timezone
from gunicorn.config import Config
from gunicorn.http.wsgi import Response

from anex.accesslog import MaskedAccessLogger
from anex.devstack import ACCESS_LOG_FORMAT
from anex.logmask import SecretsLogFilter
from console.models import Invitation, Membership, Organization
from console.services import INVITATIONS_PER_DAY
from tests.db.test_console import form, signed_in
from tests.factories import organization_make

pytestmark = pytest.mark.django_db


def invited(owner: Client, organization: Organization, email: str,
            on_commit: Callable[..., Any]) -> tuple[str, str]:
    """An invitation sent from the console: its link's path and its token."""
    with on_commit(execute=True):
        assert owner.post("/console/members", form(organization, {"email": email,
                                                                  "role": "member"})
                          ).status_code == 302
    found = re.search(r"http://testserver(/console/invitations/(\S+))", str(mail.outbox[-1].body))
    assert found is not None
    return found.group(1), found.group(2)


def test_a_signed_out_invitee_signs_in_without_the_token_in_next(
        organization: Organization,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    owner, _ = signed_in(organization)
    link, token = invited(owner, organization, "bob@example.com",
                          django_capture_on_commit_callbacks)
    # when the invitee opens the link signed out
    visitor = Client()
    opened = visitor.get(link)
    # then the sign-in page is asked to come back to a page that carries no token
    assert opened.status_code == 302
    assert opened["Location"] == "/accounts/login/?next=/console/invitation"
    assert token not in opened["Location"]
    # and once signed in with the invited address, that page offers the invitation
    bob_client, bob = signed_in(organization_make())
    get_user_model().objects.filter(pk=bob.pk).update(email="bob@example.com")
    EmailAddress.objects.filter(user=bob).update(email="bob@example.com")
    assert visitor.session.get("anex_invitation_token") == token
    bob_client.cookies = visitor.cookies  # the same browser: its session kept the token
    bob_client.force_login(bob)  # signing in keeps the session's data
    page = bob_client.get("/console/invitation")
    assert page.status_code == 200 and "Join " in page.content.decode()
    assert bob_client.post("/console/invitation").status_code == 302
    assert Membership.objects.filter(organization=organization, user=bob).exists()
    assert bob_client.get("/console/invitation").status_code == 404  # used once


def test_djangos_request_log_masks_the_token(organization: Organization) -> None:
    # given the configured log handler, writing to a buffer
    handler = next(h for h in logging.getLogger().handlers
                   if any(isinstance(f, SecretsLogFilter) for f in h.filters))
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        # when a signed-in visitor opens a link with a wrong token (Django logs the 404)
        client, _ = signed_in(organization)
        assert client.get("/console/invitations/guessed-TOKEN-123").status_code == 404
    finally:
        handler.setStream(previous)  # type: ignore[arg-type]
    # then the line names the path without the token
    written = buffer.getvalue()
    assert "/console/invitations/…" in written
    assert "guessed-TOKEN-123" not in written


def test_the_access_log_masks_the_token() -> None:
    # gunicorn's own logger, as make run starts it, formatting an invitation request
    logger = MaskedAccessLogger(Config())
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": "/console/invitations/s3cret-TOKEN",
               "PATH_INFO": "/console/invitations/s3cret-TOKEN", "QUERY_STRING": "",
               "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
               "HTTP_REFERER": "https://mail.example/console/invitations/s3cret-TOKEN"}

    class Request:
        headers: list[tuple[str, str]] = []

    response = Response(Request(), None, Config())
    response.status = "302 Found"
    atoms = logger.atoms(response, Request(), environ, timedelta(milliseconds=5))
    line = ACCESS_LOG_FORMAT % atoms
    assert '"GET /console/invitations/… HTTP/1.1" 302' in line
    assert all("s3cret-TOKEN" not in str(value) for value in atoms.values())


def test_an_organization_sends_at_most_so_many_invitations_a_day(
        organization: Organization) -> None:
    owner, _ = signed_in(organization)
    for n in range(INVITATIONS_PER_DAY - 1):
        Invitation.objects.create(organization=organization, email=f"x{n}@example.com",
                                  token_hash=f"{n:064d}",
                                  expires_at=timezone.now() + timedelta(days=7))
    assert owner.post("/console/members", form(organization, {"email": "last@example.com",
                                            "role": "member"})).status_code == 302
    mail.outbox.clear()
    refused = owner.post("/console/members", form(organization, {"email": "one-more@example.com",
                                              "role": "member"}))
    assert refused.status_code == 200
    assert (f"has sent {INVITATIONS_PER_DAY} invitations in the last 24 hours"
            in refused.content.decode())
    assert Invitation.objects.for_org(organization).count() == INVITATIONS_PER_DAY
    assert mail.outbox == []
    # a day later, one may be sent again
    Invitation.objects.for_org(organization).update(
        created_at=timezone.now() - timedelta(days=1, seconds=1))
    assert owner.post("/console/members", form(organization, {"email": "one-more@example.com",
                                            "role": "member"})).status_code == 302
