"""Issue 44 item 1 on the real stack: through HTTP on the session's `make run` (its gunicorn,
Dramatiq worker and the local tiny-qwen3 engine), a running job's rows are read page by page
in file order while its later chunks are still pending; the pages put together are the
result file less each line's cost, and once the job has ended the pages from line 0 are the
result file byte for byte; another organization's key gets a 404 for the job's rows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import requests

from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.launch import ROOT, Running

ROWS = 2_560  # ten chunks of make run's 256 rows
TERMINAL = ("done", "failed", "cancelled")


def other_key(running: Running) -> str:
    """Another organization on the same `make run`, made as an operator makes one."""
    made = subprocess.run(
        [sys.executable, "-m", "anex.devstack", "exec", "--", sys.executable, "manage.py",
         "createorg", "--name", "rows-e2e-other"], env=running.env, cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=True)
    printed = [line for line in made.stdout.splitlines() if line.startswith("{")]
    return str(json.loads(printed[-1])["api_key"])  # the launcher's own lines around it


@pytest.mark.timeout(900)
def test_rows_are_read_while_the_job_runs_and_join_up_to_the_result(
        make_run: Running, tmp_path: Path) -> None:
    base = make_run.base
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {make_run.key}"

    # given a job of 2,560 chat rows on tiny-qwen3, submitted and approved over HTTP
    created = session.post(f"{base}/inputs", json={"format": "jsonl"}, timeout=30).json()
    content = b"".join(orjson.dumps({
        "custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": f"Question {i}: name a colour."}]},
    }) + b"\n" for i in range(ROWS))
    uploaded = requests.post(created["upload_url"], data=created["fields"], timeout=60,
                             files={"file": ("rows.jsonl", content)})
    assert uploaded.status_code == 204, uploaded.text
    while session.get(f"{base}/inputs/{created['id']}", timeout=30).json()["status"] != "ready":
        time.sleep(0.2)
    job = session.post(f"{base}/jobs", json={"input_id": created["id"], "model": "tiny-qwen3",
                                              "max_output_tokens": 8, "reasoning": False},
                       timeout=30).json()
    job_id = job["id"]
    while (state := session.get(f"{base}/jobs/{job_id}", timeout=30).json())["status"] in (
            "submitted", "estimating"):
        time.sleep(0.2)
    assert state["status"] == "cost_ready", state["failure_reason"]
    assert session.post(f"{base}/jobs/{job_id}/approve", timeout=30).status_code == 200

    # when its rows are read as they finish, from the cursor each page gives
    read, after, while_pending = b"", 0, 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ended = session.get(f"{base}/jobs/{job_id}", timeout=30).json()["status"] in TERMINAL
        page = session.get(f"{base}/jobs/{job_id}/rows", params={"after": after},
                           timeout=60)
        if page.status_code == 409:  # no row finished yet
            assert not ended, page.text
            time.sleep(0.05)
            continue
        assert page.status_code == 200, page.text
        assert page.headers["Content-Type"] == "application/jsonl"
        following = int(page.headers["Anex-Next-After"])
        assert page.content.count(b"\n") == following - after
        if page.content and not ended:
            progress = session.get(f"{base}/jobs/{job_id}/progress", timeout=30).json()
            # rows read while a later chunk had not finished (read after the page: it
            # can only have gone on)
            if progress["done_rows"] < progress["total_rows"]:
                while_pending += 1
            assert progress["rows_readable_after"] >= following
        ids = [json.loads(line)["custom_id"] for line in page.content.splitlines()]
        assert ids == [f"q{i}" for i in range(after, following)]
        read, after = read + page.content, following
        if ended and not page.content:
            break
        time.sleep(0.05)
    assert after == ROWS, (after, make_run.log.read_text()[-3000:])
    # then at least one page was read while chunks were still pending
    assert while_pending >= 1

    # and the result file is the lines read, each line read while the job ran with its
    # cost put before the closing brace (a line read after the end is the file's own)
    link = session.get(f"{base}/jobs/{job_id}/result", timeout=30).json()
    final = requests.get(link["result_url"], timeout=120).content
    assert link["row_count"] == ROWS and final.count(b"\n") == ROWS
    for line, end in zip(read.splitlines(keepends=True), final.splitlines(keepends=True),
                         strict=True):
        if b'"cost"' not in line:
            cost = json.loads(end)["cost"]["credits"]
            line = line[:-2] + b',"cost":{"credits":' + orjson.dumps(cost) + b"}}\n"
        assert line == end
    # once it has ended, the pages from line 0 put together are the file, byte for byte
    pages, after = b"", 0
    while True:
        page = session.get(f"{base}/jobs/{job_id}/rows",
                           params={"after": after, "limit": 999}, timeout=60)
        assert page.status_code == 200
        if not page.content:
            break
        pages, after = pages + page.content, int(page.headers["Anex-Next-After"])
    assert pages == final

    # another organization's key: the job's rows are not found
    theirs = requests.get(f"{base}/jobs/{job_id}/rows", timeout=30,
                          headers={"Authorization": f"Bearer {other_key(make_run)}"})
    assert theirs.status_code == 404
    assert theirs.json()["detail"] == "Job not found"
