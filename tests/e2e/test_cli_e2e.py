"""`anex submit` against a real `make run` (the session's launcher, tests/launch.py):
a file uploaded, estimated, approved at the prompt, run and its result downloaded, with the
exit codes a script reads; and an estimate declined, then cancelled."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from anex.cli import EXIT_NOT_APPROVED, EXIT_OK
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.launch import Running

QUESTIONS = ["Say hello in French.", "Name three colours.", "What is two plus two?"]


def requests_file(directory: Path) -> Path:
    path = directory / "requests.jsonl"
    path.write_text("".join(json.dumps({
        "custom_id": question, "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": question}]}}) + "\n"
        for question in QUESTIONS))
    return path


def anex(running: Running, cwd: Path, *argv: str,
         answer: str = "") -> subprocess.CompletedProcess[str]:
    env = {**running.env, "ANEX_API_KEY": running.key,
           "ANEX_BASE_URL": f"http://localhost:{running.port}"}
    return subprocess.run([sys.executable, "-m", "anex.cli", *argv], cwd=cwd, env=env,
                          input=answer, capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.timeout(600)
def test_submit_asks_runs_and_downloads_the_result(make_run: Running, tmp_path: Path) -> None:
    # given a file of three chat requests
    requests_file(tmp_path)
    # when it is submitted, and the estimate approved at the prompt
    done = anex(make_run, tmp_path, "submit", "requests.jsonl", "--model", "tiny-qwen3",
                "-o", "answers.jsonl", answer="y\n")
    # then it ran to the end: exit 0, the estimate shown before the question, the result
    # downloaded row for row
    assert done.returncode == EXIT_OK, done.stderr + make_run.log.read_text()[-4000:]
    assert re.search(r"rows:\s+3\n.*tokens:.*\n.*cost:\s+at most \d+ credits? \(\$\d+\.\d\d\), "
                     r"held on approval\n.*time:.*\n"
                     r".*priority:\s+standard, within 24 h of approval\nApprove and hold",
                     done.stderr), done.stderr
    assert "done: 3 rows answered, 0 failed; result in answers.jsonl" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [row["custom_id"] for row in rows] == QUESTIONS
    for row in rows:
        assert row["error"] is None, row
        assert row["response"]["body"]["choices"][0]["message"]["content"].strip(), row
    # and the progress the row bar followed reads every row done
    job_id = re.search(r"job (\S+): cost_ready", done.stderr).group(1)  # type: ignore[union-attr]
    status = anex(make_run, tmp_path, "status", job_id, "--json")
    assert status.returncode == EXIT_OK
    assert json.loads(status.stdout)["progress"] == {
        "done_rows": 3, "total_rows": 3, "eta_seconds": 0, "rows_readable_after": 3,
        "rows_per_second": json.loads(status.stdout)["progress"]["rows_per_second"]}


@pytest.mark.timeout(600)
def test_json_output_and_a_declined_estimate(make_run: Running, tmp_path: Path) -> None:
    requests_file(tmp_path)
    # --approve --wait --json: one JSON object on stdout, the result in JOB_ID.jsonl
    done = anex(make_run, tmp_path, "submit", "requests.jsonl", "--model", "tiny-qwen3",
                "--approve", "--wait", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["row_count"], report["approved"]) == ("done", 3, True)
    assert report["result_file"] == f"{report['id']}.jsonl"
    assert len((tmp_path / report["result_file"]).read_text().splitlines()) == 3
    # a closed stdin declines the estimate: exit 4, the job left awaiting approval
    declined = anex(make_run, tmp_path, "submit", "requests.jsonl", "--model", "tiny-qwen3",
                    "--json")
    assert declined.returncode == EXIT_NOT_APPROVED, declined.stderr
    waiting = json.loads(declined.stdout)
    assert (waiting["status"], waiting["approved"]) == ("cost_ready", False)
    cancelled = anex(make_run, tmp_path, "cancel", waiting["id"])
    assert (cancelled.returncode, cancelled.stdout) == (
        EXIT_OK, f"job {waiting['id']}: cancelled\n")
