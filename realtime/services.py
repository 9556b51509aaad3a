"""Every write and every realtime request's path (docs/dev/style.md rule 1): the operator's switch,
the two requests, the meter that records each answered one, and the settlement that
charges metered usage to the ledger.

A request is judged, then counted, then admitted, then forwarded, then billed, in that
order (docs/realtime.md, "Errors"): the key's rate (429, the API's throttle, before the body
is parsed), the switch (503), the model and the endpoint (422, 400, 501), the region (403,
421), the body and its limits by the model's task kind, its inputs counted with the model's
tokenizer (422, 400, an input over the context among them), the credits and the key's
budget (402, or 503 when they cannot be read), this process's realtime places (503), the
reservation of its cost and the organization's concurrency (402, 503, 429: one Redis
call); then the engine (503 when it is at capacity, 502 when it fails to answer, 400 or
422 when the model refuses). An answered request is billed what it read; one the engine
took and did not answer in time is billed its counted tokens (the engine did the work).
"""

from __future__ import annotations

import base64
import logging
import math
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Min
from django.utils import timezone
from redis import RedisError

from anex.db import PreparedInsert
from anex.errors import EngineFailed, Invalid, Malformed, PaymentRequired, Unavailable
from anex.regions import Region, eu_routing_require, organization_region, region_check
from anex.requestid import current_request_id
from billing.services import (
    credits_summary,
    key_budget,
    organization_lock,
    realtime_charge_write,
)
from billing.unsettled import CREDITS_READ_EVERY_SECONDS, NANO_PER_CREDIT
from console.models import ApiKey
from inference.catalog import CatalogModel
from inference.engines import DecisionOutcome
from inference.kinds.decide import DecideKind, answer_body
from inference.kinds.embed import EmbedKind, EmbedRequest, embeddings_body
from inference.pricing import CENTS_PER_USD, Usage, usage_cost_usd
from inference.rows.decisions import question_text, state_text
from realtime.checks import encoding_format_check, realtime_model_require
from realtime.concurrency import (
    LIMITER_UNAVAILABLE_DETAIL,
    Admission,
    Room,
    admitted,
    nano,
    realtime_settled_add,
    settled_read,
)
from realtime.constants import SWITCH_ID, Endpoint
from realtime.engine_client import (
    EngineBusy,
    EngineRefused,
    EngineTimedOut,
    EngineUnavailable,
    engine_call,
)
from realtime.models import (
    RealtimeSettlement,
    RealtimeSwitch,
    RealtimeUsage,
    RealtimeUsageDaily,
)
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
ENGINE_BUSY_DETAIL = ("The {what} service is at capacity and did not take this request, so "
                      "nothing was done and nothing was billed. Retry after the seconds in "
                      "the Retry-After header.")
ENGINE_BUSY_RETRY_AFTER_SECONDS = 1
ENGINE_TIMED_OUT_DETAIL = ("The {what} service took this request but did not answer within "
                           "{seconds} seconds. Its work is billed ({tokens} input tokens); "
                           "retry, and if it persists, contact support with the "
                           "X-Anex-Request-ID header of this response.")
PROCESS_FULL_DETAIL = ("This server is answering as many realtime requests as it may at once, "
                       "so nothing was done and nothing was billed. Retry after the seconds "
                       "in the Retry-After header.")
# Nano-dollars: the unit realtime money is reserved and metered in (realtime.concurrency).
NANO_PER_USD = NANO_PER_CREDIT * CENTS_PER_USD
# The markers a tokenizer may add around a text (MiniLM's [CLS] and [SEP]) and an
# end-of-text token: added to a byte count to bound a text's tokens from above.
MARKER_TOKENS = 3
PURGE_BATCH = 10_000
_in_process = 0  # this process's realtime requests in flight (realtime_place_take)
_in_process_lock = threading.Lock()
# A request spends a fraction of a credit and the ledger charges whole ones, so the credits
# and the key's budget must cover the next whole credit (billing.services Credits.covers,
# KeyBudget.covers: approval's rules, asked of the smallest spend).
NEXT_CREDIT = 1
# The credit check's answer for a key is kept CREDITS_READ_EVERY_SECONDS per process
# (_credits_require; an approval's mark is counted that long after its hold commits).
CREDITS_READ_KEYS = 10_000
_credits_read: dict[uuid.UUID, tuple[float, str | None, Room]] = {}
# A usage row is settled once it is this old (and marked settled as it is summed, so one
# that commits later than a younger row is simply the next settlement's).
SETTLE_MARGIN = timedelta(seconds=30)


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


def _credits_refusal(*, key: ApiKey) -> tuple[str | None, Room]:
    """Why the organization or the key may not spend (402), or None, and what they may
    spend; 503 when the ledger (or the settled totals beside it) cannot be read."""
    try:
        # The settled totals first: a settlement landing between the two reads is then
        # counted twice (one refusal too many), never not at all (realtime.concurrency).
        org_settled, key_settled = settled_read(key=key)
    except RedisError as exc:
        logger.warning("realtime: the settled totals could not be read: %s", exc)
        raise Unavailable(LIMITER_UNAVAILABLE_DETAIL) from None
    try:
        credits = credits_summary(organization=key.organization)
        budget = key_budget(api_key=key)
    except DatabaseError as exc:
        logger.warning("realtime: the balance could not be read: %s", exc.__class__.__name__)
        raise Unavailable(BILLING_UNAVAILABLE_DETAIL) from None
    room = Room(organization=nano(credits.available),
                key=None if budget is None else nano(budget.budget - budget.spent),
                organization_settled=org_settled, key_settled=key_settled)
    if not credits.covers(NEXT_CREDIT):
        return NO_CREDITS_DETAIL, room
    if budget is not None and not budget.covers(NEXT_CREDIT):
        return (f"This API key's spend budget is used up: it has spent {budget.spent} of its "
                f"{budget.budget}-credit budget. Raise the budget on the console's Keys page, "
                "or use another key."), room
    return None, room


def _credits_require(*, key: ApiKey) -> Room:
    """402 when the organization has nothing left to spend (its balance less what approved
    jobs hold) or the key's spend budget is used up; else what they may spend, which the
    request's reservation is checked against (realtime.concurrency). Each process keeps
    the answer for a key CREDITS_READ_EVERY_SECONDS, so most requests skip the ledger's sums
    (a query, and a fifth of a request's CPU): what realtime spends meanwhile is counted in
    Redis, beside it, until the settlement charges it."""
    now = time.monotonic()
    read = _credits_read.get(key.pk)
    if read is None or now - read[0] >= CREDITS_READ_EVERY_SECONDS:
        if len(_credits_read) > CREDITS_READ_KEYS:
            _credits_read.clear()
        read = _credits_read[key.pk] = (now, *_credits_refusal(key=key))
    if read[1] is not None:
        raise PaymentRequired(read[1])
    return read[2]


def realtime_credits_forget() -> None:
    """Read every key's balance afresh on its next request (tests; a process's own top-up)."""
    _credits_read.clear()


def realtime_place_take() -> None:
    """Take one of this web process's realtime places, or 503: past
    ANEX_REALTIME_PROCESS_CONCURRENCY requests in flight (fewer than its threads), so
    requests on a slow engine never hold every thread and the batch API, the console and
    /healthz keep being answered. Taken by the view before anything else is read (the key,
    the rate, the body, the tokens), so a refusal costs next to nothing; given back by
    realtime_place_give, whatever the answer."""
    global _in_process
    with _in_process_lock:
        if _in_process >= settings.ANEX_REALTIME_PROCESS_CONCURRENCY:
            raise Unavailable(PROCESS_FULL_DETAIL, retry_after=1)
        _in_process += 1


def realtime_place_give() -> None:
    global _in_process
    with _in_process_lock:
        _in_process -= 1


def _cost_nano(model: CatalogModel, input_tokens: int) -> int:
    """A request's cost in nano-dollars, rounded up (what is reserved and metered in
    Redis; the ledger is charged from the exact cost of its usage row)."""
    cost = usage_cost_usd(model, Usage(input_tokens=input_tokens), realtime=True)
    return math.ceil(cost * NANO_PER_USD)


@dataclass(frozen=True)
class Counted:
    """A request's input tokens, counted by the web tier before any engine reads it:
    `exact` with the model's own tokenizer (None where this process has none), `most`
    the most the engine can bill (what is reserved), `taken` what a request the engine
    took and did not answer in time is billed (the exact count, or without a tokenizer a
    byte count: an upper bound on any tokenizer's count of a text)."""

    exact: int | None
    most: int
    taken: int


@contextmanager
def _admitted(*, key: ApiKey, model: CatalogModel, counted: Counted) -> Iterator[Admission]:
    room = _credits_require(key=key)
    with admitted(key=key, cost=_cost_nano(model, counted.most), room=room) as admission:
        yield admission


def _forward(*, urls: tuple[str, ...], path: str, body: dict[str, Any], what: str,
             on_timeout: Callable[[], int]) -> dict[str, Any]:
    """The engine's answer. A request the engine took but did not answer in time did the
    work: `on_timeout` bills it (its tokens), and the answer is 502 saying so."""
    try:
        return engine_call(urls=urls, path=path, body=body)
    except EngineBusy as exc:
        logger.warning("realtime %s engine busy: %s", what, type(exc).__name__)
        raise Unavailable(ENGINE_BUSY_DETAIL.format(what=what),
                          retry_after=ENGINE_BUSY_RETRY_AFTER_SECONDS) from None
    except EngineTimedOut:
        tokens = on_timeout()
        raise EngineFailed(ENGINE_TIMED_OUT_DETAIL.format(
            what=what, seconds=settings.ANEX_REALTIME_TIMEOUT_SECONDS,
            tokens=f"{tokens:,}")) from None
    except (EngineUnavailable, EngineRefused) as exc:
        # The class only: an engine's refusal may quote the request (anex.logsafe).
        logger.error("realtime %s engine failed: %s", what, type(exc).__name__)
        raise EngineFailed(ENGINE_FAILED_DETAIL.format(what=what)) from None


# -- billing -------------------------------------------------------------------------------

def realtime_usage_record(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel,
                          input_tokens: int) -> RealtimeUsage:
    """Meter one answered request at the model's realtime rate: one INSERT, nothing read or
    locked, so concurrent requests of one key never wait on each other. The ledger is
    charged from these rows by realtime_charges_settle."""
    request_id = current_request_id.get()
    return _USAGE_INSERT.create(
        organization_id=key.organization_id, api_key=key, endpoint=endpoint, model=model.id,
        input_tokens=input_tokens,
        cost_usd=usage_cost_usd(model, Usage(input_tokens=input_tokens), realtime=True),
        request_id="" if request_id == "-" else request_id)


_USAGE_INSERT = PreparedInsert(RealtimeUsage)  # one per request: compiled once (anex.db)


# The settlement's one statement: the key's unsettled rows, marked settled as they are
# summed (so a row is charged once, whenever it commits), by day, endpoint and model for the
# roll-up; read through the partial index of unsettled rows (realtime_usage_unsettled).
_SETTLE_SQL = """
WITH settled AS (
    UPDATE realtime_realtimeusage SET settled = true
    WHERE api_key_id = %s AND NOT settled AND created_at < %s
    RETURNING id, endpoint, model, input_tokens, cost_usd, created_at
)
SELECT (created_at AT TIME ZONE 'UTC')::date, endpoint, model, count(*), sum(input_tokens),
       sum(cost_usd), sum(ceil(cost_usd * 1000000000)), max(id)
FROM settled GROUP BY 1, 2, 3
"""


def _carried_nano(metered_usd: Decimal, charged_cents: int) -> int:
    """What a key has metered and the ledger has not charged (the fraction carried)."""
    return math.ceil(metered_usd * NANO_PER_USD) - charged_cents * NANO_PER_CREDIT


@transaction.atomic
def realtime_charges_settle(*, key: ApiKey, settled_before: datetime | None = None) -> int:
    """Charge the ledger for the key's unsettled realtime usage, in whole credits; the
    credits charged now.

    The key's exact running total is carried from settlement to settlement and floored, so
    the ledger never charges ahead of use and the fractions are never lost. Only usage
    recorded before `settled_before` (default: SETTLE_MARGIN ago) is taken, and each row is
    marked settled in the statement that sums it, so a row that commits late is simply
    taken by the next settlement. Safe to run twice or at once: the organization lock
    orders settlements, a settled row is never summed again, and the charge's idempotency
    key makes a repeat write nothing. Once it commits, what it charged is added to the
    settled totals in Redis (realtime.concurrency), no longer held against new requests."""
    organization = organization_lock(key.organization_id)
    last = RealtimeSettlement.objects.filter(api_key=key).order_by("-id").first()
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE_SQL, [key.pk, cutoff])
        groups = cursor.fetchall()
    if not groups:
        return 0
    for day, endpoint, model, requests, tokens, cost, _nano, _through in groups:
        daily, _ = RealtimeUsageDaily.objects.get_or_create(
            api_key=key, day=day, endpoint=endpoint, model=model,
            defaults={"organization": organization})
        RealtimeUsageDaily.objects.filter(pk=daily.pk).update(
            requests=F("requests") + requests, input_tokens=F("input_tokens") + tokens,
            cost_usd=F("cost_usd") + cost)
    before = last.metered_usd if last is not None else Decimal(0)
    metered = before + sum((group[5] for group in groups), Decimal(0))
    charged = last.charged_cents if last is not None else 0
    through = max(group[7] for group in groups)
    due = math.floor(metered * CENTS_PER_USD)
    RealtimeSettlement.objects.create(organization=organization, api_key=key,
                                      through_usage_id=through, metered_usd=metered,
                                      charged_cents=due)
    # What Redis counted for these rows (each rounded up) and the carry that stays unsettled.
    released = (sum(int(group[6]) for group in groups) + _carried_nano(before, charged)
                - _carried_nano(metered, due))
    transaction.on_commit(lambda: _settled_add(key=key, amount=released))
    if due <= charged:
        return 0
    realtime_charge_write(organization=organization, api_key=key, cents=due - charged,
                          through_cents=due,
                          reason=f"realtime usage of key {key.display} through request "
                                 f"{through}: {due} credits in all")
    return due - charged


def _settled_add(*, key: ApiKey, amount: int) -> None:
    try:
        realtime_settled_add(organization_id=key.organization_id, key_id=key.pk,
                             amount=amount)
    except RedisError as exc:  # the usage stays counted as unsettled: refusals too early
        logger.error("realtime: a settlement could not be counted in Redis: %s", exc)


def realtime_charges_settle_all(*, settled_before: datetime | None = None) -> int:
    """Settle every key with unsettled realtime usage (the sweep, on its own queue); the
    credits charged. Reads the unsettled rows alone, through their partial index."""
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    keys = (RealtimeUsage.objects.filter(settled=False, created_at__lt=cutoff).order_by()
            .values_list("api_key_id", flat=True).distinct())
    charged = 0
    for key in ApiKey.objects.filter(pk__in=keys).select_related("organization"):
        charged += realtime_charges_settle(key=key, settled_before=cutoff)
    return charged


def realtime_usage_purge(*, before: datetime | None = None) -> int:
    """Delete settled usage rows older than ANEX_REALTIME_USAGE_RETENTION_DAYS (their sums
    live on in RealtimeUsageDaily), a batch at a time; the rows deleted. An unsettled row
    is never deleted."""
    cutoff = before or timezone.now() - timedelta(
        days=settings.ANEX_REALTIME_USAGE_RETENTION_DAYS)
    deleted = 0
    while True:
        batch = list(RealtimeUsage.objects.filter(settled=True, created_at__lt=cutoff)
                     .order_by().values_list("id", flat=True)[:PURGE_BATCH])
        if not batch:
            return deleted
        deleted += RealtimeUsage.objects.filter(pk__in=batch, settled=True).delete()[0]


def realtime_settlement_lag_seconds() -> float:
    """How long the oldest unsettled usage row has waited (0 with none): the settlement's
    lag, which stays under SETTLE_MARGIN plus the sweep's period while it keeps up."""
    oldest = (RealtimeUsage.objects.filter(settled=False).order_by()
              .aggregate(oldest=Min("created_at"))["oldest"])
    return 0.0 if oldest is None else max((timezone.now() - oldest).total_seconds(), 0.0)


def _bill(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel, input_tokens: int,
          admission: Admission) -> None:
    try:
        realtime_usage_record(key=key, endpoint=endpoint, model=model,
                              input_tokens=input_tokens)
    except DatabaseError as exc:
        logger.error("realtime: an answered request could not be metered: %s",
                     exc.__class__.__name__)
        raise Unavailable(UNBILLED_DETAIL) from None
    admission.spend(_cost_nano(model, input_tokens))


@contextmanager
def _answered(*, key: ApiKey, model: CatalogModel, counted: Counted, urls: tuple[str, ...],
              path: str, endpoint: Endpoint, body: dict[str, Any]
              ) -> Iterator[tuple[dict[str, Any], Admission]]:
    """Admit the request, forward it, and hold its admission while the block bills the
    answer; a request the engine took and did not answer in time bills its counted
    tokens (_forward)."""
    with _admitted(key=key, model=model, counted=counted) as admission:
        def bill_taken() -> int:
            _bill(key=key, endpoint=endpoint, model=model, input_tokens=counted.taken,
                  admission=admission)
            return counted.taken

        what = "embedding" if endpoint == Endpoint.EMBEDDINGS else "decision"
        yield (_forward(urls=urls, path=path, body=body, what=what, on_timeout=bill_taken),
               admission)


# -- the requests --------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    input: Any
    dimensions: int | None = None
    encoding_format: str | None = None


def _embeddings_counted(model: CatalogModel, checked: EmbedRequest) -> Counted:
    if checked.prompt_tokens is not None:
        exact = sum(checked.prompt_tokens)
        return Counted(exact=exact, most=exact, taken=exact)
    # No tokenizer here: the engine refuses an input past the context, so that is the most
    # any input can bill.
    context = model.context_tokens
    return Counted(exact=None, most=context * len(checked.rows),
                   taken=sum(min(context, len(row.text.encode()) + MARKER_TOKENS)
                             for row in checked.rows))


def realtime_embeddings_create(*, key: ApiKey, host_region: Region,
                               request: EmbeddingsRequest) -> dict[str, Any]:
    """POST /realtime/v1/embeddings: OpenAI's response shape, unit-length vectors (as
    floats, or base64 of little-endian float32 when asked for)."""
    realtime_open_require()
    model, kind, urls = realtime_model_require(model_id=request.model, key=key, kind=EmbedKind)
    _region_require(key=key, host_region=host_region)
    encoding_format_check(request.encoding_format)
    # Counted here with the model's tokenizer, an input past the context refused (400
    # naming it) before any engine reads the request.
    checked = kind.realtime_request(model, request.input, dimensions=request.dimensions)
    counted = _embeddings_counted(model, checked)
    with _answered(key=key, model=model, counted=counted, urls=urls, path=kind.endpoint,
                   endpoint=Endpoint.EMBEDDINGS, body=checked.forward(model.id)
                   ) as (answer, admission):
        items = answer.get("data")
        if not isinstance(items, list) or len(items) != len(checked.rows) \
                or not all(isinstance(item, dict) for item in items):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="embedding"))
        read = [min(int(item.get("prompt_tokens") or 0), model.context_tokens)
                for item in items]
        refused = next((index for index, item in enumerate(items) if "error" in item), None)
        if refused is not None:
            # The model's own refusal of one input (longer than its context), which only an
            # engine without a tokenizer here can make: the request is refused naming the
            # input, and what the engine read of the others is billed.
            _bill(key=key, endpoint=Endpoint.EMBEDDINGS, model=model,
                  input_tokens=sum(read), admission=admission)
            raise Invalid(f"input[{refused}]: {items[refused]['error'].get('message')}")
        # What the engine says it read, never less than what was counted here.
        tokens = max(sum(read), counted.exact or 0)
        _bill(key=key, endpoint=Endpoint.EMBEDDINGS, model=model, input_tokens=tokens,
              admission=admission)
    vectors = [item["embedding"] for item in items]
    if request.encoding_format == "base64":
        return embeddings_body(model.id, [base64_vector(v) for v in vectors], tokens)
    return embeddings_body(model.id, vectors, tokens)


def base64_vector(vector: list[float]) -> str:
    """A vector as OpenAI's base64 encoding spells it: little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _decision_most(body: dict[str, Any]) -> int:
    """The most a decision can bill without a tokenizer here: the batch row's rule (the
    text once per question, plus each question's words) with each piece's byte count, an
    upper bound on any tokenizer's count of it."""
    text = state_text(body.get("state")) or ""
    questions = body.get("questions")
    assert isinstance(questions, dict)  # the kind checked it
    return sum(len(text.encode()) + MARKER_TOKENS
               + len(question_text(q).encode()) + MARKER_TOKENS
               for q in questions.values() if isinstance(q, dict)) or MARKER_TOKENS


def _step_failed_detail(param: object) -> str:
    name = param.removeprefix("questions.") if isinstance(param, str) else None
    which = f"question '{name}'" if name else "a question"
    return (f"The decision service failed on {which} of this request (the model failed on "
            "it, and again when it was run alone), so no question was answered and nothing "
            "was billed. Retry; if it persists, contact support with the X-Anex-Request-ID "
            "header of this response.")


def realtime_decision_create(*, key: ApiKey, host_region: Region,
                             body: dict[str, Any]) -> dict[str, Any]:
    """POST /realtime/v1/systemone: the reference's answers, usage and routing."""
    realtime_open_require()
    model_id = body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise Malformed("model: This field is required: the decision model's id (laya).")
    model, kind, urls = realtime_model_require(model_id=model_id, key=key, kind=DecideKind)
    _region_require(key=key, host_region=host_region)
    checked = kind.realtime_request(model, body)
    most = checked.input_tokens if checked.input_tokens is not None else _decision_most(body)
    counted = Counted(exact=checked.input_tokens, most=most, taken=most)
    with _answered(key=key, model=model, counted=counted, urls=urls, path=kind.endpoint,
                   endpoint=Endpoint.SYSTEMONE, body=checked.forward(model.id)
                   ) as (answer, admission):
        error = answer.get("error")
        if isinstance(error, dict) and error.get("type") == "server_error":
            # The engine's step failed on one of this request's questions, in its batch and
            # again alone (feed.py): the engine's failure, not the caller's. The request
            # fails closed, as its batch row would: no question is answered and nothing is
            # billed (docs/realtime.md, "POST /systemone"; issue 40 L14).
            # (Not the question's name in the log: it is the customer's text.)
            logger.error("realtime decision engine failed on a question of the request")
            raise EngineFailed(_step_failed_detail(error.get("param")))
        if isinstance(error, dict):
            # A question the model refuses: 422 with the model's own message, naming it.
            # The engine checks the questions before it reads the text: nothing to bill.
            raise Malformed(str(error.get("message")))
        if not isinstance(answer.get("answers"), dict):
            raise EngineFailed(ENGINE_FAILED_DETAIL.format(what="decision"))
        read = int(answer.get("input_tokens") or 0)
        tokens = max(read, counted.exact) if counted.exact is not None else min(read, most)
        outcome = DecisionOutcome(answers=answer["answers"], input_tokens=tokens,
                                  routing=answer["routing"])
        _bill(key=key, endpoint=Endpoint.SYSTEMONE, model=model,
              input_tokens=outcome.input_tokens, admission=admission)
    return answer_body(model.id, outcome)
