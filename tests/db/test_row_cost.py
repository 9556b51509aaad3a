"""Per-row cost: every result row carries its share of the job's charge ("cost":
{"credits": "..."} in JSONL, a cost_credits decimal column in parquet), in proportion to
its exact price, and the shares add up to the charge exactly (the job rounds once, at the
end: billing.allocation)."""

from __future__ import annotations

import io
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings

from billing.allocation import ChargeAllocator, credits_text
from billing.models import LedgerEntry
from console.models import Organization
from inference.catalog import model_get
from inference.constants import RowOutcome
from inference.pricing import Usage, price, usage_cost_usd
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.services.lifecycle import job_approve
from jobs.services.running import chunk_run, job_finalize, job_start, job_usage
from jobs.storage import storage_for
from tests.chunks import chunk_done, row_record
from tests.dispatched import finalizes_run
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, chat_request_line, input_ready, job_make

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def credits(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 100


def approved(organization: Organization, rows: int, *, est: int, model: str = "gemma4-12b",
             content: bytes | None = None, fmt: str = "jsonl") -> Job:
    item = input_ready(organization, content or b"".join(chat_request_line(f"r{i}")
                                                         for i in range(rows)), fmt=fmt)
    job = job_make(organization, est_cost_cents=est, model=model)
    task = model_get(model).task  # type: ignore[union-attr]
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, max_output_tokens=50,
                                         format=fmt, task_type=task)
    return job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)


def usage_of(index: int) -> Usage:
    return Usage(input_tokens=1000 + 37 * index, output_tokens=300 + 13 * index)


def outcome_of(index: int) -> RowOutcome:
    return (RowOutcome.ERROR if index % 17 == 3 else RowOutcome.TRUNCATED if index % 23 == 5
            else RowOutcome.SUCCESS)


def complete(chunk: Chunk) -> None:
    """Record the chunk done as chunk_run does, each row with its own usage (a failed row
    bills nothing)."""
    chunk_done(chunk, [row_record(index, f"r{index}", outcome_of(index), usage_of(index),
                                  answer=f"a{index}")
                       for index in range(chunk.first_row, chunk.first_row + chunk.row_count)])


def run_all(job: Job) -> Job:
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        complete(chunk)
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job.refresh_from_db()
    return job


def result_lines(job: Job) -> list[dict[str, Any]]:
    path = storage_for("world").path(job.result_key)  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()]


def charged(job: Job) -> int:
    entry = LedgerEntry.objects.get(idempotency_key=f"job:{job.pk}:charge")
    return -entry.balance_delta


def test_row_costs_add_up_to_the_charge_on_a_job_of_1000_rows(
        organization: Organization, sent: list[str]) -> None:
    # given a 1,000-row job whose rows each used a different number of tokens
    job = run_all(approved(organization, 1000, est=10_000))
    model = model_get("gemma4-12b")
    assert model is not None
    exact = usage_cost_usd(model, job_usage(job)) * 100
    assert job.cost_cents == price(model, job_usage(job)).cents > exact  # rounded up once
    # then every row says what it cost, as a decimal string
    lines = result_lines(job)
    assert len(lines) == 1000
    costs = [Decimal(line["cost"]["credits"]) for line in lines]
    assert all(isinstance(line["cost"]["credits"], str) for line in lines)
    # and the rows' costs add up to the job's charge exactly, the ledger's charge too
    assert sum(costs) == job.cost_cents == charged(job)
    # a failed row cost nothing; the others their share of the rounded charge in
    # proportion to their own exact price (to the 9th decimal)
    for index, (line, cost) in enumerate(zip(lines, costs, strict=True)):
        if outcome_of(index) == RowOutcome.ERROR:
            assert line["cost"] == {"credits": "0"} and line["error"] is not None
            continue
        share = usage_cost_usd(model, usage_of(index)) * 100 * job.cost_cents / exact
        assert abs(cost - share) < Decimal("1e-8")
    # the reference's envelope is unchanged around the new field
    assert list(lines[0]) == ["id", "custom_id", "response", "error", "cost"]


def test_a_small_job_spreads_its_minimum_price(organization: Organization,
                                               sent: list[str]) -> None:
    # 3 rows whose tokens cost a fraction of a credit pay the model's minimum job price
    # (gemma4-12b: $0.10), spread over them by their exact prices
    job = run_all(approved(organization, 3, est=100))
    assert job.cost_cents == 10
    costs = [Decimal(line["cost"]["credits"]) for line in result_lines(job)]
    assert sum(costs) == 10 == charged(job)
    assert costs[0] < costs[1] < costs[2]  # row 2 used the most tokens


def test_the_rows_of_a_charge_capped_at_the_hold_add_up_to_the_hold(
        organization: Organization, sent: list[str]) -> None:
    # A job never charges more than its hold: its rows add up to what was charged.
    # (the rows were written past it, as a redelivered last chunk can be)
    job = run_all(approved(organization, 200, est=5))
    assert job.cost_cents == 5 == charged(job)
    assert sum(Decimal(line["cost"]["credits"]) for line in result_lines(job)) == 5


def test_a_parquet_result_has_a_cost_credits_column(organization: Organization,
                                                    sent: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(150)],
                             "prompt": ["hi"] * 150}), buffer)
    job = run_all(approved(organization, 150, est=5000, content=buffer.getvalue(),
                           fmt="parquet"))
    table = pq.read_table(storage_for("world").path(job.result_key))  # type: ignore[attr-defined]
    assert table.schema.field("cost_credits").type == pa.decimal128(38, 9)
    assert sum(table.column("cost_credits").to_pylist()) == job.cost_cents == charged(job)


def test_the_allocation_is_exact_and_proportional() -> None:
    rng = random.Random(7)
    for _ in range(50):
        weights = [Decimal(rng.randint(0, 10**6)) / Decimal(10**rng.randint(0, 12))
                   for _ in range(rng.randint(1, 400))]
        total = sum(weights, Decimal(0))
        charge = rng.randint(1, 10**7)
        allocator = ChargeAllocator(charge=charge, total_weight=total)
        shares = [allocator.share(w) for w in weights]
        assert sum(shares) == (charge if total else 0)
        assert all(share >= 0 for share in shares)
        for weight, share in zip(weights, shares, strict=True):
            assert abs(share - charge * weight / total) <= Decimal("1e-9") if total else True
    assert [credits_text(Decimal(x)) for x in ("0.012300000", "1.000000000", "0", "12")] == [
        "0.0123", "1", "0", "12"]


@pytest.mark.django_db(transaction=True)
def test_a_real_engine_run_prices_every_row(settings: Settings, organization: Organization,
                                            sent: list[str], monkeypatch: pytest.MonkeyPatch,
                                            checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    # given a 1,000-row embedding job served by the real MiniLM engine
    settings.ANEX_CHECKPOINTS = {"all-minilm-l6-v2": checkpoint_dirs["minilm"]}
    settings.ANEX_CHUNK_ROWS = 250
    content = b"".join(json.dumps({"custom_id": f"e{i}", "method": "POST",
                                   "url": "/v1/embeddings",
                                   "body": {"input": "word " * (1 + i % 40)}}).encode() + b"\n"
                       for i in range(1000))
    job = approved(organization, 1000, est=100, model="all-minilm-l6-v2", content=content)
    # when its chunks run on the engine
    job_start(job_id=job.pk)
    with finalizes_run(monkeypatch):  # the last chunk's finalize, on a CPU worker
        for chunk_id in sent:
            assert chunk_run(chunk_id=chunk_id) == ChunkStatus.DONE
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    # then the rows' costs add up to the charge, a longer text costing more
    lines = result_lines(job)
    costs = [Decimal(line["cost"]["credits"]) for line in lines]
    assert len(costs) == 1000 and sum(costs) == job.cost_cents == charged(job) > 0
    assert costs[39] > costs[0]


def test_a_parquet_embedding_result_has_each_rows_vector_and_none_for_a_failed_row(
        organization: Organization, sent: list[str]) -> None:
    # given a parquet embedding job whose chunks keep each vector once, in the row's body
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(150)], "input": ["hi"] * 150}),
                   buffer)
    job = approved(organization, 150, est=5000, content=buffer.getvalue(), fmt="parquet",
                   model="qwen3-embedding-8b")
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        chunk_done(chunk, [row_record(i, f"r{i}", outcome_of(i), Usage(input_tokens=3),
                                      embedding=[i / 4, -1.0, 0.5])
                           for i in range(chunk.first_row, chunk.first_row + chunk.row_count)])
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job.refresh_from_db()
    # then the result's embedding column holds them (float32), null where a row failed
    table = pq.read_table(storage_for("world").path(job.result_key))  # type: ignore[attr-defined]
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    assert table.column("embedding").to_pylist() == [
        None if outcome_of(i) == RowOutcome.ERROR else [i / 4, -1.0, 0.5] for i in range(150)]
