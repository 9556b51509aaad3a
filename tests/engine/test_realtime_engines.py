"""The realtime API on its real engines: a realtime engine server (manage.py serve_realtime)
started once for the session with MiniLM and laya warm, the official `openai` package
pointed at /realtime/v1, vectors compared with a batch job's and with sentence-transformers
run directly on the same checkpoint, and decisions answered (or refused) by the model."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings as django_settings
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from inference.checkpoints import anex_checkpoints_value
from realtime.models import RealtimeUsage
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import api_key_make, input_ready, organization_make
from tests.launch import Running
from tests.workers import fresh_worker

MINILM = "all-minilm-l6-v2"
EMBED, DECIDE = "/realtime/v1/embeddings", "/realtime/v1/systemone"
TEXTS = ["a search query", "We were billed twice for March. Please refund it today.",
         "  leading and trailing spaces, and a line break\n"]
TICKET = {
    "model": "laya",
    "state": {"body": "We were billed twice for March. Please refund it today."},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "invoices, payments, refunds",
                              "technical": "bugs and outages", "other": "everything else"}},
        "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
        "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                        "criteria": ["calm", "annoyed", "angry"]}}}


# What the web tier and the engine server share (serve_realtime refuses to start without).
ENGINE_SECRET = "engine-test-secret-of-32-characters"


@pytest.fixture(scope="session")
def realtime_server(checkpoint_dirs: dict[str, Path],  # noqa: F811
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One realtime engine server for the session, as `make run` starts it: the engines
    load once, then every test's requests reach them warm."""
    log = tmp_path_factory.mktemp("realtime") / "serve.log"
    env = {**os.environ, "ANEX_CHECKPOINTS": anex_checkpoints_value(checkpoint_dirs),
           "ANEX_REALTIME_ENGINE_SECRET": ENGINE_SECRET}
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"),
             "serve_realtime", "--model", MINILM, "--model", "laya"],
            stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=django_settings.BASE_DIR)
    assert process.stdout is not None
    url = None
    for line in process.stdout:  # the announcement comes once both engines answer
        if line.startswith(b'{"listening"'):
            url = json.loads(line)["listening"]
            break
    if url is None:
        process.wait(30)
        pytest.fail(f"serve_realtime did not start:\n{log.read_text()[-3000:]}")
    # Whatever else reaches its stdout is read, so a full pipe never stalls the server.
    threading.Thread(target=process.stdout.read, daemon=True).start()
    yield url
    process.terminate()
    process.wait(30)


@pytest.fixture
def realtime(settings: Settings, realtime_server: str,
             checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"],
                                 MINILM: checkpoint_dirs["minilm"],
                                 "laya": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_REALTIME_ENGINES = {MINILM: realtime_server, "laya": realtime_server}
    settings.ANEX_REALTIME_ENGINE_SECRET = ENGINE_SECRET


def cosine(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


def unit_prefix(vector: list[float], width: int) -> list[float]:
    """Matryoshka: the first `width` values, normalised (the reference's dimensions)."""
    cut = vector[:width]
    norm = math.sqrt(math.fsum(x * x for x in cut))
    return [x / norm for x in cut]


@pytest.mark.django_db(transaction=True)
def test_the_openai_sdk_lists_models_and_embeds_unchanged(
        realtime: None, live_server: Any, checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    client = OpenAI(base_url=f"{live_server.url}/realtime/v1", api_key=plaintext)

    listed = {model.id: model for model in client.models.list()}
    assert {MINILM, "laya", "tiny-qwen3"} <= set(listed)
    minilm = listed[MINILM].model_dump()
    assert (minilm["object"], minilm["task"], minilm["realtime"], minilm["local"]) == (
        "model", "embed", True, True)
    assert listed["laya"].model_dump()["task"] == "decide"

    # The SDK's own defaults (it asks for base64 and reads floats as they come).
    single = client.embeddings.create(model=MINILM, input=TEXTS[0])
    assert len(single.data) == 1 and len(single.data[0].embedding) == 384
    assert single.usage.prompt_tokens > 0
    several = client.embeddings.create(model=MINILM, input=TEXTS, dimensions=64,
                                       encoding_format="float")
    assert [item.index for item in several.data] == [0, 1, 2]

    local = SentenceTransformer(str(checkpoint_dirs["minilm"]), device="cpu")
    reference = [list(map(float, v)) for v in local.encode(TEXTS, normalize_embeddings=True)]
    assert math.isclose(math.fsum(x * x for x in single.data[0].embedding), 1.0, rel_tol=1e-6)
    assert cosine(single.data[0].embedding, reference[0]) >= 0.9999
    for item, expected in zip(several.data, reference, strict=True):
        assert len(item.embedding) == 64
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-6)
        assert cosine(item.embedding, unit_prefix(expected, 64)) >= 0.9999

    usage = RealtimeUsage.objects.filter(organization=organization)
    assert usage.count() == 2
    assert sorted(usage.values_list("input_tokens", flat=True)) == sorted(
        [single.usage.prompt_tokens, several.usage.prompt_tokens])

    # A caller who asks for base64 gets OpenAI's base64 (little-endian float32) as it is.
    asked = client.embeddings.create(model=MINILM, input=TEXTS[0], encoding_format="base64")
    raw = base64.b64decode(asked.data[0].embedding)  # type: ignore[arg-type]  # a str here
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == 384
    assert all(math.isclose(a, b, abs_tol=1e-6)
               for a, b in zip(decoded, single.data[0].embedding, strict=True))


def batch_vectors(api: APIClient, until: Callable[..., None], input_id: str,
                  width: int) -> dict[str, list[float]]:
    """A batch embedding job on the input at this width, run to its result: vectors by row."""
    job = api.post("/batch/v1/jobs", {"input_id": input_id, "model": MINILM,
                                      "dimensions": width}, format="json").json()

    def status() -> str:
        return str(api.get(f"/batch/v1/jobs/{job['id']}").json()["status"])

    until(lambda: status() in ("cost_ready", "failed"))
    assert api.post(f"/batch/v1/jobs/{job['id']}/approve").status_code == 200
    until(lambda: status() in ("done", "failed", "cancelled"))
    assert status() == "done"
    link = api.get(f"/batch/v1/jobs/{job['id']}/result").json()["result_url"]
    rows = [json.loads(line) for line in requests.get(link, timeout=30).text.splitlines()]
    return {row["custom_id"]: row["response"]["body"]["data"][0]["embedding"] for row in rows}


@pytest.mark.django_db(transaction=True)
def test_realtime_vectors_match_a_batch_job_of_the_same_texts_and_width(
        realtime: None, settings: Settings, live_server: Any) -> None:
    settings.ANEX_WORKER_MODELS = [MINILM]
    settings.ANEX_API_ORIGIN = live_server.url  # the result link is served by the test server
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    rows = b"".join(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": text}}).encode() + b"\n"
                    for i, text in enumerate(TEXTS))
    item = input_ready(organization, rows)
    with fresh_worker() as until:
        batch = {width: batch_vectors(api, until, str(item.pk), width) for width in (64, 384)}
    for width in (64, 384):
        answer = api.post(EMBED, {"model": MINILM, "input": TEXTS, "dimensions": width},
                          format="json").json()
        for index, text in enumerate(TEXTS):
            realtime_vector = answer["data"][index]["embedding"]
            assert cosine(realtime_vector, batch[width][f"e{index}"]) >= 0.9999, text


@pytest.mark.django_db
def test_a_decision_is_answered_by_the_warm_model_and_billed(realtime: None,
                                                             api: APIClient) -> None:
    response = api.post(DECIDE, TICKET, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["model"] == "laya"
    answers = body["answers"]
    assert list(answers) == ["team", "urgent", "frustration"]
    assert answers["team"]["choice"] in TICKET["questions"]["team"]["criteria"]  # type: ignore[index]
    assert math.isclose(sum(answers["team"]["probabilities"].values()), 1.0, abs_tol=1e-3)
    assert 0.0 <= answers["urgent"]["noul"] <= 1.0
    assert answers["frustration"]["legend"] == {"0": "calm", "1": "annoyed", "2": "angry"}
    assert body["routing"]["model"] == "english"
    assert body["usage"]["output_tokens"] == 0 and body["usage"]["input_tokens"] > 0
    assert RealtimeUsage.objects.get().input_tokens == body["usage"]["input_tokens"]


@pytest.mark.django_db
def test_a_question_the_model_refuses_is_422_naming_it_and_bills_nothing(
        realtime: None, api: APIClient, organization: Any) -> None:
    before = credits_summary(organization=organization)
    bad = {**TICKET, "questions": {**TICKET["questions"],  # type: ignore[dict-item]
                                   "refund": {"type": "noul", "instructions": "Refund?",
                                              "criteria": {"maybe": "not sure"}}}}
    response = api.post(DECIDE, bad, format="json")
    assert response.status_code == 422
    assert response.json()["detail"].startswith("Question 'refund' is a noul")
    assert not RealtimeUsage.objects.exists()
    assert credits_summary(organization=organization) == before


@pytest.mark.django_db
def test_an_input_longer_than_the_models_context_is_400_naming_it(
        realtime: None, realtime_server: str, api: APIClient) -> None:
    served = engine_requests(realtime_server)
    response = api.post(EMBED, {"model": MINILM, "input": ["short", "word " * 400]},
                        format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("input[1]: This row is")
    assert "256-token context" in response.json()["detail"]
    assert not RealtimeUsage.objects.exists()
    # Refused by the web tier's own count: the engine read neither input.
    assert engine_requests(realtime_server) == served


def engine_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as response:  # noqa: S310
        return int(json.loads(response.read())["models"][MINILM]["requests"])


def readme_block(name: str) -> str:
    """The README's `<!-- realtime:NAME -->` code block, as a newcomer copies it."""
    readme = (Path(django_settings.BASE_DIR) / "README.md").read_text()
    found = re.search(rf"<!-- realtime:{name} -->\n```\w+\n(.*?)```", readme, re.DOTALL)
    assert found is not None, name
    return found.group(1)


@pytest.mark.timeout(600)
def test_make_run_serves_realtime_on_a_bare_environment(make_run: Running) -> None:
    # given `make run` with nothing but a port and a run directory (its own PostgreSQL and
    # Redis), and the session's local checkpoints: the session's one (tests/launch.py)
    port, env, log = make_run.port, make_run.env, make_run.log
    # when its realtime engines have loaded
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline and "realtime API" not in log.read_text():
        assert make_run.launcher.poll() is None, log.read_text()[-4000:]
        time.sleep(0.5)
    output = log.read_text()
    assert "realtime API" in output, output[-4000:]
    key = re.search(r"demo API key\s+(sk-\S+)", output)
    assert key is not None, output[-4000:]
    # then the README's realtime examples run as printed against it
    python = readme_block("python").replace('api_key="sk-..."', f'api_key="{key[1]}"')
    python = python.replace("localhost:8000", f"localhost:{port}")
    done = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr + log.read_text()[-4000:]
    listed, vector = done.stdout.splitlines()
    assert "('all-minilm-l6-v2', 'embed', True)" in listed
    assert "('laya', 'decide', True)" in listed and "('tiny-qwen3', 'chat', False)" in listed
    assert len(json.loads(vector)) == 4
    bash = readme_block("bash").replace("localhost:8000", f"localhost:{port}")
    done = subprocess.run([shutil.which("bash") or "/bin/bash", "-euo", "pipefail", "-c",
                           bash], capture_output=True,
                          text=True, timeout=120, check=False, env={**env, "TOKEN": key[1]})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["model"] == "laya" and 0 <= answer["answers"]["urgent"]["noul"] <= 1
