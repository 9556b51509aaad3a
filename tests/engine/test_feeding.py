"""Keeping the engine fed (inference/engines/feed.py) and counting chat rows exactly
(inference/tokens.py), on the real vLLM engine and the local tiny-qwen3 checkpoint.

Several chunks share one running batch; a row the engine refuses still fails alone; a
chunk run again writes the same results; and the estimate's count of a text row is the
prompt_tokens the engine serves it with.
"""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.db import connection
from pytest_django import Settings

from console.models import Organization
from inference.catalog import model_get
from inference.engines import ChatEngine, ChatOutcome, ChatRow, ChatSettings
from inference.rows.chat import template_kwargs
from inference.rows.core import JobOptions
from inference.tokens import checkpoint_tokens
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.services.running import chunk_run, job_start
from jobs.storage import storage_for
from jobs.validation import validate_jsonl
from tests.dispatched import finalizes_run
from tests.factories import input_ready, organization_make

pytest_plugins = ["tests.engine_fixtures"]

OFF = {"enable_thinking": False}
BROKEN = {"type": "json_schema", "json_schema": {"name": "broken", "schema": {
    "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}


def rows_of(count: int, tag: str) -> list[ChatRow]:
    return [ChatRow(messages=[{"role": "user", "content": f"Tell me about {tag} {i}."}],
                    chat_template_kwargs=OFF) for i in range(count)]


def concurrently(engine: ChatEngine, *chunks: list[ChatRow],
                 settings: ChatSettings) -> list[list[ChatOutcome]]:
    """Each chunk from its own thread, as a worker's chunk threads call the engine."""
    results: list[list[ChatOutcome] | None] = [None] * len(chunks)
    failures: list[BaseException] = []

    def run(position: int, rows: list[ChatRow]) -> None:
        try:
            results[position] = engine.generate(rows, settings)
        except BaseException as error:  # reported below, not lost in the thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(i, rows)) for i, rows in enumerate(chunks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    return [result for result in results if result is not None]


def test_two_chunks_share_one_running_batch_and_answer_as_alone(
        chat_engine: ChatEngine) -> None:
    settings = ChatSettings(max_tokens=24)
    first, second = rows_of(48, "apples"), rows_of(48, "pears")
    alone = [chat_engine.generate(first, settings), chat_engine.generate(second, settings)]
    chat_engine.feed.peak_callers = 0
    together = concurrently(chat_engine, first, second, settings=settings)
    # Both chunks' requests were in the engine at once, and greedy answers do not depend
    # on the company a row keeps.
    assert chat_engine.feed.peak_callers >= 2
    assert together == alone


def test_a_refused_row_fails_alone_while_another_chunk_runs(chat_engine: ChatEngine) -> None:
    bad = rows_of(6, "plums")
    bad[3] = ChatRow(messages=bad[3].messages, chat_template_kwargs=OFF,
                     response_format=BROKEN)
    outcomes, others = concurrently(chat_engine, bad, rows_of(32, "figs"),
                                    settings=ChatSettings(max_tokens=16))
    refused = outcomes.pop(3)
    assert refused.error is not None and refused.error.param == "response_format"
    assert all(outcome.error is None and outcome.completion_tokens > 0
               for outcome in outcomes + others)


def test_a_chunk_whose_every_row_fails_the_step_fails_its_rows_not_the_engine(
        chat_engine: ChatEngine) -> None:
    """Issue 40, M6: alone in the engine, a chunk whose every request fails the step (a
    fault injected into the real engine's step whenever a long prompt is in it). The
    feed's own one-token request, a real vLLM request, is answered, so each row fails in
    its row, and the engine serves the next chunk."""
    feed = chat_engine.feed
    engine = chat_engine.llm.llm_engine
    step = engine.step

    def faulty_step() -> Any:
        held = [batch.prompts[position]["prompt_token_ids"]
                for batch, position in feed._waiting.values()]
        if any(len(prompt) > 300 for prompt in held):
            raise RuntimeError("an illegal memory access was encountered")
        return step()

    poisoned = [ChatRow(messages=[{"role": "user", "content": "Repeat: zebra. " * 80}],
                        chat_template_kwargs=OFF) for _ in range(4)]
    engine.step = faulty_step
    try:
        outcomes = chat_engine.generate(poisoned, ChatSettings(max_tokens=8))
        after = chat_engine.generate(rows_of(4, "kiwis"), ChatSettings(max_tokens=8))
    finally:
        engine.step = step
    assert [outcome.error.code if outcome.error else None for outcome in outcomes] == \
        ["engine_error"] * 4
    assert all(outcome.error is None and outcome.completion_tokens > 0 for outcome in after)


@pytest.mark.parametrize("kwargs", [OFF, {}, {"enable_thinking": True,
                                              "reasoning_effort": "low"}])
def test_a_text_rows_estimate_is_the_prompt_the_engine_serves(
        chat_engine: ChatEngine, checkpoint_dirs: dict[str, Path],
        kwargs: dict[str, Any]) -> None:
    conversations: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "Say hello in French."}],
        [{"role": "system", "content": "Answer in one short sentence."},
         {"role": "user", "content": "Name three colours, then\n\ntwo more."}],
        [{"role": "user", "content": [{"type": "text", "text": "Say hello "},
                                      {"type": "text", "text": "in French."}]}],
        [{"role": "user", "content": "What is two plus two?"},
         {"role": "assistant", "content": "<think>\nadd\n</think>\n\nFour."},
         {"role": "user", "content": "Привет, как дела?"}],
    ]
    model = model_get("tiny-qwen3")
    assert model is not None
    lines = b"".join(orjson.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/chat/completions",
                                   "body": {"messages": messages,
                                            "chat_template_kwargs": kwargs}}) + b"\n"
                     for i, messages in enumerate(conversations))
    tokens = checkpoint_tokens(checkpoint_dirs["tiny-qwen3"].resolve())
    report = validate_jsonl(io.BytesIO(lines), JobOptions(model=model.id), count_tokens=tokens)  # type: ignore[arg-type]
    outcomes = chat_engine.generate(
        [ChatRow(messages=messages, chat_template_kwargs=template_kwargs(
            kwargs, reasoning=None, effort=None)) for messages in conversations],
        ChatSettings(max_tokens=1))
    served = [outcome.prompt_tokens for outcome in outcomes]
    assert all(count > 0 for count in served)
    assert report.usage.input_tokens == sum(served)
    assert report.max_input_tokens == max(served)


def test_without_a_template_a_row_is_still_counted_by_its_texts() -> None:
    model = model_get("tiny-qwen3")
    assert model is not None
    line = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": "one two three"}]}})
    report = validate_jsonl(io.BytesIO(line + b"\n"), JobOptions(model=model.id),
                            count_tokens=lambda text: len(text.split()))
    assert report.usage.input_tokens == 3 + 4  # the text, and 4 per message for the template


# -- a job's chunks --------------------------------------------------------------------------

@pytest.fixture
def served(settings: Settings, checkpoint_dirs: dict[str, Path]) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_WORKER_MODELS = ["tiny-qwen3"]
    settings.ANEX_CHUNK_ROWS = 3


def chunk_lines(job: Job, index: int) -> list[dict[str, Any]]:
    with storage_for(job.data_residency).open(chunk_key(job, index)) as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.mark.django_db(transaction=True)
def test_chunks_run_side_by_side_isolate_a_bad_row_and_rerun_idempotently(
        served: None, monkeypatch: pytest.MonkeyPatch) -> None:
    organization: Organization = organization_make()
    bodies = [{"messages": [{"role": "user", "content": f"Name fruit {i}."}],
               "chat_template_kwargs": OFF} for i in range(9)]
    bodies[4]["response_format"] = BROKEN  # refused by the engine as it is added
    content = b"".join(orjson.dumps({"custom_id": f"row-{i}", "method": "POST",
                                     "url": "/v1/chat/completions", "body": body}) + b"\n"
                       for i, body in enumerate(bodies))
    job = Job.objects.create(organization=organization, input=input_ready(organization, content),
                             model="tiny-qwen3", status=JobStatus.IN_PROGRESS,
                             est_cost_cents=500, row_count=9, max_output_tokens=8,
                             reasoning=False)
    job_start(job_id=job.pk)
    chunks = list(Chunk.objects.filter(job=job).order_by("index"))
    assert len(chunks) == 3
    # Two chunks from two threads at once, as a worker's threads run them.
    def run(chunk_id: Any) -> None:
        try:
            chunk_run(chunk_id=chunk_id)
        finally:
            connection.close()  # each thread's own connection, as a worker thread's

    threads = [threading.Thread(target=run, args=(chunk.pk,)) for chunk in chunks[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    middle = chunk_lines(job, 1)
    assert [row["outcome"] for row in middle].count("error") == 1
    assert middle[1]["id"] == "row-4" and middle[1]["error"]["param"] == "response_format"
    # A redelivered chunk overwrites its own results: same rows, same answers, once.
    before = chunk_lines(job, 0)
    Chunk.objects.filter(pk=chunks[0].pk).update(status=ChunkStatus.PENDING)
    assert chunk_run(chunk_id=chunks[0].pk) == ChunkStatus.DONE
    again = chunk_lines(job, 0)
    assert [row["i"] for row in again] == [0, 1, 2]
    assert [row["body"]["choices"] for row in again] == [row["body"]["choices"]
                                                        for row in before]
    with finalizes_run(monkeypatch):  # the last chunk's finalize, on a CPU worker
        assert chunk_run(chunk_id=chunks[2].pk) == ChunkStatus.DONE
    finished = Job.objects.get(pk=job.pk)
    assert finished.status == JobStatus.DONE
    assert (finished.success_rows or 0) + (finished.truncated_rows or 0) == 8
    assert finished.error_rows == 1
