"""Issue 40, M6: a poisoned chunk is the chunk's fault, not the engine's.

A job whose every row fails the engine's step (a GPU fault on each request), alone in the
engine, used to pass for a broken engine: the feed failed its callers as the engine's
failure, the chunk spent no attempt (up to 10 deferrals, unbilled) and the worker's breaker
counted it, so one such job opened every worker's breaker on the model, for every tenant.
And a chunk whose rows kill the engine (vLLM's EngineDeadError) was handed from engine to
engine the same way. Here the engine is a fake one (these tiers have no vLLM) under the real
feed, chunk runner, failure classes and breaker: job A's rows poison it, job B's are
plain, both on one model and one worker."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from pytest_django import Settings

from billing.services import credits_summary
from console.models import Organization
from inference.engines import ChatOutcome, ChatRow, ChatSettings
from inference.engines import feed as feed_module
from inference.engines.feed import EngineFeed, RequestFailed
from inference.engines.types import RowError
from jobs.constants import ChunkStatus, JobStatus
from jobs.failures import breaker_for, breakers_open, breakers_reset
from jobs.models import Chunk, Job
from jobs.services.lifecycle import job_approve
from jobs.services.running import CHUNK_ATTEMPTS, CHUNKS_FAILED, chunk_run, job_start
from jobs.storage import storage_for
from tests.dispatched import Sent, dispatch_catch, finalizes_run
from tests.factories import SYSTEM, chat_request_line, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
MODEL = "gemma4-12b"
POISON = "poison"
# What a poisoned row's prompt is to the fake engine.
POISONED_PROMPT = [666]


class EngineDeadError(RuntimeError):
    """vLLM's own name for an engine that stopped (read by name, as jobs.failures does)."""


@dataclass(frozen=True)
class _Output:
    request_id: str
    finished: bool = True


class FakeLLM:
    """A vLLM LLM as the feed drives it (llm_engine.add_request / step / abort_request):
    each request finishes in one step, except that a step holding a poisoned request fails:
    a RuntimeError (a fault on that request), or with `kills`, EngineDeadError, after
    which the engine answers nothing again (as vLLM's dead engine core)."""

    def __init__(self, *, kills: bool = False) -> None:
        self.llm_engine = self
        self.kills = kills
        self.dead = False
        self.held: dict[str, Any] = {}
        self.probes = 0

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> None:
        if self.dead:
            raise EngineDeadError("EngineCore encountered an issue")
        self.held[request_id] = prompt
        self.probes += request_id.startswith("feed-probe")

    def step(self) -> list[_Output]:
        if self.dead:
            raise EngineDeadError("EngineCore encountered an issue")
        if any(prompt["prompt_token_ids"] == POISONED_PROMPT for prompt in self.held.values()):
            if self.kills:
                self.dead = True
                raise EngineDeadError("EngineCore encountered an issue")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        outputs = [_Output(request_id) for request_id in self.held]
        self.held.clear()
        return outputs

    def abort_request(self, ids: list[str], internal: bool = False) -> None:
        for request_id in ids:
            self.held.pop(request_id, None)


class BrokenLLM(FakeLLM):
    """An engine whose every step fails, whatever it holds."""

    def step(self) -> list[_Output]:
        raise RuntimeError("CUDA error: unspecified launch failure")


class FeedChat:
    """A chat engine over the real EngineFeed on a FakeLLM, reading the feed's results as
    inference.engines.ChatEngine.generate does: a RequestFailed is its row's engine_error,
    any other exception the chunk's."""

    def __init__(self, llm: Any) -> None:
        self.feed = EngineFeed(llm, threading.Lock())

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        prompts = [{"prompt_token_ids": POISONED_PROMPT if POISON in str(row.messages)
                    else [1, 2, 3]} for row in rows]
        results = self.feed.run(prompts, [SimpleNamespace() for _ in rows])
        outcomes = []
        for result in results:
            if isinstance(result, RequestFailed):
                outcomes.append(ChatOutcome.failed(RowError.engine_failed()))
            elif isinstance(result, Exception):
                raise result
            else:
                outcomes.append(ChatOutcome(content="ok", reasoning=None, finish_reason="stop",
                                            prompt_tokens=3, completion_tokens=1,
                                            reasoning_tokens=0))
        return outcomes


@pytest.fixture(autouse=True)
def setup(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    # The two places the feed names vLLM's own types.
    monkeypatch.setattr(feed_module, "_final_only", lambda params: None)
    monkeypatch.setattr(feed_module, "_probe_request",
                        lambda: ({"prompt_token_ids": [0]}, SimpleNamespace()))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    messages: list[Sent] = []
    dispatch_catch(monkeypatch, messages.append, "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")
    return messages


def engine_serving(monkeypatch: pytest.MonkeyPatch, engine: FeedChat) -> None:
    """This worker's engine for the model, from now on (a restart builds a new one)."""
    monkeypatch.setattr("inference.kinds.engines.engine_cached",
                        lambda model_id, kind: engine)


def job_of(organization: Organization, texts: list[str]) -> Job:
    item = input_ready(organization, b"".join(chat_request_line(f"r{i}", text)
                                              for i, text in enumerate(texts)))
    job = job_make(organization, est_cost_cents=5_000, model=MODEL)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=len(texts), max_output_tokens=5)
    approved = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=approved.pk)
    return approved


def chunks_of(job: Job, sent: list[Sent]) -> list[str]:
    ids = {str(pk) for pk in Chunk.objects.filter(job=job).values_list("pk", flat=True)}
    return [message.id for message in sent if message.id in ids]


def result_errors(job: Job) -> list[str | None]:
    job.refresh_from_db()
    with storage_for("world").open(job.result_key) as stream:
        lines = [json.loads(line) for line in stream.read().splitlines()]
    return [line["error"]["code"] if line["error"] else None for line in lines]


def test_rows_that_fail_every_step_fail_alone_and_the_engine_keeps_serving(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    # given one model's worker, its engine healthy, and two organizations' jobs: A's six
    # rows each fail the engine's step (three chunks of two, each alone in the engine),
    # B's are plain
    llm = FakeLLM()
    engine_serving(monkeypatch, FeedChat(llm))
    a_org, b_org = organization_make(), organization_make()
    a = job_of(a_org, [f"{POISON} {i}" for i in range(6)])
    b = job_of(b_org, [f"hello {i}" for i in range(6)])
    a_before = credits_summary(organization=a_org)
    # when the worker runs them, A's chunks first, each alone in the engine (and a CPU
    # worker each job's finalize)
    with finalizes_run(monkeypatch):
        for chunk_id in chunks_of(a, sent) + chunks_of(b, sent):
            assert chunk_run(chunk_id=chunk_id) == ChunkStatus.DONE
    # then every row of A failed alone, in its row (the engine answered the feed's own
    # request each time, so the rows were at fault, not the engine), each chunk in its
    # first attempt with no deferral, and nothing of A was billed
    assert llm.probes == 3
    assert result_errors(a) == ["engine_error"] * 6
    a.refresh_from_db()
    assert (a.status, a.error_rows, a.cost_cents) == (JobStatus.DONE, 6, 0)
    after = credits_summary(organization=a_org)
    assert (after.balance, after.held) == (a_before.balance, 0)
    assert {(c.attempts, c.deferrals) for c in Chunk.objects.filter(job=a)} == {(1, 0)}
    # the breaker never counted A: the worker kept its engine for every tenant, and B ran
    assert breakers_open() == [] and breaker_for(MODEL).failures == 0
    assert result_errors(b) == [None] * 6
    b.refresh_from_db()
    assert (b.status, b.success_rows) == (JobStatus.DONE, 6)


def test_an_engine_that_fails_the_feeds_own_request_too_is_the_engines_failure(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    # given an engine whose every step fails, whatever it holds
    engine_serving(monkeypatch, FeedChat(BrokenLLM()))
    job = job_of(organization_make(), ["hello 0", "hello 1"])
    # when a chunk runs, then it goes back for another worker, no attempt spent, and the
    # breaker counts the engine (as before: a broken engine is not the rows' fault)
    assert chunk_run(chunk_id=chunks_of(job, sent)[0]) == ChunkStatus.PENDING
    chunk = Chunk.objects.get(job=job)
    assert (chunk.attempts, chunk.deferrals, chunk.engine_failures) == (0, 1, 1)
    assert breaker_for(MODEL).failures == 1


def test_a_chunk_that_kills_every_engine_fails_its_job_within_its_attempts(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    # given job A, one chunk whose rows kill the engine they run on, and job B on the
    # same model
    a = job_of(organization_make(), [POISON, POISON])
    b = job_of(organization_make(), [f"hello {i}" for i in range(6)])
    (a_chunk,), b_chunks = chunks_of(a, sent), chunks_of(b, sent)

    def restart() -> FakeLLM:
        """The worker started again: a new engine, no breaker (a new process)."""
        breakers_reset()
        llm = FakeLLM(kills=True)
        engine_serving(monkeypatch, FeedChat(llm))
        return llm

    # when A's chunk runs on a fresh engine, it dies: the engine's benefit of the doubt
    restart()
    assert chunk_run(chunk_id=a_chunk) == ChunkStatus.PENDING
    chunk = Chunk.objects.get(pk=a_chunk)
    assert (chunk.attempts, chunk.deferrals, chunk.engine_failures) == (0, 1, 1)
    # and B's chunk taken meanwhile by the dead engine is not blamed: it never saw the
    # engine answer
    assert chunk_run(chunk_id=b_chunks[0]) == ChunkStatus.PENDING
    bystander = Chunk.objects.get(pk=b_chunks[0])
    assert (bystander.attempts, bystander.deferrals, bystander.engine_failures) == (0, 1, 0)
    # then each time it kills an engine again, after a restart, it spends an attempt, and
    # once they are spent it fails, and with it its job; B runs between, on fresh engines
    outcomes = []
    with finalizes_run(monkeypatch):
        for b_chunk in b_chunks:
            restart()
            outcomes.append(chunk_run(chunk_id=a_chunk))
            restart()
            assert chunk_run(chunk_id=b_chunk) == ChunkStatus.DONE
    assert outcomes == [ChunkStatus.PENDING] * (CHUNK_ATTEMPTS - 1) + [ChunkStatus.FAILED]
    chunk.refresh_from_db()
    assert (chunk.status, chunk.attempts, chunk.deferrals) == (
        ChunkStatus.FAILED, CHUNK_ATTEMPTS, 1)
    a.refresh_from_db()
    assert (a.status, a.failure_reason) == (JobStatus.FAILED, CHUNKS_FAILED)
    b.refresh_from_db()
    assert (b.status, b.success_rows) == (JobStatus.DONE, 6)
