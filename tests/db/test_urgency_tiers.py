"""Issue 44 item 2: urgency tiers (docs/dev/decisions/2026-12-06-urgency-tiers.md).

A job's `priority` (flex, standard, priority) scales its price by the tier's catalog
multiplier, exactly, in the estimate, the hold and the charge; and orders dispatch: priority
chunks before standard ones, standard before flex, fair share across organizations inside a
tier, flex chunks on their own queue and never holding a place a standard chunk needs; a flex
job unfinished 48 h after approval is dispatched as standard. The dispatch tests run the
product's release on PostgreSQL, catching only the messages it sends."""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from inference.catalog import catalog_tiers, model_get
from inference.constants import RowOutcome
from inference.pricing import Usage, job_cost_usd, price, usage_cost_usd, usage_json
from jobs import dispatch
from jobs.constants import ChunkStatus, JobStatus, Priority
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.services.chunks import Waiting, chunk_claim, jobs_flex_promote, tier_picks
from jobs.services.estimation import job_estimate
from jobs.services.recovery import recover
from jobs.services.running import chunk_settle, hold_reached, job_finalize, job_start
from jobs.storage import storage_for
from tests.db.test_fair_dispatch import approved_job
from tests.dispatched import Sent, dispatch_catch
from tests.factories import organization_make

JOBS = "/batch/v1/jobs"
EMBED = "qwen3-embedding-8b"
MULTIPLIERS = {"flex": Decimal("0.5"), "standard": Decimal(1), "priority": Decimal("1.75")}


# --- prices ---------------------------------------------------------------------------------


def test_the_catalog_tiers_are_the_decided_multipliers_and_windows() -> None:
    tiers = catalog_tiers()
    assert {name: tier.multiplier for name, tier in tiers.items()} == MULTIPLIERS
    assert {name: tier.completion_hours for name, tier in tiers.items()} == {
        "flex": 72, "standard": 24, "priority": 24}
    assert set(tiers) == set(Priority.values)


@pytest.mark.parametrize("priority", list(MULTIPLIERS))
def test_a_tier_scales_the_exact_cost_before_rounding_up(priority: str) -> None:
    model = model_get(EMBED)
    assert model is not None
    usage = Usage(input_tokens=1_000_001)  # $0.03000003 at the standard rate
    exact = usage_cost_usd(model, usage) * MULTIPLIERS[priority]
    assert job_cost_usd(model, usage, priority) == exact
    priced = price(model, usage, priority)
    assert priced.exact_usd == exact
    assert priced.cents == math.ceil(exact * 100)
    assert priced.cents == {"flex": 2, "standard": 4, "priority": 6}[priority]


def test_the_minimum_job_price_is_not_multiplied() -> None:
    laya = model_get("laya")  # $0.005 per 1M input tokens, a $0.05 minimum job
    assert laya is not None
    assert price(laya, Usage(input_tokens=3_000), "flex").cents == 5
    assert price(laya, Usage(input_tokens=3_000), "priority").cents == 5
    # Above the minimum the multiplier rules: 40M tokens are $0.20, flex $0.10.
    assert price(laya, Usage(input_tokens=40_000_000), "flex").cents == 10
    assert price(laya, Usage(input_tokens=40_000_000), "priority").cents == 35
    assert price(laya, Usage(), "priority").cents == 0  # no work, no charge


# --- estimate, hold, charge -----------------------------------------------------------------


def _count(checkpoints: Path, text: str) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoints / "tokenizer.json"))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.django_db
@pytest.mark.parametrize("priority", list(MULTIPLIERS))
def test_the_estimate_and_the_hold_are_the_tiers_price_exactly(
        api: APIClient, organization: Organization, checkpoints: Path, priority: str) -> None:
    from tests.factories import input_ready

    text = "a plain text string " * 2_500
    content = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/embeddings",
                                   "body": {"input": text}}).encode() + b"\n"
                       for i in range(100))
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": EMBED,
                               "priority": priority}, format="json")
    assert response.status_code == 200, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.priority == priority
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    tokens = 100 * (_count(checkpoints, text) + 1)  # one end-of-text token a row
    exact = tokens * Decimal("0.03") / 1_000_000 * MULTIPLIERS[priority]
    job.refresh_from_db()
    assert job.est_cost_cents == math.ceil(exact * 100)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["priority"], body["est_cost_cents"], body["completion_window_hours"]) == (
        priority, math.ceil(exact * 100), 72 if priority == "flex" else 24)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    assert credits_summary(organization=organization).held == job.est_cost_cents
    # The hold check while running compares the exact cost at the tier: the counted
    # usage reaches the hold only at the tier's price, not at the standard one.
    job.refresh_from_db()
    model = model_get(EMBED)
    assert model is not None
    assert not hold_reached(job, Usage(input_tokens=tokens - 200_000))
    if priority != "standard":
        standard_reach = Usage(input_tokens=math.ceil(
            Decimal(job.est_cost_cents) / 100 / Decimal("0.03") * 1_000_000))
        assert hold_reached(job, standard_reach) == (priority == "priority")


def _run_chunk(chunk_id: str, usage: Usage) -> None:
    """A worker's run of a one-row chunk consuming `usage`."""
    assert chunk_claim(chunk_id=chunk_id)
    chunk = Chunk.objects.select_related("job").get(pk=chunk_id)
    line = json.dumps({"i": chunk.first_row, "id": f"r{chunk.first_row}",
                       "outcome": RowOutcome.SUCCESS.value, "status_code": 200,
                       "body": {"choices": [{"message": {"content": "a"}}]}, "error": None,
                       "output": "a", "embedding": None, "usage": usage_json(usage)})
    storage_for("world").write_stream(chunk_key(chunk.job, chunk.index),
                                      iter([line.encode() + b"\n"]), max_bytes=10**6)
    assert chunk_settle(chunk=chunk, to=ChunkStatus.DONE, usage=usage,
                        counts={RowOutcome.SUCCESS: 1})


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    """The chunk messages the release sends (nothing consumes them here; the tests run
    the chunks, the starts and the finalizes themselves)."""
    messages: list[Sent] = []

    def record(message: Sent) -> None:
        if message.actor in ("chunk_run_task", "chunk_flex_run_task"):
            messages.append(message)

    dispatch_catch(monkeypatch, record, "chunk_run_task", "chunk_flex_run_task",
                   "job_start_task", "job_finalize_task")
    return messages


@pytest.fixture(autouse=True)
def one_row_chunks(settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_DISPATCH_IN_FLIGHT = 2
    settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 2


def tiered_job(organization: Organization, rows: int, priority: str) -> Job:
    """An approved job of `rows` one-row chunks in `priority` (approval holds 5,000)."""
    job = approved_job(organization, rows)
    Job.objects.filter(pk=job.pk).update(priority=priority)
    return Job.objects.get(pk=job.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("priority", list(MULTIPLIERS))
def test_the_final_charge_is_the_tiers_price_exactly_and_once(sent: list[Sent],
                                                               priority: str) -> None:
    organization = organization_make()
    job = tiered_job(organization, 2, priority)
    job_start(job_id=job.pk)
    each = Usage(input_tokens=2_000_000, output_tokens=500_000)
    for message in list(sent):
        _run_chunk(message.id, each)
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    assert job_finalize(job_id=job.pk) is None  # a second finalize charges nothing more
    model = model_get(job.model)
    assert model is not None
    exact = usage_cost_usd(model, each + each) * MULTIPLIERS[priority]
    charges = list(LedgerEntry.objects.filter(job_id=job.pk, kind=EntryKind.CHARGE)
                   .values_list("balance_delta", flat=True))
    assert charges == [-math.ceil(exact * 100)]
    job.refresh_from_db()
    assert job.cost_cents == math.ceil(exact * 100)


# --- dispatch ---------------------------------------------------------------------------------


def _waiting(rank: int, org: uuid.UUID, waiting: int = 10, in_flight: int = 0) -> Waiting:
    return Waiting(job_id=uuid.uuid4(), organization_id=org, approved_at=timezone.now(),
                   waiting=waiting, in_flight=in_flight, rank=rank)


def test_places_go_in_tier_order_and_fairly_inside_a_tier() -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    # a has priority work and much in flight; b priority work and none; c standard, none.
    pa, pb = _waiting(0, a, in_flight=3), _waiting(0, b, waiting=2)
    sc, fx = _waiting(1, c), _waiting(2, c)
    picks = tier_picks([sc, pa, pb, fx], {0: Counter({a: 3})}, firm_in_flight=3,
                       flex_in_flight=0, cap=10, job_cap=10)
    # Priority first, b's (fewest in flight) before a's; a's once b has none left
    # waiting; standard only then; no flex while standard waits.
    assert picks == [pb.job_id, pb.job_id] + [pa.job_id] * 5
    assert fx.job_id not in picks and sc.job_id not in picks


def test_flex_takes_only_what_nothing_else_wants_and_never_a_firm_place() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    fx = _waiting(2, a)
    # Nothing firm waiting: flex fills the room left by everything in flight.
    assert tier_picks([fx], {}, firm_in_flight=1, flex_in_flight=1, cap=4,
                      job_cap=10) == [fx.job_id] * 2
    # Flex in flight holds no place from a standard job: it gets the whole firm room.
    st = _waiting(1, b, waiting=3)
    fx = _waiting(2, a, in_flight=4)
    assert tier_picks([st, fx], {2: Counter({a: 4})}, firm_in_flight=0, flex_in_flight=4,
                      cap=4, job_cap=10) == [st.job_id] * 3


def test_fair_share_inside_a_tier_counts_that_tiers_chunks_in_flight() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    # a has five flex chunks in flight, b none: in the standard tier both start level (a's
    # flex work does not cost its standard share), so the places alternate, a's job
    # (approved first) leading; counted across tiers, b would take all four.
    sa, sb = _waiting(1, a), _waiting(1, b)
    assert sb.approved_at is not None
    sa.approved_at = sb.approved_at - timedelta(seconds=1)
    picks = tier_picks([sa, sb], {2: Counter({a: 5})}, firm_in_flight=0, flex_in_flight=5,
                       cap=4, job_cap=10)
    assert picks == [sa.job_id, sb.job_id, sa.job_id, sb.job_id]


@pytest.mark.django_db
def test_the_release_orders_tiers_and_sends_flex_to_its_own_queue(sent: list[Sent]) -> None:
    flex = tiered_job(organization_make(), 6, "flex")
    assert job_start(job_id=flex.pk) == 2  # alone on the model: flex takes the room
    assert [(m.actor, m.queue) for m in sent] == [
        ("chunk_flex_run_task", dispatch.flex_queue("world", flex.model))] * 2
    sent.clear()
    standard = tiered_job(organization_make(), 4, "standard")
    # The flex chunks in flight hold no place from it: its chunks are sent at once.
    assert job_start(job_id=standard.pk) == 2
    assert [(m.actor, m.queue) for m in sent] == [
        ("chunk_run_task", dispatch.run_queue("world", standard.model))] * 2
    urgent = tiered_job(organization_make(), 2, "priority")
    assert job_start(job_id=urgent.pk) == 0  # the firm room (2) is the standard job's
    # As firm chunks end, the places go to the priority job, then to standard; flex gets
    # nothing while a firm chunk waits.
    order: list[uuid.UUID] = []
    for _ in range(4):
        done = sent.pop(0)
        before = len(sent)
        _run_chunk(done.id, Usage(input_tokens=3))
        order.extend(_job_of(m) for m in sent[before:])
    assert order == [urgent.pk, urgent.pk, standard.pk, standard.pk]
    assert all(m.actor == "chunk_run_task" for m in sent)


def _job_of(message: Sent) -> uuid.UUID:
    return Chunk.objects.get(pk=message.id).job_id


@pytest.mark.django_db
def test_a_flex_chunk_is_sent_only_once_no_firm_chunk_waits(sent: list[Sent]) -> None:
    standard = tiered_job(organization_make(), 3, "standard")
    flex = tiered_job(organization_make(), 3, "flex")
    job_start(job_id=standard.pk)
    job_start(job_id=flex.pk)
    assert [_job_of(m) for m in sent] == [standard.pk, standard.pk]
    first = sent.pop(0)
    _run_chunk(first.id, Usage(input_tokens=3))
    # The freed place goes to the standard job's last waiting chunk, not to flex.
    assert [_job_of(m) for m in sent] == [standard.pk, standard.pk]
    second = sent.pop(0)
    _run_chunk(second.id, Usage(input_tokens=3))
    # Nothing firm waits now: flex takes the place nothing else wants.
    assert [_job_of(m) for m in sent] == [standard.pk, flex.pk]
    assert sent[-1].actor == "chunk_flex_run_task"


@pytest.mark.django_db
def test_a_flex_chunk_taken_while_firm_work_is_pending_goes_back_unclaimed(
        sent: list[Sent], monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.services.running import chunk_run

    ran: list[uuid.UUID] = []

    def engine_step(job: Job, rows: Any) -> Any:
        ran.append(job.pk)
        raise AssertionError("a flex chunk ran while standard work was pending")

    monkeypatch.setattr("jobs.services.running.execute", engine_step)
    flex = tiered_job(organization_make(), 2, "flex")
    job_start(job_id=flex.pk)
    taken = Chunk.objects.get(pk=sent[0].id)
    standard = tiered_job(organization_make(), 1, "standard")
    job_start(job_id=standard.pk)  # its chunk sent, not yet started: pending
    assert chunk_run(chunk_id=taken.pk) is None
    taken.refresh_from_db()
    # Back to waiting its turn, unclaimed, no attempt spent; nothing ran.
    assert (taken.status, taken.queued_at, taken.attempts) == (ChunkStatus.PENDING, None, 0)
    assert ran == []
    # Once the standard chunk has run, no firm chunk is pending: the release sends the
    # flex chunk again (the place the standard chunk held), and it runs.
    standard_message = next(m for m in sent if _job_of(m) == standard.pk)
    _run_chunk(standard_message.id, Usage(input_tokens=3))
    taken.refresh_from_db()
    assert taken.queued_at is not None
    assert sent[-1].id == str(taken.pk) and sent[-1].actor == "chunk_flex_run_task"


@pytest.mark.django_db
def test_fair_share_holds_inside_the_priority_tier(sent: list[Sent]) -> None:
    standard = tiered_job(organization_make(), 4, "standard")
    job_start(job_id=standard.pk)
    one = tiered_job(organization_make(), 4, "priority")
    two = tiered_job(organization_make(), 4, "priority")
    job_start(job_id=one.pk)
    job_start(job_id=two.pk)
    picks: list[uuid.UUID] = []
    for _ in range(4):
        done = sent.pop(0)
        before = len(sent)
        _run_chunk(done.id, Usage(input_tokens=3))
        picks.extend(_job_of(m) for m in sent[before:])
    # Every freed place went to a priority job, alternating between the organizations.
    assert set(picks) == {one.pk, two.pk}
    assert Counter(picks)[one.pk] == Counter(picks)[two.pk] == 2


@pytest.mark.django_db
def test_a_flex_job_is_promoted_48_hours_after_approval(sent: list[Sent]) -> None:
    standard = tiered_job(organization_make(), 4, "standard")
    job_start(job_id=standard.pk)
    young = tiered_job(organization_make(), 2, "flex")
    old = tiered_job(organization_make(), 2, "flex")
    job_start(job_id=young.pk)
    job_start(job_id=old.pk)
    assert {_job_of(m) for m in sent} == {standard.pk}
    now = timezone.now()
    Job.objects.filter(pk=young.pk).update(approved_at=now - timedelta(hours=47))
    Job.objects.filter(pk=old.pk).update(approved_at=now - timedelta(hours=48, minutes=1))
    assert recover()["flex promoted"] == 1
    assert jobs_flex_promote() == 0  # once
    old.refresh_from_db()
    young.refresh_from_db()
    assert old.promoted_at is not None and young.promoted_at is None
    assert (old.dispatch_tier, old.priority) == ("standard", "flex")  # the price stays flex's
    # Now a standard job in dispatch: as a place frees it competes with the standard job
    # (fair share: its organization has none in flight) and goes to the run queue.
    done = sent.pop(0)
    before = len(sent)
    _run_chunk(done.id, Usage(input_tokens=3))
    assert [(_job_of(m), m.queue) for m in sent[before:]] == [
        (old.pk, dispatch.run_queue("world", old.model))]
    from jobs.serializers import JobOut

    assert JobOut.answer(old)["promoted_at"] is not None
    assert JobOut.answer(young)["promoted_at"] is None


# --- the API --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_priority_is_optional_standard_by_default_and_shown(api: APIClient,
                                                            organization: Organization) -> None:
    from tests.factories import input_ready

    item = input_ready(organization, b'{"custom_id": "a", "body": {"input": "x"}}\n')
    plain = api.post(JOBS, {"input_id": str(item.pk), "model": EMBED}, format="json")
    flex = api.post(JOBS, {"input_id": str(item.pk), "model": EMBED, "priority": "flex"},
                    format="json")
    assert plain.status_code == flex.status_code == 200
    shown = api.get(f"{JOBS}/{plain.json()['id']}").json()
    assert (shown["priority"], shown["completion_window_hours"], shown["promoted_at"]) == (
        "standard", 24, None)
    assert api.get(f"{JOBS}/{flex.json()['id']}").json()["priority"] == "flex"


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["urgent", "FLEX", 1])
def test_an_unknown_priority_is_422_naming_the_tiers(api: APIClient, organization: Organization,
                                                     value: Any) -> None:
    from tests.factories import input_ready

    item = input_ready(organization, b'{"custom_id": "a", "body": {"input": "x"}}\n')
    response = api.post(JOBS, {"input_id": str(item.pk), "model": EMBED, "priority": value},
                        format="json")
    assert response.status_code == 422
    assert response.json()["detail"] == (
        f'priority: priority must be one of flex, standard, priority (docs/estimates.md, '
        f'"Urgency tiers"); got "{value}".')
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_openapi_document_names_the_tiers(api: APIClient) -> None:
    document = api.get("/batch/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert schemas["PriorityEnum"]["enum"] == ["flex", "standard", "priority"]
    create = schemas["JobCreateInRequest"]["properties"]["priority"]
    assert "PriorityEnum" in json.dumps(create)
    shown = document["paths"]["/batch/v1/jobs/{job_id}"]["get"]["responses"]["200"][
        "content"]["application/json"]["schema"]["properties"]
    assert {"priority", "completion_window_hours", "promoted_at"} <= set(shown)


# --- metrics and the operations page ----------------------------------------------------------


@pytest.mark.django_db
def test_metrics_have_a_queue_wait_histogram_per_tier(sent: list[Sent]) -> None:
    from anex.metrics import ENDED
    from tests.db.test_metrics import scrape, value

    ENDED.reset()
    before = scrape()
    job = tiered_job(organization_make(), 2, "flex")
    Job.objects.filter(pk=job.pk).update(approved_at=timezone.now() - timedelta(seconds=30))
    job_start(job_id=job.pk)
    for message in list(sent):
        _run_chunk(message.id, Usage(input_tokens=3))
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    after = scrape()
    ENDED.reset()
    # Two chunks, each waited about 30 s from the approval to its start: in the 60 s
    # bucket, not the 10 s one; and nothing in the other tiers.
    name = "anex_chunk_queue_wait_seconds"
    assert value(after, f"{name}_count", tier="flex") == \
        value(before, f"{name}_count", tier="flex") + 2
    assert value(after, f"{name}_bucket", tier="flex", le="60.0") == \
        value(before, f"{name}_bucket", tier="flex", le="60.0") + 2
    assert value(after, f"{name}_bucket", tier="flex", le="10.0") == \
        value(before, f"{name}_bucket", tier="flex", le="10.0")
    assert 60 <= value(after, f"{name}_sum", tier="flex") - \
        value(before, f"{name}_sum", tier="flex") < 70
    for tier in ("standard", "priority"):
        assert value(after, f"{name}_count", tier=tier) == \
            value(before, f"{name}_count", tier=tier)


@pytest.mark.django_db
def test_the_operations_page_shows_each_tier(sent: list[Sent]) -> None:
    from tests.db.test_admin_permissions import staff_with

    standard = tiered_job(organization_make(), 3, "standard")
    flex = tiered_job(organization_make(), 2, "flex")
    job_start(job_id=standard.pk)
    job_start(job_id=flex.pk)
    _run_chunk(sent[0].id, Usage(input_tokens=3))
    Job.objects.filter(pk=flex.pk).update(promoted_at=timezone.now())
    page = staff_with("view_job").get("/admin/operations/")
    assert page.status_code == 200
    tiers = {row["figures"].tier: row["figures"] for row in page.context["tiers"]}
    assert list(tiers) == ["priority", "standard", "flex"]
    assert (tiers["standard"].jobs_running, tiers["standard"].chunks_in_flight,
            tiers["standard"].chunks_waiting, tiers["standard"].started) == (1, 2, 0, 1)
    assert (tiers["flex"].jobs_running, tiers["flex"].promoted,
            tiers["flex"].chunks_waiting) == (1, 1, 2)
    assert tiers["priority"].jobs_running == 0
    html = page.content.decode()
    assert "Urgency tiers" in html and "promoted to standard dispatch" in html


# --- the console ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_console_submits_a_tier_and_shows_it(organization: Organization, settings: Settings,
                                                 tokenizer_dir: Any) -> None:
    from tests.db.test_console import form, signed_in
    from tests.factories import input_ready

    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": tokenizer_dir}
    owner = signed_in(organization)[0]
    assert 'name="priority"' in owner.get("/console/jobs/new").content.decode()
    item = input_ready(organization, b'{"custom_id": "a", "method": "POST", "url": '
                                     b'"/v1/chat/completions", "body": {"messages": []}}\n')
    response = owner.post("/console/jobs/new", form(organization, {
        "input_id": str(item.pk), "model": "tiny-qwen3", "priority": "priority"}))
    assert response.status_code == 302, response.content
    job = Job.objects.for_org(organization).get()
    assert job.priority == Priority.PRIORITY
    assert '<div class="figure" id="tier">Priority</div>' in \
        owner.get(f"/console/jobs/{job.pk}").content.decode()
    assert '<span class="badge">priority</span>' in owner.get("/console/jobs").content.decode()
    # A plain submit is standard; an unknown tier is the form's refusal, nothing created.
    page = owner.post("/console/jobs/new", form(organization, {
        "input_id": str(item.pk), "model": "tiny-qwen3", "priority": "urgent"}))
    assert page.status_code == 200 and Job.objects.for_org(organization).count() == 1
    owner.post("/console/jobs/new", form(organization, {"input_id": str(item.pk),
                                                        "model": "tiny-qwen3"}))
    assert Job.objects.for_org(organization).exclude(pk=job.pk).get().priority == "standard"


# --- through the broker -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_through_the_broker_a_standard_job_overtakes_the_flex_job_holding_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Dramatiq worker on the real broker (only the engine step replaced): the flex
    chunks already sent hold no place from the standard job, and a flex chunk the worker
    takes while a standard chunk is pending goes back unclaimed, so the standard job's
    chunks run first."""
    import dramatiq

    from inference.kinds.base import InputRow
    from tests.db.test_fair_dispatch import answer
    from tests.workers import broker_flush, running_worker, until

    ran: list[uuid.UUID] = []

    def engine_step(job: Job, rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
        ran.append(job.pk)
        return answer(rows)

    monkeypatch.setattr("jobs.services.running.execute", engine_step)
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")  # started here
    broker = dramatiq.get_broker()
    broker_flush()
    for queue in dispatch.model_queues("world", "gemma4-12b"):
        broker.declare_queue(queue)
    flex = tiered_job(organization_make(), 6, "flex")
    standard = tiered_job(organization_make(), 2, "standard")
    assert job_start(job_id=flex.pk) == 2  # the model's room, all flex's
    assert job_start(job_id=standard.pk) == 2  # sent at once beside them

    def done() -> bool:
        return Job.objects.filter(pk__in=[flex.pk, standard.pk],
                                  status=JobStatus.DONE).count() == 2

    with running_worker(threads=1):
        until(done, timeout=120)
    assert Counter(ran) == {flex.pk: 6, standard.pk: 2}  # every chunk once
    # A flex chunk the worker took while the standard chunks were pending went back
    # unclaimed: the standard job's chunks ran first.
    assert ran[:2] == [standard.pk, standard.pk], ran
    flex.refresh_from_db()
    standard.refresh_from_db()
    assert standard.finished_at is not None and flex.finished_at is not None
    assert standard.finished_at < flex.finished_at
