"""Every write and every realtime request's path (STYLE.md rule 1): the operator's switch,
the two requests, the meter that records each answered one, and the settlement that
charges metered usage to the ledger.

A request is judged, then admitted, then forwarded, then billed, in that order
(docs/realtime.md, "Errors"): the switch (503), the model and the endpoint (422, 400,
501), the region (403, 421), the body and its limits by the model's task kind (422, 400),
the credits and the key's budget (402, or 503 when they cannot be read), the key's rate
and the organization's concurrency (429, one Redis call); then the engine (502 when it
fails to answer, 400 or 422 when the model refuses), and only an answered request is
billed.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import DatabaseError, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from anex.errors import EngineFailed, Invalid, Malformed, PaymentRequired, Unavailable
from anex.regions import Region, eu_routing_require, organization_region, region_check
from anex.requestid import current_request_id
from billing.services import (
    credits_summary,
    key_budget,
    organization_lock,
    realtime_charge_write,
)
from console.models import ApiKey
from inference.catalog import CatalogModel
from inference.engines import DecisionOutcome
from inference.kinds.decide import DecideKind, answer_body
from inference.kinds.embed import EmbedKind, embeddings_body
from inference.pricing import CENTS_PER_USD, Usage, usage_cost_usd
from realtime.checks import encoding_format_check, realtime_model_require
from realtime.concurrency import concurrency_slot
from realtime.constants import SWITCH_ID, Endpoint
from realtime.engine_client import EngineRefused, EngineUnavailable, engine_call
from realtime.models import RealtimeSettlement, RealtimeSwitch, RealtimeUsage
from realtime.selectors import realtime_frozen, realtime_frozen_forget

logger = logging.getLogger(__name__)

FROZEN_DETAIL = ("The realtime API is paused for maintenance, so nothing was done. Retry "
                 "after the seconds in the Retry-After header.")
BILLING_UNAVAILABLE_DETAIL = ("The credit balance could not be read, so nothing was done "
                              "and nothing was billed. Retry.")
NO_CREDITS_DETAIL = ("The organization has no credits left: add credits (a top-up on the "
                     "console's Billing page) before sending realtime requests.")
UNBILLED_DETAIL = ("The answer could not be billed, so it is withheld and nothing was "
                   "charged. Retry.")
ENGINE_FAILED_DETAIL = ("The {what} service failed to answer, so nothing was billed. Retry; "
                        "if it persists, contact support with the X-Anex-Request-ID header "
                        "of this response.")
# A request spends a fraction of a credit and the ledger charges whole ones, so the credits
# and the key's budget must cover the next whole credit (billing.services Credits.covers,
# KeyBudget.covers: approval's rules, asked of the smallest spend).
NEXT_CREDIT = 1
# The credit check's answer for a key is kept this long per process (_credits_require).
CREDITS_READ_EVERY_SECONDS = 1.0
CREDITS_READ_KEYS = 10_000
_credits_read: dict[uuid.UUID, tuple[float, str | None]] = {}
# A usage row is settled once it is this old: by then its INSERT has committed even if it
# waited on a lock (its id is drawn when it runs, and a settlement moves past every id it
# sums). The sweep looks this far back for keys with usage to settle.
SETTLE_MARGIN = timedelta(seconds=30)
SETTLE_LOOKBACK = timedelta(days=2)


# -- the switch ----------------------------------------------------------------------------

def realtime_switch_set(*, frozen: bool, reason: str = "", user: User | None) -> RealtimeSwitch:
    """Freeze or reopen the realtime API (the admin's switch)."""
    switch, _ = RealtimeSwitch.objects.update_or_create(
        pk=SWITCH_ID, defaults={"frozen": frozen, "reason": reason[:500],
                                "changed_at": timezone.now(), "changed_by": user})
    realtime_frozen_forget()  # this process at once; the others within a second
    logger.warning("realtime API %s by %s", "frozen" if frozen else "reopened",
                   user.get_username() if user else "the system")
    return switch


def realtime_open_require() -> None:
    if realtime_frozen():
        raise Unavailable(FROZEN_DETAIL)


# -- admission -----------------------------------------------------------------------------

def _region_require(*, key: ApiKey, host_region: Region) -> None:
    """The batch API's residency rules for a request that stores nothing: the EU host only
    for an organization with EU data routing (403), and such an organization's texts only on
    the EU host (421, naming it), so they are processed in the region its data lives in."""
    organization = key.organization
    if host_region == Region.EU:
        eu_routing_require(organization)
    region_check(host_region=host_region, residency=organization_region(organization),
                 noun="organization's data")


def _credits_refusal(*, key: ApiKey) -> str | None:
    """Why the organization or the key may not spend (402), or None; 503 when the ledger
    cannot be read."""
    try:
        credits = credits_summary(organization=key.organization)
        budget = key_budget(api_key=key)
    except DatabaseError as exc:
        logger.warning("realtime: the balance could not be read: %s", exc.__class__.__name__)
        raise Unavailable(BILLING_UNAVAILABLE_DETAIL) from None
    if not credits.covers(NEXT_CREDIT):
        return NO_CREDITS_DETAIL
    if budget is not None and not budget.covers(NEXT_CREDIT):
        return (f"This API key's spend budget is used up: it has spent {budget.spent} of its "
                f"{budget.budget}-credit budget. Raise the budget on the console's Keys page, "
                "or use another key.")
    return None


def _credits_require(*, key: ApiKey) -> None:
    """402 when the organization has nothing left to spend (its balance less what approved
    jobs hold) or the key's spend budget is used up. Each process keeps the answer for a
    key CREDITS_READ_EVERY_SECONDS: realtime usage reaches the ledger about a minute after
    it happens anyway (realtime_charges_settle), so a second more changes nothing, and
    most requests skip the ledger's sums (a query, and a fifth of a request's CPU)."""
    now = time.monotonic()
    read = _credits_read.get(key.pk)
    if read is None or now - read[0] >= CREDITS_READ_EVERY_SECONDS:
        if len(_credits_read) > CREDITS_READ_KEYS:
            _credits_read.clear()
        read = _credits_read[key.pk] = (now, _credits_refusal(key=key))
    if read[1] is not None:
        raise PaymentRequired(read[1])


@contextmanager
def _admitted(*, key: ApiKey) -> Iterator[None]:
    _credits_require(key=key)
    with concurrency_slot(key=key):
        yield


def _forward(*, url: str, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        return engine_call(url=url, path=path, body=body)
    except (EngineUnavailable, EngineRefused) as exc:
        logger.error("realtime %s engine failed: %s", what, exc)
        raise EngineFailed(ENGINE_FAILED_DETAIL.format(what=what)) from None


# -- billing -------------------------------------------------------------------------------

def realtime_usage_record(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel,
                          input_tokens: int) -> RealtimeUsage:
    """Meter one answered request at the model's realtime rate: one INSERT, nothing read or
    locked, so concurrent requests of one key never wait on each other. The ledger is
    charged from these rows by realtime_charges_settle."""
    request_id = current_request_id.get()
    return RealtimeUsage.objects.create(
        organization_id=key.organization_id, api_key=key, endpoint=endpoint, model=model.id,
        input_tokens=input_tokens,
        cost_usd=usage_cost_usd(model, Usage(input_tokens=input_tokens), realtime=True),
        request_id="" if request_id == "-" else request_id)


@transaction.atomic
def realtime_charges_settle(*, key: ApiKey, settled_before: datetime | None = None) -> int:
    """Charge the ledger for the key's realtime usage since its last settlement, in whole
    credits; the credits charged now.

    The key's exact running total is carried from settlement to settlement and floored, so
    the ledger never charges ahead of use and the fractions are never lost. Only usage
    recorded before `settled_before` (default: SETTLE_MARGIN ago) is taken: a usage row is
    visible once its INSERT commits, milliseconds after its id is drawn, so a stretch of
    ids is settled only once every row in it has surely landed. Safe to run twice or at
    once: the organization lock orders settlements, and the unique (key, through) pair
    and the charge's idempotency key make a repeat write nothing."""
    organization = organization_lock(key.organization_id)
    last = RealtimeSettlement.objects.filter(api_key=key).order_by("-through_usage_id").first()
    since = last.through_usage_id if last is not None else 0
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    new = RealtimeUsage.objects.filter(api_key=key, id__gt=since, created_at__lt=cutoff
                                       ).aggregate(cost=Sum("cost_usd"), through=Max("id"))
    if new["through"] is None:
        return 0
    metered = (last.metered_usd if last is not None else Decimal(0)) + new["cost"]
    charged = last.charged_cents if last is not None else 0
    due = math.floor(metered * CENTS_PER_USD)
    RealtimeSettlement.objects.create(organization=organization, api_key=key,
                                      through_usage_id=new["through"], metered_usd=metered,
                                      charged_cents=due)
    if due <= charged:
        return 0
    realtime_charge_write(organization=organization, api_key=key, cents=due - charged,
                          through_cents=due,
                          reason=f"realtime usage of key {key.display} through request "
                                 f"{new['through']}: {due} credits in all")
    return due - charged


def realtime_charges_settle_all(*, settled_before: datetime | None = None) -> int:
    """Settle every key with realtime usage in the last SETTLE_LOOKBACK (the periodic
    sweep); the credits charged. A key idle for longer than that is settled with its next
    sweep after it is used again, from its last settlement, so nothing is ever skipped."""
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    keys = (RealtimeUsage.objects.filter(created_at__gte=cutoff - SETTLE_LOOKBACK,
                                         created_at__lt=cutoff)
            .values_list("api_key_id", flat=True).distinct())
    charged = 0
    for key in ApiKey.objects.filter(pk__in=list(keys)).select_related("organization"):
        charged += realtime_charges_settle(key=key, settled_before=cutoff)
    return charged


def _bill(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel, input_tokens: int) -> None:
    try:
        realtime_usage_record(key=key, endpoint=endpoint, model=model,
                              input_tokens=input_tokens)
    except DatabaseError as exc:
        logger.error("realtime: an answered request could not be metered: %s",
                     exc.__class__.__name__)
        raise Unavailable(UNBILLED_DETAIL) from None


# -- the requests --------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    input: Any
    dimensions: int | None = None
    encoding_format: str | None = None


def realtime_embeddings_create(*, key: ApiKey, host_region: Region,
                               request: EmbeddingsRequest) -> dict[str, Any]:
    """POST /realtime/v1/embeddings: OpenAI's response shape, unit-length vectors."""
    realtime_open_require()
    model, kind, url = realtime_model_require(model_id=request.model, key=key, kind=EmbedKind)
    _region_require(key=key, host_region=host_region)
    encoding_format_check(request.encoding_format)
    # Not counted here: what is billed is the engine's own count of what it read. A body
    # its kind refuses is answered with the kind's refusal (inference.kinds RequestRefused).
    checked = kind.realtime_request(model, request.input, dimensions=request.dimensions,
                                    counted=False)
    with _admitted(key=key):
        answer = _forward(url=url, path=kind.endpoint, what="embedding",
                          body=checked.forward(model.id))
        items = answer.get("data")
        if not isinstance(items, list) or len(items) != len(checked.rows):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="embedding"))
        for index, item in enumerate(items):
            if "error" in item:
                # The model's own refusal of one input (longer than its context): nothing
                # is billed, the request is refused naming the input.
                raise Invalid(f"input[{index}]: {item['error'].get('message')}")
        tokens = sum(int(item["prompt_tokens"]) for item in items)
        _bill(key=key, endpoint=Endpoint.EMBEDDINGS, model=model, input_tokens=tokens)
    return embeddings_body(model.id, [item["embedding"] for item in items], tokens)


def realtime_decision_create(*, key: ApiKey, host_region: Region,
                             body: dict[str, Any]) -> dict[str, Any]:
    """POST /realtime/v1/systemone: the reference's answers, usage and routing."""
    realtime_open_require()
    model_id = body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise Malformed("model: This field is required: the decision model's id (laya).")
    model, kind, url = realtime_model_require(model_id=model_id, key=key, kind=DecideKind)
    _region_require(key=key, host_region=host_region)
    checked = kind.realtime_request(model, body, counted=False)
    with _admitted(key=key):
        answer = _forward(url=url, path=kind.endpoint, what="decision",
                          body=checked.forward(model.id))
        error = answer.get("error")
        if isinstance(error, dict):
            # A question the model refuses: 422 with the model's own message, naming it.
            raise Malformed(str(error.get("message")))
        if not isinstance(answer.get("answers"), dict):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="decision"))
        outcome = DecisionOutcome(answers=answer["answers"],
                                  input_tokens=int(answer["input_tokens"]),
                                  routing=answer["routing"])
        _bill(key=key, endpoint=Endpoint.SYSTEMONE, model=model,
              input_tokens=outcome.input_tokens)
    return answer_body(model.id, outcome)
