"""The `anex` CLI (anex.cli) against the real API served by a live test server: its
commands, its output, its exit codes. The whole submit -> estimate -> approve -> result
run against `make run` is tests/e2e/test_cli_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings
from pytest_django.live_server_helper import LiveServer

from anex import cli
from console.models import Organization
from jobs.constants import InputStatus, JobStatus
from jobs.models import Input, Job
from jobs.services.inputs import input_refresh
from tests.factories import api_key_make, job_make, organization_make
from tests.servers import LocalServer, reply

pytestmark = pytest.mark.django_db(transaction=True)
ROW = b'{"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


@pytest.fixture
def anex(live_server: LiveServer, organization: Organization, settings: Settings,
         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run the CLI in this process against the live server: (exit code, stdout, stderr)."""
    settings.ANEX_API_ORIGIN = live_server.url  # where the upload form is posted
    monkeypatch.setenv("ANEX_API_KEY", api_key_make(organization)[1])
    monkeypatch.setenv("ANEX_BASE_URL", live_server.url)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_status_prints_the_job_and_its_progress(anex: Any, organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=72)
    code, out, _ = anex("status", str(job.pk))
    assert code == cli.EXIT_OK
    assert f"job {job.pk}: cost_ready" in out and "72 credits ($0.72)" in out
    code, out, _ = anex("status", str(job.pk), "--json")
    body = json.loads(out)
    assert (code, body["status"], body["progress"]["done_rows"]) == (0, "cost_ready", 0)


def test_cancel_then_its_refusal_and_result_exit_codes(anex: Any,
                                                       organization: Organization) -> None:
    job = job_make(organization)
    assert anex("cancel", str(job.pk)) == (0, f"job {job.pk}: cancelled\n", "")
    code, _, err = anex("cancel", str(job.pk))
    assert (code, err) == (cli.EXIT_ERROR, "anex: 409: This job is cancelled: it is too late "
                                           "to cancel it.\n")
    code, out, _ = anex("result", str(job.pk), "--json")
    assert code == cli.EXIT_ERROR
    assert json.loads(out)["error"]["status"] == 409


def test_another_organizations_job_is_not_found(anex: Any) -> None:
    theirs = job_make(organization_make())
    assert anex("approve", str(theirs.pk)) == (1, "", "anex: 404: Job not found\n")
    assert Job.objects.get(pk=theirs.pk).status == JobStatus.COST_READY


def test_upload_streams_the_form_with_its_length(anex: Any, live_server: LiveServer,
                                                 organization: Organization,
                                                 tmp_path: Path) -> None:
    # The local upload endpoint refuses a body without Content-Length (as S3 does).
    source = tmp_path / "rows.jsonl"
    source.write_bytes(ROW * 5000)
    api = cli.Api(live_server.url, api_key_make(organization)[1])
    input_id = cli.upload(api, source, quiet=True)
    item = input_refresh(item=Input.objects.get(pk=input_id))
    assert (item.status, item.size_bytes) == (InputStatus.READY, len(ROW) * 5000)


def test_a_missing_file_or_key_is_a_usage_error(anex: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = anex("submit", str(tmp_path / "absent.jsonl"), "--model", "laya")
    assert (code, err) == (cli.EXIT_USAGE, f"anex: {tmp_path / 'absent.jsonl'}: no such "
                                           "file.\n")
    monkeypatch.delenv("ANEX_API_KEY")
    code, _, err = anex("status", "x")
    assert code == cli.EXIT_USAGE and "ANEX_API_KEY" in err


def test_a_server_without_checks_or_reruns_is_told_apart_from_a_missing_job(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    # given a server older than the client: no /checks, no /rerun (its router's 404)
    def upload_target(handler: Any) -> None:
        reply(handler, body=json.dumps({"id": "i1", "upload_url": server.url("/upload"),
                                        "fields": {"key": "k"}}).encode())

    server.routes["/batch/v1/inputs"] = upload_target
    server.routes["/upload"] = lambda handler: reply(handler, 204, b"")
    for path in ("/batch/v1/checks", "/batch/v1/jobs/j1/rerun"):
        server.routes[path] = lambda handler: reply(handler, 404, b'{"detail": "Not found."}')
    server.routes["/batch/v1/jobs/j2/rerun"] = lambda handler: reply(
        handler, 404, b'{"detail": "Job not found"}')
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    source = tmp_path / "rows.jsonl"
    source.write_bytes(ROW)
    # then the client says so, with its own exit code
    code, _, err = anex("check", str(source), "--model", "laya")
    assert code == cli.EXIT_UNAVAILABLE and "does not offer input checks" in err
    code, _, err = anex("rerun", "j1")
    assert code == cli.EXIT_UNAVAILABLE and "does not offer reruns" in err
    # and a job the server does not know is that, not an old server
    assert anex("rerun", "j2") == (cli.EXIT_ERROR, "", "anex: 404: Job not found\n")


def test_every_post_carries_an_idempotency_key_kept_across_retries(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a server that answers the first approve 503 and the retry 200
    answers = iter([(503, b'{"detail": "busy"}'), (200, b'{"id": "j1", "status": "x"}')])

    def approve(handler: Any) -> None:
        status, body = next(answers)
        reply(handler, status, body, {"Retry-After": "0"})

    server.routes["/batch/v1/jobs/j1/approve"] = approve
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    assert anex("approve", "j1") == (0, "job j1: x\n", "")
    keys = [seen.headers["Idempotency-Key"] for seen in server.requests]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) == 36


def test_check_prints_every_failing_row_and_exits_3(anex: Any, server: LocalServer,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    # given a server offering checks as the issue describes them (202 checking, then the
    # verdict with each failing row)
    verdict = {"id": "c1", "status": "failed", "errors": [
        {"line": 2, "custom_id": "b", "reason": "messages: required"},
        {"line": 5, "custom_id": "e", "reason": "Row 'e' is too long"}]}
    polls = iter([{"id": "c1", "status": "checking"}, verdict])
    server.routes["/batch/v1/inputs"] = lambda handler: reply(handler, body=json.dumps({
        "id": "i1", "upload_url": server.url("/upload"), "fields": {}}).encode())
    server.routes["/upload"] = lambda handler: reply(handler, 204, b"")
    server.routes["/batch/v1/checks"] = lambda handler: reply(
        handler, 202, b'{"id": "c1", "status": "checking"}')
    server.routes["/batch/v1/checks/c1"] = lambda handler: reply(
        handler, body=json.dumps(next(polls)).encode())
    monkeypatch.setattr(cli, "POLL_SECONDS", 0.01)
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    source = tmp_path / "rows.jsonl"
    source.write_bytes(ROW)
    # when the file is checked
    code, out, err = anex("check", str(source), "--model", "laya")
    # then each failing row is printed, and the exit code says the check failed
    assert code == cli.EXIT_UNSUCCESSFUL
    assert out == "line 2: b: messages: required\nline 5: e: Row 'e' is too long\n"
    assert err == "failed: 2 failing rows\n"
    sent = json.loads(next(s.body for s in server.requests if s.path == "/batch/v1/checks"))
    assert sent == {"input_id": "i1", "model": "laya"}
