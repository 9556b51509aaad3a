"""Issue 43, item 2: rows of a chunk that are one request run once; each copy is its own
row, its own line and custom_id, billed as every row is; a chat row that asked for
sampling is never merged. And item 3's cached tokens as a row reports them.

The rows run through the real chunk path (jobs.services.running.execute, the kind's serve,
the meter) with only the engine faked: it counts what it was handed and answers each row
from its own text, so a copy served from the wrong row would show."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.catalog import model_get
from inference.engines import (
    ChatOutcome,
    ChatRow,
    ChatSettings,
    DecisionOutcome,
    DecisionRow,
    EmbedOutcome,
    EmbedRow,
    RowError,
)
from inference.kinds import kind_named
from inference.kinds.base import InputRow, TaskKind
from inference.kinds.identical import body_digest
from inference.pricing import REPORTED, Usage, price, usage_from_json
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.estimation import job_estimate
from jobs.services.running import chunk_run, execute, job_start
from jobs.storage import storage_for
from tests.dispatched import dispatch_catch, finalizes_run
from tests.factories import input_ready
from tests.servers import LocalServer, reply, tls_context

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
PROMPT, CACHED = 20, 6  # what the fake engine reads of each row, and found cached


def text_of(messages: list[dict[str, Any]]) -> str:
    content = messages[-1]["content"]
    return content if isinstance(content, str) else content[0]["text"]


@dataclass
class FakeChat:
    """Answers each row with its own text; counts the rows it was handed. A row whose text
    is "refuse" is refused, as a model refuses a row."""

    prompt_tokens: int = PROMPT
    output_tokens: int = 3
    calls: list[list[ChatRow]] = field(default_factory=list)

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        self.calls.append(rows)
        return [ChatOutcome.failed(RowError.invalid_request("refused", param="messages"))
                if text_of(row.messages) == "refuse" else
                ChatOutcome(content=f"answer to {text_of(row.messages)}", reasoning=None,
                            finish_reason="stop", prompt_tokens=self.prompt_tokens,
                            completion_tokens=self.output_tokens, reasoning_tokens=0,
                            cached_tokens=CACHED)
                for row in rows]

    @property
    def rows(self) -> int:
        return sum(map(len, self.calls))


@dataclass
class FakeEmbed:
    calls: list[list[EmbedRow]] = field(default_factory=list)

    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]:
        self.calls.append(rows)
        return [EmbedOutcome(vector=[1.0, float(len(str(row.text)))], prompt_tokens=7)
                for row in rows]


@dataclass
class FakeDecide:
    calls: list[list[DecisionRow]] = field(default_factory=list)

    def decide(self, rows: list[DecisionRow]) -> list[DecisionOutcome]:
        self.calls.append(rows)
        return [DecisionOutcome(answers={name: {"answer": str(row.state)}
                                         for name in row.questions},
                                input_tokens=11, routing={"model": "laya", "reason": "x"})
                for row in rows]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    def install(engine: Any) -> Any:
        monkeypatch.setattr("inference.kinds.engines.engine_cached",
                            lambda model_id, kind: engine)
        return engine
    return install


def job_of(organization: Organization, model: str, task: str, **fields: Any) -> Job:
    return Job.objects.create(organization=organization, model=model, task_type=task,
                              status=JobStatus.IN_PROGRESS, **fields)


def chat(index: int, text: str, **settings: Any) -> InputRow:
    return InputRow(index, f"r{index}",
                    {"messages": [{"role": "user", "content": text}], **settings})


def usages(results: list[dict[str, Any]]) -> list[Usage]:
    return [usage_from_json(item["usage"]) for item in results]


# -- chat ------------------------------------------------------------------------------------

def test_identical_chat_rows_run_once_and_each_copy_is_its_own_billed_line(
        organization: Organization, fake: Callable[[Any], Any]) -> None:
    engine = fake(FakeChat())
    # given a chunk where r0, r2 and r3 are one request (r3's keys in another order)
    rows = [chat(0, "alpha"), chat(1, "beta"), chat(2, "alpha"),
            InputRow(3, "r3", {"messages": [{"content": "alpha", "role": "user"}]})]
    # when it runs
    results, usage = execute(job_of(organization, "gemma4-12b", "chat",
                                     max_output_tokens=8), rows)
    # then the engine ran two rows, and every row has its own line in its place
    assert [[text_of(row.messages) for row in call] for call in engine.calls] \
        == [["alpha", "beta"]]
    assert [item["id"] for item in results] == ["r0", "r1", "r2", "r3"]
    assert [item["i"] for item in results] == [0, 1, 2, 3]
    assert [item["output"] for item in results] == ["answer to alpha", "answer to beta",
                                                    "answer to alpha", "answer to alpha"]
    assert len({item["body"]["id"] for item in results}) == 4  # chatcmpl-…-{row index}
    # each billed as a row that ran: the same prompt and output; a copy computed none of
    # its prompt, so all of it is cached
    details = [item["body"]["usage"] for item in results]
    assert [d["prompt_tokens"] for d in details] == [PROMPT] * 4
    assert [d["completion_tokens"] for d in details] == [3] * 4
    assert [d["prompt_tokens_details"]["cached_tokens"] for d in details] \
        == [CACHED, CACHED, PROMPT, PROMPT]
    billed = Usage(input_tokens=PROMPT, output_tokens=3)
    assert usages(results) == [
        billed + Usage(cached_input_tokens=CACHED),
        billed + Usage(cached_input_tokens=CACHED),
        billed + Usage(cached_input_tokens=PROMPT, merged_rows=1),
        billed + Usage(cached_input_tokens=PROMPT, merged_rows=1)]
    assert usage == Usage(input_tokens=4 * PROMPT, output_tokens=12,
                          cached_input_tokens=2 * CACHED + 2 * PROMPT, merged_rows=2)


@pytest.mark.parametrize(("sampling", "merged"), [
    ({"temperature": 0.7}, False),
    ({"temperature": 1, "seed": None}, False),
    ({"temperature": "warm"}, False),
    ({"temperature": 0.7, "seed": 42}, True),
    ({"temperature": 0}, True),
    ({"seed": 3}, True),
])
def test_a_row_that_asked_for_sampling_without_a_seed_is_never_merged(
        organization: Organization, fake: Callable[[Any], Any], sampling: dict[str, Any],
        merged: bool) -> None:
    engine = fake(FakeChat())
    rows = [chat(0, "alpha", **sampling), chat(1, "alpha", **sampling),
            chat(2, "alpha", **sampling)]
    results, usage = execute(job_of(organization, "gemma4-12b", "chat",
                                     max_output_tokens=8), rows)
    assert engine.rows == (1 if merged else 3)
    assert usage.merged_rows == (2 if merged else 0)
    assert [item["id"] for item in results] == ["r0", "r1", "r2"]
    assert usage.input_tokens == 3 * PROMPT


def test_a_copy_of_a_refused_row_is_refused_the_same_way(
        organization: Organization, fake: Callable[[Any], Any]) -> None:
    engine = fake(FakeChat())
    rows = [chat(0, "refuse"), chat(1, "ok"), chat(2, "refuse")]
    results, usage = execute(job_of(organization, "gemma4-12b", "chat",
                                     max_output_tokens=8), rows)
    assert engine.rows == 2
    assert [item["outcome"] for item in results] == ["error", "success", "error"]
    assert results[0]["error"] == results[2]["error"] == {
        "message": "refused", "type": "invalid_request_error", "code": None,
        "param": "messages"}
    assert results[2]["status_code"] == results[0]["status_code"] == 400
    # A failed row bills nothing, copy or not (its usage counts it merged, priced at nothing).
    assert usages(results)[2].is_empty
    assert usage == Usage(input_tokens=PROMPT, output_tokens=3, cached_input_tokens=CACHED,
                          merged_rows=1)


def test_a_copy_of_a_media_row_is_neither_fetched_nor_run_and_fails_with_it(
        organization: Organization, fake: Callable[[Any], Any],
        make_server: Callable[..., LocalServer], ca: Any, trust_ca: None,
        loopback: None) -> None:
    engine = fake(FakeChat())
    host = make_server(tls=tls_context(ca, "127.0.0.1"))
    host.routes["/gone.png"] = lambda handler: reply(handler, 404, b"no")

    def pictured(index: int, path: str) -> InputRow:
        return InputRow(index, f"r{index}", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": host.url(path)}}]}]})

    rows = [pictured(0, "/gone.png"), pictured(1, "/gone.png")]
    results, usage = execute(job_of(organization, "gemma4-12b", "chat",
                                     max_output_tokens=8), rows)
    assert engine.rows == 0
    assert [item["outcome"] for item in results] == ["error", "error"]
    assert results[0]["error"] == results[1]["error"]
    assert results[1]["error"]["type"] == "media_fetch_error"
    assert [seen.path for seen in host.requests] == ["/gone.png"]  # the first row's only
    assert usage.is_empty and usage.merged_rows == 1


def test_a_media_rows_cached_tokens_are_held_within_the_prompt_it_is_billed_for(
        organization: Organization, fake: Callable[[Any], Any]) -> None:
    # The engine reads an image as 5 tokens, the catalog bills 256 (gemma4-12b): a copy's
    # cached tokens are its billed prompt, never the engine's count.
    from tests.media import data_uri, picture

    fake(FakeChat(prompt_tokens=25))
    part = {"type": "image_url", "image_url": {"url": data_uri(picture((255, 0, 0)),
                                                               "image/png")}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]}
    results, _usage = execute(job_of(organization, "gemma4-12b", "chat", max_output_tokens=8),
                              [InputRow(0, "r0", body), InputRow(1, "r1", body)])
    first, copy = (item["body"]["usage"] for item in results)
    assert first["prompt_tokens"] == copy["prompt_tokens"] > 25
    assert first["prompt_tokens_details"]["cached_tokens"] == CACHED
    assert copy["prompt_tokens_details"]["cached_tokens"] == copy["prompt_tokens"]


# -- embeddings and decisions ----------------------------------------------------------------

def test_identical_embedding_rows_are_embedded_once(
        organization: Organization, fake: Callable[[Any], Any]) -> None:
    engine = fake(FakeEmbed())
    rows = [InputRow(0, "a", {"input": "some text"}), InputRow(1, "b", {"input": "other"}),
            InputRow(2, "c", {"input": "some text"}),
            InputRow(3, "d", {"input": "some text", "dimensions": 2})]
    results, usage = execute(job_of(organization, "all-minilm-l6-v2", "embed"), rows)
    assert [row.text for call in engine.calls for row in call] \
        == ["some text", "other", "some text"]  # another width is another request
    assert [item["id"] for item in results] == ["a", "b", "c", "d"]
    assert results[2]["body"] == results[0]["body"]
    # An embeddings body's usage has no details (OpenAI's has none): nothing cached reported.
    assert results[2]["body"]["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert usage == Usage(input_tokens=28, merged_rows=1)


def test_identical_decision_rows_are_decided_once(
        organization: Organization, fake: Callable[[Any], Any]) -> None:
    engine = fake(FakeDecide())
    body = {"state": "the text", "questions": {"q": {"type": "bool", "text": "Is it?"}}}
    rows = [InputRow(0, "a", body), InputRow(1, "b", {**body, "state": "another"}),
            InputRow(2, "c", json.loads(json.dumps(body)))]
    results, usage = execute(job_of(organization, "laya", "decide"), rows)
    assert [row.state for call in engine.calls for row in call] == ["the text", "another"]
    assert [item["id"] for item in results] == ["a", "b", "c"]
    assert results[2]["body"] == results[0]["body"]
    assert usage == Usage(input_tokens=33, merged_rows=1)


def test_a_body_is_one_request_whatever_its_key_order_and_none_that_json_cannot_write(
) -> None:
    assert body_digest({"a": 1, "b": [1, {"y": 2, "x": 3}]}) \
        == body_digest({"b": [1, {"x": 3, "y": 2}], "a": 1})
    assert body_digest({"a": 1}) != body_digest({"a": 1.0})  # never merged by a guess
    assert body_digest({"a": float("nan")}) is None
    assert body_digest({"a": object()}) is None
    kind = kind_named("chat")
    assert kind.merge_key(None, {"messages": [], "temperature": 0.5}) is None  # type: ignore[arg-type]


# -- the whole job: the charge is the estimate's rule ----------------------------------------

ROWS = 60


def lines(texts: list[str]) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": text}]}}).encode() + b"\n"
        for i, text in enumerate(texts))


def job_run(api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
            content: bytes, engine: FakeChat) -> Job:
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "max_output_tokens": engine.output_tokens}, format="json")
    assert response.status_code == 200, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    engine.prompt_tokens = (job.est_input_tok or 0) // ROWS
    assert engine.prompt_tokens * ROWS == job.est_input_tok  # every row counts alike
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    monkeypatch.setattr("inference.kinds.engines.engine_cached", lambda model_id, kind: engine)
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    assert job_start(job_id=job.pk) == Chunk.objects.filter(job=job).count() >= 2
    with finalizes_run(monkeypatch):
        for chunk_id in sent:
            chunk_run(chunk_id=chunk_id)
    return Job.objects.get(pk=job.pk)


def result_lines(job: Job) -> list[dict[str, Any]]:
    with storage_for(job.data_residency).open(job.result_key) as stream:
        out = [json.loads(line) for line in stream.read().splitlines()]
    for line in out:  # when each was written is not what is compared
        line["response"]["body"].pop("created")
    return out


def test_a_job_with_repeated_rows_is_charged_its_estimate_as_one_without_merging(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        settings: Settings, checkpoints: Path) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = 20
    # given 60 rows of three questions (of one length), each repeated 20 times, interleaved
    texts = [f"Question {'ABC'[i % 3]}: what is it?" for i in range(ROWS)]
    model = model_get("gemma4-12b")
    assert model is not None
    # when it runs, and again with no row ever merged
    merged_engine = FakeChat(output_tokens=4)
    merged = job_run(api, organization, monkeypatch, lines(texts), merged_engine)
    monkeypatch.setattr(TaskKind, "merge_key", lambda self, job, body: None)
    plain_engine = FakeChat(output_tokens=4)
    plain = job_run(api, organization, monkeypatch, lines(texts), plain_engine)
    # then each chunk ran each question once, and the rest were copies
    assert plain_engine.rows == ROWS
    assert merged_engine.rows < ROWS
    usage = usage_from_json(merged.usage or {})
    assert merged_engine.rows + usage.merged_rows == ROWS
    # charged the estimate, exactly as the same job with every row run
    assert merged.status == plain.status == JobStatus.DONE
    assert merged.cost_cents == merged.est_cost_cents == plain.cost_cents \
        == price(model, usage).cents
    billed = {name: value for name, value in (merged.usage or {}).items()
              if name not in REPORTED}
    assert billed == {name: value for name, value in (plain.usage or {}).items()
                      if name not in REPORTED}
    assert usage.input_tokens == merged.est_input_tok
    # and its result is the same file, row for row, but for what each row found cached
    ours, theirs = result_lines(merged), result_lines(plain)
    assert [line["custom_id"] for line in ours] == [f"r{i}" for i in range(ROWS)]
    for line in ours + theirs:
        line["response"]["body"]["usage"].pop("prompt_tokens_details")
        line["response"]["body"]["id"] = line["response"]["body"]["id"].rsplit("-", 1)[1]
    assert ours == theirs
