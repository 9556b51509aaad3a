"""Stripe top-ups: Checkout Sessions, the verified webhook, and the console's Billing page."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_summary
from console.constants import Role
from console.models import AuditEvent, Organization
from tests.db.test_console import form
from tests.factories import api_key_make, user_make
from tests.stripe_helpers import WEBHOOK_SECRET, checkout_completed_event, signed_headers

pytestmark = pytest.mark.django_db
WEBHOOK = "/billing/stripe/webhook"


@pytest.fixture(autouse=True)
def stripe_settings(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET


def deliver(event: dict[str, Any], *, timestamp: int | None = None,
            secret: str = WEBHOOK_SECRET) -> Any:
    payload = json.dumps(event).encode()
    headers = signed_headers(payload, timestamp=timestamp or int(time.time()), secret=secret)
    return Client().post(WEBHOOK, payload, content_type="application/json", headers=headers)


def topups(organization: Organization) -> int:
    return LedgerEntry.objects.filter(organization=organization, kind=EntryKind.TOPUP).count()


def test_a_paid_checkout_credits_the_ledger_once_per_session(organization: Organization) -> None:
    event = checkout_completed_event(organization, cents=2000)
    first = deliver(event)
    assert first.status_code == 200 and first.json() == {"received": True, "credited": True}
    assert deliver(event).json() == {"received": True, "credited": False}
    # The same session's later async_payment_succeeded event is the same money.
    later = checkout_completed_event(organization, cents=2000,
                                     event_type="checkout.session.async_payment_succeeded")
    assert deliver(later).json()["credited"] is False
    assert credits_summary(organization=organization).balance == 2000
    entry = LedgerEntry.objects.get(organization=organization, kind=EntryKind.TOPUP)
    assert entry.stripe_event_id == event["id"]
    assert AuditEvent.objects.get(organization=organization,
                                  action="credits.topped_up").actor_label == "system: stripe"


def test_a_delayed_payment_credits_when_it_succeeds(organization: Organization) -> None:
    unpaid = checkout_completed_event(organization, cents=900, payment_status="unpaid")
    assert deliver(unpaid).json()["credited"] is False
    paid = checkout_completed_event(organization, cents=900,
                                    event_type="checkout.session.async_payment_succeeded")
    assert deliver(paid).json()["credited"] is True
    assert credits_summary(organization=organization).balance == 900


@pytest.mark.parametrize("headers", [
    {},
    {"Stripe-Signature": "garbage"},
    {"Stripe-Signature": "t=1,v1=00"},
])
def test_unsigned_or_badly_signed_deliveries_are_400(organization: Organization,
                                                     headers: dict[str, str]) -> None:
    payload = json.dumps(checkout_completed_event(organization, cents=500)).encode()
    response = Client().post(WEBHOOK, payload, content_type="application/json", headers=headers)
    assert response.status_code == 400
    assert topups(organization) == 0


def test_a_delivery_signed_with_another_secret_is_400(organization: Organization) -> None:
    event = checkout_completed_event(organization, cents=500)
    assert deliver(event, secret="whsec_someone_else").status_code == 400
    assert topups(organization) == 0


def test_an_old_signature_is_refused_as_a_replay(organization: Organization) -> None:
    event = checkout_completed_event(organization, cents=500)
    assert deliver(event, timestamp=int(time.time()) - 3600).status_code == 400
    assert topups(organization) == 0


def test_other_events_and_currencies_credit_nothing(organization: Organization) -> None:
    assert deliver(checkout_completed_event(organization, cents=500,
                                            event_type="checkout.session.expired")
                   ).json()["credited"] is False
    assert deliver(checkout_completed_event(organization, cents=500, currency="eur",
                                            session_id="cs_eur")).json()["credited"] is False
    assert topups(organization) == 0


def test_without_a_webhook_secret_the_endpoint_is_off(organization: Organization,
                                                      settings: SettingsWrapper) -> None:
    settings.STRIPE_WEBHOOK_SECRET = None
    assert deliver(checkout_completed_event(organization, cents=500)).status_code == 404


class FakeStripe(BaseHTTPRequestHandler):
    """Stripe's API on loopback: records the Checkout Session request, answers like Stripe."""

    requests: list[dict[str, str]] = []
    fail = False

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        FakeStripe.requests.append({"path": self.path, "auth": self.headers["Authorization"],
                                    **dict(parse_qsl(body))})
        if FakeStripe.fail:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "boom", "type": "api_error"}}')
            return
        answer = {"id": "cs_test_fake", "object": "checkout.session",
                  "url": "https://checkout.stripe.com/c/pay/cs_test_fake"}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_stripe(settings: SettingsWrapper) -> Iterator[type[FakeStripe]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStripe)
    # (its shutdown waits for the next poll: every half a second by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    FakeStripe.requests = []
    FakeStripe.fail = False
    settings.STRIPE_SECRET_KEY = "sk_test_fake"
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{server.server_address[1]}"
    yield FakeStripe
    server.shutdown()


@pytest.fixture
def owner_client(organization: Organization) -> Client:
    client = Client()
    client.force_login(user_make(organization, role=Role.OWNER))
    return client


def test_an_owner_tops_up_through_stripe_checkout(fake_stripe: type[FakeStripe],
                                                  owner_client: Client,
                                                  organization: Organization) -> None:
    response = owner_client.post("/console/billing", form(organization, {"amount": "25.00"}))
    assert response.status_code == 303
    assert response["Location"] == "https://checkout.stripe.com/c/pay/cs_test_fake"
    (sent,) = fake_stripe.requests
    assert sent["path"] == "/v1/checkout/sessions"
    assert sent["auth"] == "Bearer sk_test_fake"
    assert sent["mode"] == "payment"
    assert sent["line_items[0][price_data][unit_amount]"] == "2500"
    assert sent["line_items[0][price_data][currency]"] == "usd"
    assert sent["metadata[organization_id]"] == str(organization.pk)
    assert sent["success_url"].endswith("/console/billing?topup=success")


def test_an_amount_out_of_range_goes_nowhere(fake_stripe: type[FakeStripe],
                                             owner_client: Client,
                                             organization: Organization) -> None:
    response = owner_client.post("/console/billing", form(organization, {"amount": "1.00"}))
    assert response.status_code == 200
    assert "greater than or equal to 5" in response.content.decode()
    assert fake_stripe.requests == []


def test_stripe_failing_is_a_message_not_a_500(fake_stripe: type[FakeStripe],
                                               owner_client: Client,
                                               organization: Organization,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The client's two retries, without its half a second (and more) before each.
    monkeypatch.setattr("stripe._http_client.HTTPClient.INITIAL_DELAY", 0.01)
    fake_stripe.fail = True
    response = owner_client.post("/console/billing", form(organization, {"amount": "25.00"}),
                                 follow=True)
    assert response.status_code == 200
    assert "Stripe could not be reached" in response.content.decode()


def test_members_who_are_not_owners_cannot_top_up(fake_stripe: type[FakeStripe],
                                                  organization: Organization) -> None:
    client = Client()
    client.force_login(user_make(organization, role=Role.MEMBER))
    assert client.post("/console/billing", form(organization, {"amount": "25.00"})
                       ).status_code == 403
    assert "Only an owner" in client.get("/console/billing").content.decode()
    assert fake_stripe.requests == []


def test_without_stripe_keys_top_up_says_it_is_unavailable(owner_client: Client,
                                                           settings: SettingsWrapper,
                                                           organization: Organization) -> None:
    settings.STRIPE_SECRET_KEY = None
    page = owner_client.get("/console/billing")
    assert page.status_code == 200
    assert "Top-up is unavailable" in page.content.decode()
    response = owner_client.post("/console/billing", form(organization, {"amount": "25.00"}),
                                 follow=True)
    assert response.status_code == 200
    assert "Top-up is unavailable" in response.content.decode()


def test_the_billing_page_shows_balance_held_and_available(owner_client: Client,
                                                           organization: Organization) -> None:
    deliver(checkout_completed_event(organization, cents=1234))
    html = owner_client.get("/console/billing").content.decode()
    assert "1234" in html and "Top-up" in html


def test_the_billing_page_needs_a_login() -> None:
    response = Client().get("/console/billing")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_a_user_without_an_organization_is_told_so() -> None:
    client = Client()
    client.force_login(user_make())
    assert "No organization yet" in client.get("/console/billing").content.decode()


# Refunds and disputes (issue 11, item 11): what Stripe takes back is debited once.

def ledger_balance(organization: Organization) -> int:
    """The ledger sum, computed here from the entries, checked against the service's."""
    total = sum(LedgerEntry.objects.filter(organization=organization)
                .values_list("balance_delta", flat=True))
    assert credits_summary(organization=organization).balance == total
    return total


def paid_topup(organization: Organization, *, cents: int, payment_intent: str = "pi_1",
               session_id: str = "cs_test_1") -> None:
    event = checkout_completed_event(organization, cents=cents, session_id=session_id)
    event["data"]["object"]["payment_intent"] = payment_intent
    assert deliver(event).json()["credited"] is True


def charge_event(event_type: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"evt_{uuid.uuid4().hex}", "object": "event", "type": event_type,
            "api_version": "2025-01-01", "created": 1_700_000_000, "livemode": False,
            "data": {"object": {"currency": "usd", **obj}}}


def refunded(amount_refunded: int, *, payment_intent: str = "pi_1",
             charge: str = "ch_1") -> dict[str, Any]:
    return charge_event("charge.refunded", {
        "id": charge, "object": "charge", "amount": 2000, "amount_refunded": amount_refunded,
        "payment_intent": payment_intent, "refunded": amount_refunded == 2000})


def dispute(event_type: str, amount: int, *, status: str = "needs_response",
            payment_intent: str = "pi_1") -> dict[str, Any]:
    return charge_event(event_type, {
        "id": "dp_1", "object": "dispute", "amount": amount, "charge": "ch_1",
        "payment_intent": payment_intent, "status": status})


def test_a_refund_debits_the_top_up_once_however_often_stripe_redelivers(
        organization: Organization) -> None:
    # given a paid top-up
    paid_topup(organization, cents=2000)
    # when Stripe refunds it and delivers the event three times
    event = refunded(2000)
    answers = [deliver(event) for _ in range(3)]
    # then one negative adjustment, the balance back to zero
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["debited"] for a in answers] == [True, False, False]
    (entry,) = LedgerEntry.objects.filter(organization=organization,
                                          kind=EntryKind.ADJUSTMENT)
    assert entry.balance_delta == -2000 and entry.held_delta == 0
    assert entry.stripe_event_id == event["id"]
    assert ledger_balance(organization) == 0
    assert AuditEvent.objects.get(organization=organization,
                                  action="credits.reversed").actor_label == "system: stripe"


def test_partial_refunds_debit_the_running_total_even_out_of_order(
        organization: Organization) -> None:
    paid_topup(organization, cents=2000)
    first, second = refunded(500), refunded(1200)
    assert deliver(second).json()["debited"] is True  # the later total arrives first
    assert deliver(first).json()["debited"] is False  # an older total adds nothing
    assert deliver(second).json()["debited"] is False
    assert ledger_balance(organization) == 800
    assert deliver(refunded(2000)).json()["debited"] is True
    assert ledger_balance(organization) == 0


def test_a_dispute_debits_once_and_a_won_dispute_gives_it_back_once(
        organization: Organization) -> None:
    paid_topup(organization, cents=2000)
    opened = dispute("charge.dispute.created", 2000)
    assert [deliver(opened).json()["debited"] for _ in range(2)] == [True, False]
    assert ledger_balance(organization) == 0
    lost = dispute("charge.dispute.closed", 2000, status="lost")
    assert deliver(lost).json()["credited"] is False
    won = dispute("charge.dispute.closed", 2000, status="won")
    assert [deliver(won).json()["credited"] for _ in range(2)] == [True, False]
    assert ledger_balance(organization) == 2000
    assert AuditEvent.objects.filter(organization=organization,
                                     action="credits.reinstated").count() == 1


def test_a_refund_and_a_dispute_never_take_back_more_than_the_top_up(
        organization: Organization) -> None:
    paid_topup(organization, cents=2000)
    assert deliver(refunded(1500)).json()["debited"] is True
    # Stripe disputes the whole charge: only the 500 not yet refunded is left to take.
    assert deliver(dispute("charge.dispute.created", 2000)).json()["debited"] is True
    assert ledger_balance(organization) == 0
    assert sum(LedgerEntry.objects.filter(kind=EntryKind.ADJUSTMENT)
               .values_list("balance_delta", flat=True)) == -2000


def test_a_reversal_of_spent_credits_goes_below_zero_and_then_402_holds_everything(
        organization: Organization, client_for: Any) -> None:
    # given a top-up of which 1500 was already spent
    paid_topup(organization, cents=2000)
    LedgerEntry.objects.create(organization=organization, kind=EntryKind.CHARGE,
                               balance_delta=-1500, idempotency_key="test:spent")
    # when the whole payment is refunded
    assert deliver(refunded(2000)).json()["debited"] is True
    # then the balance is negative and uploads, ingests and submits answer 402
    assert ledger_balance(organization) == -1500
    _key, plaintext = api_key_make(organization)
    api = client_for(plaintext)
    for body in ({"format": "jsonl"}, {"source_url": "https://example.invalid/x.jsonl"}):
        response = api.post("/batch/v1/inputs", body, format="json")
        assert response.status_code == 402
        assert "balance is zero or below" in response.json()["detail"]


def test_a_charge_that_paid_no_top_up_of_ours_debits_nothing(
        organization: Organization) -> None:
    paid_topup(organization, cents=2000)
    for event in (refunded(2000, payment_intent="pi_someone_else"),
                  dispute("charge.dispute.created", 2000, payment_intent="pi_other"),
                  charge_event("charge.refunded", {"id": "ch_2", "amount_refunded": 2000})):
        response = deliver(event)
        assert response.status_code == 200 and response.json()["debited"] is False
    assert ledger_balance(organization) == 2000


@pytest.mark.parametrize("amount_total", [0, None])
def test_a_session_paying_nothing_is_acknowledged_and_credits_nothing(
        organization: Organization, amount_total: int | None) -> None:
    event = checkout_completed_event(organization, cents=0)
    event["data"]["object"]["amount_total"] = amount_total
    response = deliver(event)
    assert response.status_code == 200
    assert response.json() == {"received": True, "credited": False}
    assert topups(organization) == 0
    assert ledger_balance(organization) == 0
