"""Issue 40, L14: a realtime decision whose engine step fails on one question fails closed,
as its batch row does (docs/dev/decisions/2026-12-02-failure-classes-and-the-breaker.md, "A failed
engine step"): the request is 502 naming the question, no question is answered, nothing is billed
and nothing stays reserved; another request answered in the same engine call is answered and billed.

The decision engine here is the real one (DecisionEngine: its questions, prompts, scoring
and outcomes; DecideKind's realtime_run and reply) behind the real engine server and the
web tier's client, signed; only its vLLM feed is a stand-in, whose step fails on any
prompt reading the poisoned question, as feed.py delivers a request that failed in its
batch and again alone (RequestFailed in its slot).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from pytest_django import Settings
from rest_framework.test import APIClient
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from billing.services import credits_summary
from console.models import ApiKey, Organization
from inference.catalog import model_get
from inference.checkpoints import CHAT_TEMPLATE, SPECIAL_TOKENS
from inference.engines.decisions import LABELS, DecisionEngine, _Reader
from inference.engines.feed import RequestFailed
from inference.kinds.decide import DecideKind
from inference.tokens import checkpoint_tokens
from realtime.concurrency import reservations_in_flight, slots_in_flight
from realtime.models import RealtimeUsage
from realtime.selectors import realtime_frozen_forget
from realtime.services.admission import realtime_credits_forget
from realtime.serving import Batcher, EngineServer, Served

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                       reason="chat templates come with the engines (make install-cpu)"),
]
DECIDE = "/realtime/v1/systemone"
SECRET = "a-secret-the-web-tier-and-its-engines-share"
POISON = "Which colour is the invoice?"  # the question the engine's step fails on
CORPUS = ["Read the text, then answer the question about it with the label of exactly one "
          "option. Text: We were billed twice for March. Question: Does the customer need "
          "an answer today? Options: A. yes B. no Answer with the label of one option.",
          POISON, "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_start|>assistant"
          ] * 20


class HFTokenizer:
    """The slice of a Hugging Face tokenizer DecisionEngine uses, over tokenizer.json."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))


class StepFailsOn:
    """A decision engine's feed: a logprob per label for every prompt, except that the step
    fails on any prompt reading `poison` (in its batch and again alone: RequestFailed)."""

    def __init__(self, tokenizer: HFTokenizer, poison: str) -> None:
        self.tokenizer = tokenizer
        self.poison = poison
        self.prompts = 0

    def run(self, prompts: list[dict[str, Any]], params: list[Any]) -> list[Any]:
        results: list[Any] = []
        for prompt, param in zip(prompts, params, strict=True):
            self.prompts += 1
            if self.poison in self.tokenizer.decode(prompt["prompt_token_ids"]):
                results.append(RequestFailed("RuntimeError: an illegal memory access"))
                continue
            logprobs = {token: types.SimpleNamespace(logprob=-1.0 - index)
                        for index, token in enumerate(param.logprob_token_ids)}
            results.append(types.SimpleNamespace(
                outputs=[types.SimpleNamespace(logprobs=[logprobs])]))
        return results


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A decision checkpoint's tokenizer and chat template, made here (no weights)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory = tmp_path_factory.mktemp("laya")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE}))
    return directory


@pytest.fixture
def feed(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> StepFailsOn:
    # Only SamplingParams is read of vLLM (the stand-in feed reads what it carries).
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(
        SamplingParams=lambda **kwargs: types.SimpleNamespace(**kwargs)))
    return StepFailsOn(HFTokenizer(Tokenizer.from_file(str(checkpoint / "tokenizer.json"))),
                       POISON)


@pytest.fixture
def engine_server(settings: Settings, checkpoint: Path, feed: StepFailsOn,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineServer]:
    """laya's realtime engine server, its engine the real DecisionEngine on the stand-in
    feed, and the web tier pointed at it (its tokenizer there too, so requests are counted
    and reserved exactly)."""
    tokens = checkpoint_tokens(checkpoint)
    assert tokens is not None and tokens.template is not None
    labels = [(label, ids[0]) for label in LABELS
              if len(ids := feed.tokenizer.encode(label)) == 1]
    reader = _Reader(llm=None, feed=feed, tokenizer=feed.tokenizer, tokens=tokens,  # type: ignore[arg-type]
                     labels=labels, max_model_len=2048)
    monkeypatch.setattr(DecisionEngine, "_reader", lambda self, path: reader)
    model = model_get("laya")
    assert model is not None
    kind = DecideKind()
    engine = kind.engine_build(model, checkpoint)
    served = {"laya": Served(model_id="laya", kind=kind, load_seconds=0.0, batcher=Batcher(
        "laya", lambda rows: kind.realtime_run(engine, rows), kind.realtime_batch_rows))}
    server = EngineServer(("127.0.0.1", 0), served, secret=SECRET)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    settings.ANEX_REALTIME_ENGINE_SECRET = SECRET
    settings.ANEX_REALTIME_ENGINES = {"laya": (server.url,)}
    settings.ANEX_CHECKPOINTS = {"laya": checkpoint}
    realtime_frozen_forget()
    realtime_credits_forget()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def noul(instructions: str) -> dict[str, str]:
    return {"type": "noul", "instructions": instructions}


QUESTIONS = {"urgent": noul("Does the customer need an answer today?"),
             "refund": noul("Does the customer ask for a refund?")}
GOOD: dict[str, Any] = {"model": "laya", "state": "We were billed twice for March.",
                        "questions": QUESTIONS}
POISONED = {**GOOD, "questions": {**QUESTIONS, "colour": noul(POISON)}}


def test_a_decision_whose_step_fails_on_one_question_fails_closed_and_bills_nothing(
        engine_server: EngineServer, feed: StepFailsOn, api: APIClient,
        organization: Organization) -> None:
    before = credits_summary(organization=organization)
    # when a request of three questions reaches an engine whose step fails on the third
    response = api.post(DECIDE, POISONED, format="json")
    # then the engine was asked every question (it did the others' work) ...
    assert feed.prompts == 3
    # ... and the request is 502 naming the question: none is answered, nothing billed
    assert response.status_code == 502, response.content
    body = response.json()
    assert set(body) == {"detail"}
    assert body["detail"].startswith(
        "The decision service failed on question 'colour' of this request (the model failed "
        "on it, and again when it was run alone), so no question was answered and nothing "
        "was billed. Retry;")
    assert not RealtimeUsage.objects.exists()
    assert credits_summary(organization=organization) == before
    assert slots_in_flight(organization_id=organization.pk) == 0
    assert reservations_in_flight(organization_id=organization.pk) == 0
    # and the same questions without the failing one are answered and billed
    answered = api.post(DECIDE, GOOD, format="json")
    assert answered.status_code == 200, answered.content
    assert set(answered.json()["answers"]) == {"urgent", "refund"}
    usage = RealtimeUsage.objects.get()
    assert usage.input_tokens == answered.json()["usage"]["input_tokens"] > 0


def test_another_request_in_the_same_engine_call_is_answered_and_billed(
        engine_server: EngineServer, feed: StepFailsOn, organization: Organization,
        key_pair: tuple[ApiKey, str], settings: Settings) -> None:
    # given the engine holding its first call until both requests wait, so they are
    # answered by one engine call
    settings.ANEX_REALTIME_PROCESS_CONCURRENCY = 4
    batcher = engine_server.served["laya"].batcher
    run, gate = batcher.run, threading.Event()

    def held(rows: list[Any]) -> list[Any]:
        gate.wait(30)
        return run(rows)

    batcher.run = held
    _, plaintext = key_pair

    def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            response = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}").post(
                DECIDE, body, format="json")
            return response.status_code, response.json()
        finally:
            connection.close()

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, GOOD)  # taken alone, held at the gate
        while batcher.calls == 0:
            threading.Event().wait(0.01)
        poisoned, good = pool.submit(post, POISONED), pool.submit(post, GOOD)
        while batcher.queued < 2:
            threading.Event().wait(0.01)
        gate.set()
        results = [first.result(30), poisoned.result(30), good.result(30)]
    # then the poisoned request failed alone: both others were answered and billed
    assert [status for status, _ in results] == [200, 502, 200]
    assert batcher.calls == 2 and batcher.requests == 3
    assert RealtimeUsage.objects.count() == 2
