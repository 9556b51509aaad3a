"""`manage.py createorg` prints one JSON object with a working key."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.apikeys import api_key_for_plaintext
from console.models import AuditEvent, Organization
from console.selectors import organization_webhook_secret

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]


def createorg(*args: str) -> dict[str, str]:
    out = io.StringIO()
    call_command("createorg", *args, stdout=out)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_it_prints_the_organization_and_a_working_key() -> None:
    created = createorg("--name", "Acme")
    assert set(created) == {"organization_id", "api_key"}
    organization = Organization.objects.get(pk=uuid.UUID(created["organization_id"]))
    assert (organization.name, organization.eu_data_routing, organization.auto_approve) == (
        "Acme", False, False)
    key = api_key_for_plaintext(created["api_key"])
    assert key is not None and key.organization == organization
    client = APIClient(HTTP_AUTHORIZATION=f"Bearer {created['api_key']}")
    assert client.get(f"/batch/v1/_probe/keys/{key.pk}").status_code == 200


def test_flags_set_eu_routing_and_auto_approve() -> None:
    created = createorg("--name", "Euro", "--eu", "--auto-approve")
    organization = Organization.objects.get(pk=created["organization_id"])
    assert organization.eu_data_routing and organization.auto_approve


def test_it_records_who_did_it() -> None:
    created = createorg("--name", "Audited")
    actions = set(AuditEvent.objects.filter(organization_id=created["organization_id"])
                  .values_list("action", "actor_label"))
    assert actions == {("organization.created", "system: createorg"),
                       ("api_key.created", "system: createorg"),
                       ("credits.granted", "system: createorg")}


def test_credits_cents_grants_at_creation(settings) -> None:  # type: ignore[no-untyped-def]
    settings.ANEX_FREE_GRANT_CENTS = 100
    created = createorg("--name", "Funded", "--credits-cents", "5000")
    organization = Organization.objects.get(pk=created["organization_id"])
    assert credits_summary(organization=organization).balance == 5100
    reasons = set(LedgerEntry.objects.filter(organization=organization)
                  .values_list("reason", flat=True))
    assert reasons == {"free grant for a new organization", "createorg --credits-cents"}


def test_negative_credits_are_refused() -> None:
    with pytest.raises(CommandError, match="must not be negative"):
        createorg("--name", "Broke", "--credits-cents", "-1")


def test_a_blank_name_is_refused() -> None:
    with pytest.raises(CommandError, match="must not be empty"):
        createorg("--name", "  ")


def test_demoorg_creates_once_and_reprints_the_same_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "demo.json"

    def demoorg() -> dict[str, str]:
        out = io.StringIO()
        call_command("demoorg", "--state", str(state), stdout=out)
        return json.loads(out.getvalue())

    first = demoorg()
    assert demoorg() == first
    assert Organization.objects.filter(name="demo").count() == 1
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    state.write_text(json.dumps({"organization_id": first["organization_id"],
                                 "api_key": "sk-stale"}))
    assert demoorg()["api_key"] != "sk-stale"


def test_webhook_url_sets_the_endpoint_and_prints_its_secret(loopback: None) -> None:
    created = createorg("--name", "Hooked", "--webhook-url", "https://127.0.0.1:8443/hooks")
    assert set(created) == {"organization_id", "api_key", "webhook_secret"}
    organization = Organization.objects.get(pk=created["organization_id"])
    assert organization.webhook_url == "https://127.0.0.1:8443/hooks"
    assert created["webhook_secret"].startswith("whsec_")
    assert organization_webhook_secret(organization=organization) == created["webhook_secret"]
    assert created["webhook_secret"] not in organization.webhook_secret_encrypted
    assert AuditEvent.objects.for_org(organization).get(
        action="webhook.endpoint_set").actor_label == "system: createorg"


@pytest.mark.parametrize("url", ["http://example.com/hooks", "https://10.1.2.3/hooks"])
def test_a_webhook_url_that_is_not_https_and_public_creates_nothing(url: str) -> None:
    with pytest.raises(CommandError, match="--webhook-url: The webhook endpoint cannot be used"):
        createorg("--name", "Refused", "--webhook-url", url)
    assert not Organization.objects.filter(name="Refused").exists()
