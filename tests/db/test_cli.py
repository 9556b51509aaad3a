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


# -- issue 22, L2: what a server answers does not name files or drive the terminal ----------

class AnyJob(dict[str, Any]):
    """A fake server's routes that answer any job path as the job `job`: the path the
    client builds from an id like '../x' is then answered too, as a hostile server would."""

    def __init__(self, server: LocalServer, job: dict[str, Any]) -> None:
        super().__init__()
        self.server, self.job = server, job

    def get(self, path: str, default: Any = None) -> Any:
        answers = {"/batch/v1/inputs": {"id": "i1", "upload_url": self.server.url("/upload"),
                                        "fields": {}},
                   "/batch/v1/jobs": {"id": self.job.get("created", "j1"),
                                      "status": "submitted"}}
        if path in ("/upload", "/result"):
            body = b"" if path == "/upload" else b'{"custom_id":"r1"}\n'
            return lambda handler: reply(handler, 204 if path == "/upload" else 200, body)
        if path.endswith("/result"):
            answer: dict[str, Any] = {"result_url": self.server.url("/result"),
                                      "row_count": 1, "partial": False}
        elif path.endswith("/progress"):
            answer = {"done_rows": 1, "total_rows": 1, "eta_seconds": None}
        else:
            answer = answers.get(path, {"status": "done", **self.job, "id": self.job.get(
                "id", self.job.get("created"))})
        return lambda handler: reply(handler, body=json.dumps(answer).encode())


@pytest.mark.parametrize("job", [
    {"created": "../../../escaped"},  # the id POST /jobs answers
    {"id": "../../../escaped", "status": "done"},  # the id the job then reads
    {"id": "{tmp_path}/escaped", "status": "done"},  # an absolute path
])
def test_a_servers_job_id_never_names_a_file_outside_the_directory(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        job: dict[str, Any]) -> None:
    # given a server that answers a path for a job id, and a client run three levels down
    job = {key: value.replace("{tmp_path}", str(tmp_path)) for key, value in job.items()}
    server.routes = AnyJob(server, job)
    here = tmp_path / "a" / "b" / "c"
    here.mkdir(parents=True)
    (here / "rows.jsonl").write_bytes(ROW)
    monkeypatch.chdir(here)
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    # when a job is submitted, to be waited on and its result written by default name
    code, _, err = anex("submit", "rows.jsonl", "--model", "laya", "--approve", "--wait")
    # then the id is refused, and nothing was written anywhere
    assert code == cli.EXIT_ERROR
    assert "The server answered an invalid job id" in err
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["a", "b", "c", "rows.jsonl"]


def test_the_default_result_file_is_the_id_as_a_file_name_only() -> None:
    assert cli.result_path("6f1c0c9e-7d6e-4b1e-9d36-0d1f8f0b9a1e") == Path(
        "6f1c0c9e-7d6e-4b1e-9d36-0d1f8f0b9a1e.jsonl")
    assert cli.result_path("../../x") == Path("x.jsonl")
    assert cli.result_path("/etc/cron.d/x") == Path("x.jsonl")
    assert cli.result_path("..") == Path("result.jsonl")


def test_control_characters_from_the_server_never_reach_the_terminal(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a server whose texts carry escape sequences (clear the screen, set the title),
    # a carriage return that overwrites the line, a bell, and a bidirectional override
    evil = "\x1b[2J\x1b]0;owned\x07fine\rforged \u202eevil\x9b31m"
    server.routes["/batch/v1/jobs/j1"] = lambda handler: reply(handler, body=json.dumps({
        "id": "j1", "status": "failed", "model": evil, "failure_reason": evil}).encode())
    server.routes["/batch/v1/jobs/j1/progress"] = lambda handler: reply(
        handler, body=b'{"done_rows": 0, "total_rows": 1, "eta_seconds": null}')
    server.routes["/batch/v1/jobs/j1/approve"] = lambda handler: reply(
        handler, 409, json.dumps({"detail": evil}).encode())
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    # when its job is shown, and an action it refuses is tried
    code, out, _ = anex("status", "j1")
    refused, _, err = anex("approve", "j1")
    # then what is printed has the text without any control character
    assert code == cli.EXIT_OK and refused == cli.EXIT_ERROR
    for printed in (out, err):
        assert not any(char in printed for char in "\x1b\x07\r\u202e\x9b"), repr(printed)
        assert "[2J]0;ownedfineforged evil31m" in printed
    assert err == "anex: 409: [2J]0;ownedfineforged evil31m\n"
    # and --json keeps the server's text whole, escaped
    _, out, _ = anex("status", "j1", "--json")
    assert json.loads(out)["failure_reason"] == evil and "\x1b" not in out


@pytest.mark.parametrize("base", ["http://anex.invalid", "http://198.51.100.7:8000",
                                  "ftp://localhost"])
def test_plain_http_to_another_machine_needs_insecure(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    # given ANEX_BASE_URL in plain http to another machine (the key would travel readable)
    monkeypatch.setenv("ANEX_BASE_URL", base)
    # then the command is refused before anything is sent
    code, _, err = anex("status", "j1")
    assert code == cli.EXIT_USAGE
    assert err.startswith(f"anex: ANEX_BASE_URL {base}/batch/v1 is ")
    if base.startswith("http:"):
        assert "Use https, or pass --insecure." in err
    if base == "http://anex.invalid":
        # and --insecure lets it try (the name resolves nowhere: it cannot reach it)
        monkeypatch.setattr(cli, "RETRIES", 1)
        code, _, err = anex("status", "j1", "--insecure")
        assert code == cli.EXIT_ERROR and "Cannot reach the anex API" in err


def test_this_machine_over_http_and_any_https_are_allowed() -> None:
    for url in ("http://localhost:8000/batch/v1", "http://127.0.0.1/batch/v1",
                "http://[::1]:9/batch/v1", "https://api.anex.example/batch/v1"):
        assert cli.transport_problem(url, insecure=False) is None


def test_an_upload_target_in_plain_http_elsewhere_is_refused(
        anex: Any, server: LocalServer, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    # given a local server that sends the file to another machine over plain http
    server.routes["/batch/v1/inputs"] = lambda handler: reply(handler, body=json.dumps({
        "id": "i1", "upload_url": "http://198.51.100.7/upload", "fields": {}}).encode())
    monkeypatch.setenv("ANEX_BASE_URL", server.url())
    source = tmp_path / "rows.jsonl"
    source.write_bytes(ROW)
    code, _, err = anex("check", str(source), "--model", "laya")
    assert code == cli.EXIT_ERROR
    assert err == ("anex: The server answered http://198.51.100.7/upload is plain http to "
                   "another machine: the API key and your data would cross the network "
                   "unencrypted. Use https, or pass --insecure.\n")


class RangedFile:
    """A file served as S3 serves it (Range, If-Range against its ETag), whose first
    whole response is cut off halfway."""

    def __init__(self, data: bytes, etag: str = '"v1"') -> None:
        self.data, self.etag, self.cut = data, etag, True
        self.ranges: list[str | None] = []

    def __call__(self, handler: Any) -> None:
        asked = handler.headers.get("Range")
        self.ranges.append(asked)
        if asked and handler.headers.get("If-Range") == self.etag:
            first = int(asked.removeprefix("bytes=").rstrip("-"))
            if first >= len(self.data):
                reply(handler, 416, b"", {"Content-Range": f"bytes */{len(self.data)}"})
                return
            reply(handler, 206, self.data[first:], {
                "ETag": self.etag,
                "Content-Range": f"bytes {first}-{len(self.data) - 1}/{len(self.data)}"})
            return
        if self.cut:  # the first whole response breaks off after half the file
            self.cut = False
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(self.data)))
            handler.send_header("ETag", self.etag)
            handler.end_headers()
            handler.wfile.write(self.data[:len(self.data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
        reply(handler, 200, self.data, {"ETag": self.etag})


RESULT = b"".join(b'{"custom_id":"r%d","response":{}}\n' % index for index in range(2000))


def test_a_download_cut_off_resumes_from_the_bytes_it_had(server: LocalServer,
                                                          tmp_path: Path) -> None:
    served = RangedFile(RESULT)
    server.routes = {"/result": served}
    out = tmp_path / "result.jsonl"
    cli.download(server.url("/result"), out, quiet=True)
    assert out.read_bytes() == RESULT
    assert served.ranges == [None, f"bytes={len(RESULT) // 2}-"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.jsonl"]


def test_a_download_left_partial_by_an_earlier_run_is_finished_or_started_again(
        server: LocalServer, tmp_path: Path) -> None:
    served = RangedFile(RESULT)
    served.cut = False
    server.routes = {"/result": served}
    out = tmp_path / "result.jsonl"
    # given an earlier run that wrote the first 1,000 bytes of version v1
    (tmp_path / "result.jsonl.part").write_bytes(RESULT[:1000])
    (tmp_path / "result.jsonl.part.etag").write_text('"v1"')
    cli.download(server.url("/result"), out, quiet=True)
    assert out.read_bytes() == RESULT and served.ranges == ["bytes=1000-"]
    # a partial of another version is not joined to this one: the whole file again
    (tmp_path / "result.jsonl.part").write_bytes(b"x" * 1000)
    (tmp_path / "result.jsonl.part.etag").write_text('"v0"')
    cli.download(server.url("/result"), out, quiet=True)
    assert out.read_bytes() == RESULT
    # and a partial that is whole already is kept as it is (the server answers 416)
    (tmp_path / "result.jsonl.part").write_bytes(RESULT)
    (tmp_path / "result.jsonl.part.etag").write_text('"v1"')
    out.unlink()
    cli.download(server.url("/result"), out, quiet=True)
    assert out.read_bytes() == RESULT
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.jsonl"]


# --- anex tail: rows as they finish (issue 44 item 1) ----------------------------------


@pytest.fixture
def running_job(organization: Organization, settings: Settings, sent: list[str]) -> Job:
    """A started JSONL job of 150 rows in 3 chunks of 50, none finished."""
    from jobs.services.running import job_start
    from tests.db.test_row_cost import approved

    settings.ANEX_CHUNK_ROWS = 50
    job = approved(organization, 150, est=50)  # within the organization's free grant
    job_start(job_id=job.pk)
    return job


def finishing(monkeypatch: pytest.MonkeyPatch, job: Job, order: list[int],
              seen: Any) -> None:
    """The CLI's waits between polls each finish the next chunk of `order` (then the
    job), recording what `seen()` says before it."""
    import types

    from jobs.services.running import job_finalize
    from tests.db.test_rows_pages import complete

    steps: list[Any] = []
    chunks = list(job.chunks.order_by("index"))

    def step(_seconds: float) -> None:
        steps.append(seen())
        if order:
            complete(chunks[order.pop(0)])
        else:
            job_finalize(job_id=job.pk)

    monkeypatch.setattr(cli, "time", types.SimpleNamespace(sleep=step))
    finishing.steps = steps  # type: ignore[attr-defined]


def test_tail_writes_rows_as_they_finish_and_ends_with_the_result(
        anex: Any, running_job: Job, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rows.jsonl"

    def lines() -> list[str]:
        text = out.read_bytes() if out.exists() else b""
        return [json.loads(line)["custom_id"] for line in text.splitlines()]

    # the chunks finish out of order: the third first, then the first, then the second
    finishing(monkeypatch, running_job, [2, 0, 1], lines)
    code, _out, _err = anex("tail", str(running_job.pk), "-o", str(out), "--interval", "0")
    assert code == cli.EXIT_OK
    # FILE grew as the rows finished in order: nothing, nothing while only the third was
    # done, the first's 50, then all 150
    seen = finishing.steps  # type: ignore[attr-defined]
    assert [len(step) for step in seen] == [0, 0, 50, 150]
    assert seen[2] == [f"r{i}" for i in range(50)]
    # and it ends the result file, byte for byte (each line with its cost)
    running_job.refresh_from_db()
    from jobs.storage import storage_for
    result = storage_for("world").path(running_job.result_key).read_bytes()  # type: ignore[attr-defined]
    assert out.read_bytes() == result and b'"cost"' in result
    assert not out.with_name(out.name + ".part").exists()


def test_tail_goes_on_from_the_lines_a_file_holds_and_cuts_a_torn_one(
        anex: Any, running_job: Job, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.db.test_rows_pages import complete

    chunks = list(running_job.chunks.order_by("index"))
    complete(chunks[0])
    out = tmp_path / "rows.jsonl"
    # a first tail, stopped after its first page (the wait is where it stops)
    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    import types
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(sleep=interrupted))
    assert anex("tail", str(running_job.pk), "-o", str(out))[0] == 130
    first = out.read_bytes()
    assert first.count(b"\n") == 50
    # its file torn mid-line, as a machine stopped mid-write leaves it
    out.write_bytes(first + first.splitlines(keepends=True)[0][:30])
    asked: list[str] = []
    real = cli.rows_page

    def recorded(api: Any, job_id: str, after: int, sink: Any) -> tuple[int, bool]:
        asked.append(str(after))
        return real(api, job_id, after, sink)

    monkeypatch.setattr(cli, "rows_page", recorded)
    seen: list[bytes] = []
    finishing(monkeypatch, running_job, [1, 2], lambda: seen.append(out.read_bytes()))
    code, _out, err = anex("tail", str(running_job.pk), "-o", str(out), "--interval", "0")
    assert code == cli.EXIT_OK
    assert "50 rows already there" in err
    # it asked from line 50 on, and the torn line was cut before anything was appended
    assert asked[0] == "50"
    assert seen[0] == first
    assert seen[1].splitlines(keepends=True)[:50] == first.splitlines(keepends=True)
    assert [json.loads(line)["custom_id"] for line in seen[1].splitlines()] == \
        [f"r{i}" for i in range(100)]


def test_tail_to_stdout_and_its_exit_codes(anex: Any, organization: Organization,
                                           running_job: Job, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from jobs.services.running import job_finalize
    from tests.db.test_rows_pages import complete

    for chunk in running_job.chunks.all():
        complete(chunk)
    job_finalize(job_id=running_job.pk)
    running_job.refresh_from_db()
    from jobs.storage import storage_for
    result = storage_for("world").path(running_job.result_key).read_bytes()  # type: ignore[attr-defined]
    # an ended job's rows on stdout: its result file
    code, out, _ = anex("tail", str(running_job.pk))
    assert (code, out.encode()) == (cli.EXIT_OK, result)
    # a job that ended with nothing to deliver: no rows, and the exit code of a failure
    failed = job_make(organization, status=JobStatus.FAILED)
    assert anex("tail", str(failed.pk))[:2] == (cli.EXIT_UNSUCCESSFUL, "")
    # another organization's job is not found; --json needs a file
    theirs = job_make(organization_make(), status=JobStatus.DONE)
    assert anex("tail", str(theirs.pk)) == (cli.EXIT_ERROR, "", "anex: 404: Job not found\n")
    assert anex("tail", str(running_job.pk), "--json")[0] == cli.EXIT_USAGE
