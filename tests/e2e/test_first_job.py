"""The newcomer's first hour, against a real `make run` (its launcher, its embedded
PostgreSQL and Redis, gunicorn, a Dramatiq worker and the clock):

- the README's first-job walkthrough, in bash and in Python, runs as printed: a chat job
  with only `model` set is estimated, approved and done, and every row has an answer;
- a command run beside it through the same launcher (`make manage`) attaches to its
  services and leaves them running.

The local checkpoints come from the session's engine fixture (trained once per session)
rather than from `make run`'s own build, which tests/engine/test_engines_checkpoints.py
covers. The `make run` is the session's one (tests/launch.py), shared with test_cli_e2e.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.launch import Running

pytest_plugins = ["tests.engine_fixtures"]

ROOT = Path(__file__).resolve().parents[2]


def healthz(port: int) -> tuple[int, str]:
    try:
        response = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except requests.RequestException as exc:
        return 0, str(exc)
    return response.status_code, response.text


def readme_block(name: str) -> str:
    """The code block the README marks `<!-- first-job:NAME -->`; the docs index carries the
    same one, so what a newcomer copies from either is what this test runs."""
    pattern = re.compile(rf"<!-- first-job:{name} -->\n```\w+\n(.*?)```", re.DOTALL)
    readme = pattern.search((ROOT / "README.md").read_text())
    index = pattern.search((ROOT / "docs" / "index.md").read_text())
    assert readme is not None and index is not None, name
    assert readme.group(1) == index.group(1), f"README and docs/index.md differ on {name}"
    return readme.group(1)


def json_stream(text: str) -> list[dict[str, Any]]:
    """What the bash walkthrough prints: jq's and curl's JSON values, one after another."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def run_walkthrough(command: list[str], running: Running, cwd: Path) -> str:
    env = {**running.env, "BASE": running.base, "TOKEN": running.key}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + running.log.read_text()[-4000:]
    return done.stdout


@pytest.mark.timeout(600)
def test_the_bash_walkthrough_runs_as_printed(make_run: Running, tmp_path: Path) -> None:
    for tool in ("bash", "curl", "jq"):
        assert shutil.which(tool), f"the walkthrough needs {tool} (.ci/run installs it)"
    output = run_walkthrough(["bash", "-euo", "pipefail", "-c", readme_block("bash")],
                             make_run, tmp_path)
    objects = json_stream(output)
    estimate = next(o for o in objects if "est_cost_cents" in o)
    assert estimate["status"] == "cost_ready", output
    assert estimate["est_cost_cents"] >= 1
    # The worker's engine is warm by then (it ran the sample): seconds, not minutes.
    assert estimate["est_processing_seconds"] < 60, estimate
    finished = next(o for o in objects if "success_rows" in o)
    assert finished == {"status": "done", "success_rows": 3, "error_rows": 0}, output
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [row["custom_id"] for row in rows] == [
        "Say hello in French.", "Name three colours.", "What is two plus two?"]
    for row in rows:
        message = row["response"]["body"]["choices"][0]["message"]
        assert row["error"] is None and message["content"].strip(), row
        assert row["response"]["body"]["choices"][0]["finish_reason"] == "stop", row


@pytest.mark.timeout(600)
def test_the_python_walkthrough_runs_as_printed(make_run: Running, tmp_path: Path) -> None:
    output = run_walkthrough([sys.executable, "-c", readme_block("python")], make_run,
                             tmp_path)
    lines = output.splitlines()
    assert "'status': 'cost_ready'" in lines[0], output
    assert lines[1] == "done", output
    answers = dict(line.split(" -> ", 1) for line in lines[2:])
    assert list(answers) == ["Say hello in French.", "Name three colours.",
                             "What is two plus two?"], output
    assert all(answer.strip() for answer in answers.values()), output


@pytest.mark.timeout(300)
def test_a_command_beside_make_run_leaves_its_services_running(make_run: Running) -> None:
    # given make run, healthy
    assert healthz(make_run.port)[0] == 200
    # when an operator creates an organization through the documented launcher
    done = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "manage",
         "ARGS=createorg --name beside"], cwd=ROOT,
        env={**make_run.env, "ANEX_RUN_DIR": str(make_run.run_dir)}, capture_output=True,
        text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    created = json.loads(next(line for line in done.stdout.splitlines()
                              if line.startswith("{")))
    assert "leaving Redis running" in done.stdout + done.stderr
    # then make run still answers, broker included, and the new key works against it
    status, body = healthz(make_run.port)
    assert status == 200, body
    created_input = requests.post(
        f"{make_run.base}/inputs", json={"format": "jsonl"}, timeout=30,
        headers={"Authorization": f"Bearer {created['api_key']}"})
    assert created_input.status_code == 200, created_input.text
