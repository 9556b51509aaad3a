"""`anex`: the batch API from a terminal (docs/cli.md).

    anex submit FILE --model M [--priority flex|standard|priority] [--approve] [--wait] [-o OUT]
    anex check FILE --model M
    anex status|approve|cancel|result|rerun JOB
    anex tail JOB [-o FILE] [--interval S]

It reads ANEX_API_KEY and ANEX_BASE_URL (default http://localhost:8000, `make run`'s
address), speaks only HTTP (requests; tqdm draws the bars on stderr), and needs nothing of
the server's code or settings. Every POST carries an Idempotency-Key, so a retry after a
dropped connection or a 502/503 never does the work twice. `--json` prints one JSON object
on stdout for a script; the exit code says how it went (EXIT_* below).

What the server answers is not trusted to name files or drive the terminal: an id it
answers must look like one (it names the result file, and only as a file name), a text it
answers is printed without control characters, and the key is sent over plain http only to
this machine unless --insecure says otherwise.
"""

from __future__ import annotations

import argparse
import functools
import io
import ipaddress
import json
import os
import re
import sys
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn
from urllib.parse import urlsplit

import requests
import urllib3
from tqdm import tqdm

DEFAULT_BASE_URL = "http://localhost:8000"
API_PATH = "/batch/v1"

EXIT_OK = 0
EXIT_ERROR = 1  # the API refused the request, or could not be reached
EXIT_USAGE = 2  # a bad command line, or no ANEX_API_KEY
EXIT_UNSUCCESSFUL = 3  # the job ended failed or cancelled; the check found failing rows
EXIT_NOT_APPROVED = 4  # the estimate was declined: the job waits in cost_ready
EXIT_UNAVAILABLE = 5  # this server does not offer the command (an older deployment)

TERMINAL = frozenset({"done", "failed", "cancelled"})
ESTIMATING = frozenset({"submitted", "estimating"})
# The urgency tiers POST /jobs takes (docs/estimates.md, "Urgency tiers").
PRIORITIES = ("flex", "standard", "priority")
POLL_SECONDS = 1.0
RETRIES = 5
RETRY_STATUSES = frozenset({502, 503, 504})
TIMEOUT_SECONDS = 60
CHUNK_BYTES = 1024 * 1024
# What an id the server answers may be (a UUID; the tests' servers answer "j1"): it goes into
# URL paths and names the default result file.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
# Bidirectional overrides and isolates reorder what a terminal shows; they are Cf, kept out
# with the control characters (Cc: escape sequences, carriage returns, bells).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                  "\u2066\u2067\u2068\u2069")


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR, *,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


# --- what the server answers ---------------------------------------------------------------


def printable(text: object) -> str:
    """A server's text as it may reach the terminal: every control character (escape
    sequences, carriage returns, newlines) and bidirectional override dropped."""
    return "".join(char for char in str(text) if char not in _BIDI
                   and unicodedata.category(char) != "Cc")


def server_id(value: object, what: str) -> str:
    """An id the server answered, refused unless it looks like one."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise CliError(f"The server answered an invalid {what} id ({printable(value)[:80]!r}); "
                       "is ANEX_BASE_URL an anex API?")
    return value


def result_path(job_id: str) -> Path:
    """The default result file: the job id as a file name only, in this directory."""
    name = Path(job_id).name
    return Path(f"{name if name not in ('', '.', '..') else 'result'}.jsonl")


def transport_problem(url: str, *, insecure: bool) -> str | None:
    """Why a URL may not be used: plain http to another machine sends the key (or the
    file, or the result) readable on the way, so it needs --insecure."""
    parts = urlsplit(url)
    if parts.scheme == "https" or (parts.scheme == "http" and (
            insecure or _loopback(parts.hostname or ""))):
        return None
    if parts.scheme != "http":
        return f"{printable(url)[:200]} is not an http(s) URL."
    return (f"{printable(url)[:200]} is plain http to another machine: the API key and your "
            "data would cross the network unencrypted. Use https, or pass --insecure.")


def _loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def checked_url(url: object, *, insecure: bool) -> str:
    """An upload or result URL the server answered, held to the same rule as the base."""
    if not isinstance(url, str):
        raise CliError("The server answered no URL; is ANEX_BASE_URL an anex API?")
    problem = transport_problem(url, insecure=insecure)
    if problem:
        raise CliError(f"The server answered {problem}")
    return url


# --- HTTP -------------------------------------------------------------------------------


def base_url(raw: str) -> str:
    """The batch API's base from ANEX_BASE_URL: an origin, or an origin with /batch/v1."""
    raw = raw.rstrip("/")
    return raw if raw.endswith(API_PATH) else raw + API_PATH


class Api:
    def __init__(self, base: str, key: str, *, insecure: bool = False) -> None:
        self.base = base_url(base)
        self.insecure = insecure
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {key}",
                                     "User-Agent": "anex-cli/0.1"})

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
             expect: tuple[int, ...] = (200,)) -> dict[str, Any]:
        """One API call, retried on a lost connection and on 502/503/504 (a POST under one
        Idempotency-Key throughout, so the server does it once); an error answer raises
        CliError with the server's detail."""
        headers = {"Idempotency-Key": str(uuid.uuid4())} if method == "POST" else {}
        response = _retrying(lambda: self.session.request(
            method, self.base + path, json=body, headers=headers, timeout=TIMEOUT_SECONDS))
        if response.status_code not in expect:
            raise _refused(response)
        data = _json(response)
        if not isinstance(data, dict):
            raise CliError(f"{self.base}{path} did not answer a JSON object: is ANEX_BASE_URL "
                           "an anex API?")
        return data


def _json(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _retryable(response: requests.Response) -> bool:
    """A 502/503/504, or the 409 with Retry-After that a repeat of a POST still in flight
    gets (jobs.idempotency): the reference's own 409s carry no Retry-After."""
    return response.status_code in RETRY_STATUSES or (
        response.status_code == 409 and "Retry-After" in response.headers)


def _retrying(send: Callable[[], requests.Response]) -> requests.Response:
    for attempt in range(RETRIES):
        last = attempt == RETRIES - 1
        try:
            response = send()
        except (requests.ConnectionError, requests.Timeout) as exc:
            if last:
                raise CliError(f"Cannot reach the anex API: {exc.__class__.__name__}. Is it "
                               "running, and is ANEX_BASE_URL right?") from None
            time.sleep(2**attempt)
            continue
        if not _retryable(response) or last:
            return response
        wait = response.headers.get("Retry-After", "")
        time.sleep(int(wait) if wait.isdigit() else 2**attempt)
    raise AssertionError("unreachable")


def _refused(response: requests.Response) -> CliError:
    body = _json(response)
    detail = body.get("detail") if isinstance(body, dict) else None
    return CliError(f"{response.status_code}: {printable(detail or response.reason)}",
                    status=response.status_code)


def _not_deployed(error: CliError, what: str) -> CliError:
    """A 404 from the router itself ("Not found.", no object named) means the server has no
    such endpoint; a 404 naming the job is the job."""
    if error.status == 404 and error.message.endswith(": Not found."):
        return CliError(f"This anex server does not offer {what} yet (it answered 404): it "
                        "runs an older version than this client.", EXIT_UNAVAILABLE,
                        status=404)
    return error


# --- uploading and downloading ------------------------------------------------------------


def bar_make(quiet: bool, **options: Any) -> tqdm[Any]:
    """A bar on stderr, drawn only on a terminal and never with --json (stdout stays one
    JSON object)."""
    return tqdm(file=sys.stderr, disable=quiet or None, **options)



class FormBody:
    """A multipart/form-data body streamed from the file with its length known up front
    (S3's POST wants Content-Length), the form's fields first and the file last, as the
    reference prescribes; `bar` counts the file's bytes as they go.

    requests sends an object with read() and __iter__ as a stream, and takes its length
    from __len__; it has no tell(), which requests would take for a position in it."""

    def __init__(self, fields: dict[str, str], path: Path, bar: tqdm[Any]) -> None:
        boundary = uuid.uuid4().hex
        head = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
            f"{value}\r\n".encode() for name, value in fields.items())
        filename = path.name.replace('"', "%22").replace("\r", "").replace("\n", "")
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                 f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                 ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        self.content_type = f"multipart/form-data; boundary={boundary}"
        self._length = len(head) + path.stat().st_size + len(tail)
        self._file = path.open("rb")
        self._parts: list[IO[bytes]] = [io.BytesIO(head), self._file, io.BytesIO(tail)]
        self._bar = bar

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        while block := self.read(CHUNK_BYTES):
            yield block

    def read(self, size: int | None = -1) -> bytes:
        size = CHUNK_BYTES if size is None or size < 0 else size
        while self._parts:
            part = self._parts[0]
            data = part.read(size)
            if data:
                if part is self._file:
                    self._bar.update(len(data))
                return data
            self._parts.pop(0)
        return b""

    def close(self) -> None:
        self._file.close()


def upload(api: Api, path: Path, *, quiet: bool) -> str:
    """POST /inputs for an upload target, the file to it with a byte bar; the input id."""
    if not path.is_file():
        raise CliError(f"{path}: no such file.", EXIT_USAGE)
    fmt = "parquet" if path.suffix.lower() == ".parquet" else "jsonl"
    target = api.call("POST", "/inputs", {"format": fmt})
    upload_url = checked_url(target.get("upload_url"), insecure=api.insecure)
    with bar_make(quiet, total=path.stat().st_size, unit="B", unit_scale=True,
                  unit_divisor=1024, desc="upload") as bar:
        body = FormBody(target["fields"], path, bar)
        try:
            # Not retried: a used upload target refuses a second file; run the command again.
            response = requests.post(upload_url, data=body, timeout=(30, 600),
                                     headers={"Content-Type": body.content_type})
        except requests.ConnectionError as exc:
            raise CliError(f"The upload failed: {exc.__class__.__name__}.") from None
        finally:
            body.close()
    if response.status_code >= 300:
        raise CliError(f"The upload was refused ({response.status_code}): "
                       f"{printable(response.text.strip()[:500])}")
    return server_id(target.get("id"), "input")


# Times a download cut off mid-stream is resumed from the bytes it had, in one command.
DOWNLOAD_RESUMES = 5
_CUT_OFF = (requests.ConnectionError, requests.Timeout,
            requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError)


def download(url: str, out: Path, *, quiet: bool) -> None:
    """The result file to `out`, through OUT.part: a download cut off resumes from the
    bytes already written (Range, with If-Range naming the version they came from, kept in
    OUT.part.etag), in this command or the next one for the same OUT; a server that sends
    the whole file instead (another version, or no ranges) starts it again."""
    partial = out.with_name(out.name + ".part")
    version = out.with_name(out.name + ".part.etag")
    have = partial.stat().st_size if partial.is_file() and version.is_file() else 0
    tag = version.read_text().strip() if have else ""
    for resumes in range(DOWNLOAD_RESUMES + 1):
        headers = {"Range": f"bytes={have}-", "If-Range": tag} if have and tag else {}
        response = _retrying(functools.partial(
            requests.get, url, stream=True, timeout=TIMEOUT_SECONDS, headers=headers))
        if response.status_code == 416 and headers and _whole_at(response, have):
            break  # the partial file is the whole of it already
        if response.status_code not in (200, 206):
            raise CliError(f"The result download failed ({response.status_code}).")
        if response.status_code == 200 or not _resumes_at(response, have):
            have = 0
        tag = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
        version.write_text(tag)
        size = int(response.headers.get("Content-Length") or 0) or None
        with partial.open("ab" if have else "wb") as sink, bar_make(
                quiet, total=size and have + size, initial=have, unit="B", unit_scale=True,
                unit_divisor=1024, desc="download") as bar:
            try:
                # What has arrived, as it arrives: a cut-off loses none of it.
                for block in iter(partial_read(response), b""):
                    sink.write(block)
                    bar.update(len(block))
            except _CUT_OFF as exc:
                if resumes == DOWNLOAD_RESUMES or not tag:
                    raise CliError(f"The result download broke off ({exc.__class__.__name__})"
                                   f"; run the command again to resume it.") from None
                sink.flush()
                have = partial.stat().st_size
                continue
        break
    partial.replace(out)
    version.unlink(missing_ok=True)


def partial_read(response: requests.Response) -> Callable[[], bytes]:
    """A reader of the response's body that hands on what has arrived, up to a block."""
    return lambda: response.raw.read1(CHUNK_BYTES)


def _resumes_at(response: requests.Response, have: int) -> bool:
    """Whether a 206 answers the range asked for: its bytes start where ours end."""
    return response.headers.get("Content-Range", "").startswith(f"bytes {have}-")


def _whole_at(response: requests.Response, have: int) -> bool:
    """Whether a 416 says the object is `have` bytes long: nothing was left to fetch."""
    return response.headers.get("Content-Range", "") == f"bytes */{have}"


# --- a job from the terminal ------------------------------------------------------------


def say(message: str, *, quiet: bool) -> None:
    if not quiet:
        print(printable(message), file=sys.stderr, flush=True)


def show(message: str) -> None:
    """A line on stdout, as say() on stderr."""
    print(printable(message))


def credits(cents: int | None) -> str:
    if cents is None:
        return "?"
    return f"{cents} credit{'s' if cents != 1 else ''} (${cents / 100:.2f})"


def wait_estimate(api: Api, job_id: str, *, quiet: bool) -> dict[str, Any]:
    with _spinner("estimating", quiet=quiet) as tick:
        while (job := api.call("GET", f"/jobs/{job_id}"))["status"] in ESTIMATING:
            tick(job["status"])
            time.sleep(POLL_SECONDS)
    return job


@contextmanager
def _spinner(desc: str, *, quiet: bool) -> Iterator[Callable[[str], None]]:
    with bar_make(quiet, total=None, desc=desc, bar_format="{desc} {elapsed}",
                  leave=False) as bar:
        def tick(state: str) -> None:
            bar.set_description_str(printable(state))
            bar.update(0)

        yield tick


def estimate_lines(job: dict[str, Any], rows: int | None) -> list[str]:
    return [
        f"job {job['id']}: {job['status']}",
        f"  rows:      {rows if rows is not None else '?'}",
        f"  tokens:    {job.get('est_input_tok')} in, {job.get('est_output_tok')} out "
        "(estimated)",
        f"  cost:      at most {credits(job.get('est_cost_cents'))}, held on approval",
        f"  time:      about {job.get('est_processing_seconds')} s once approved",
        *([f"  priority:  {job['priority']}, within {job.get('completion_window_hours')} h "
           "of approval"] if job.get("priority") else []),
    ]


def confirm(question: str) -> bool:
    """Ask on the terminal (stderr, so --json's stdout stays clean); a closed stdin, as in
    a script without --approve, is a no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer:
        print("", file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def wait_done(api: Api, job_id: str, *, quiet: bool) -> dict[str, Any]:
    """A row bar with the server's rate and ETA until the job has ended."""
    progress = api.call("GET", f"/jobs/{job_id}/progress")
    with bar_make(quiet, total=progress["total_rows"], unit="row", desc="rows") as bar:
        while True:
            job = api.call("GET", f"/jobs/{job_id}")
            progress = api.call("GET", f"/jobs/{job_id}/progress")
            if bar.total != progress["total_rows"]:
                bar.total = progress["total_rows"]
            bar.update(progress["done_rows"] - bar.n)
            eta = progress["eta_seconds"]
            bar.set_postfix_str(printable(
                f"{job['status']}, eta {eta if eta is not None else '?'} s"))
            if job["status"] in TERMINAL:
                return job
            time.sleep(POLL_SECONDS)


def fetch_result(api: Api, job_id: str, out: Path | None, *,
                 quiet: bool) -> tuple[Path, dict[str, Any]]:
    link = api.call("GET", f"/jobs/{job_id}/result")
    target = out or result_path(job_id)
    download(checked_url(link.get("result_url"), insecure=api.insecure), target, quiet=quiet)
    return target, link


def cmd_submit(api: Api, args: argparse.Namespace) -> int:
    quiet = args.json
    input_id = upload(api, Path(args.file), quiet=quiet)
    say(f"uploaded {args.file} as input {input_id}", quiet=quiet)
    body: dict[str, Any] = {"input_id": input_id, "model": args.model}
    if args.max_output_tokens is not None:
        body["max_output_tokens"] = args.max_output_tokens
    if args.priority is not None:
        body["priority"] = args.priority
    job_id = server_id(api.call("POST", "/jobs", body).get("id"), "job")
    job = wait_estimate(api, job_id, quiet=quiet)
    report: dict[str, Any] = {"id": job_id, "input_id": input_id, "estimate": job}
    if job["status"] != "cost_ready":
        return _ended(api, args, job, report)
    total = api.call("GET", f"/jobs/{job_id}/progress")["total_rows"]
    for line in estimate_lines(job, total):
        say(line, quiet=quiet)
    if not (args.approve or confirm(f"Approve and hold {credits(job['est_cost_cents'])}?")):
        say(f"Not approved: the job waits in cost_ready (approve it with `anex approve "
            f"{job_id}`; an estimate left 24 hours cancels itself, free).", quiet=quiet)
        _emit(args, {**report, "status": "cost_ready", "approved": False})
        return EXIT_NOT_APPROVED
    approved = api.call("POST", f"/jobs/{job_id}/approve")
    report["approved"] = True
    say(f"approved: {approved['status']}", quiet=quiet)
    if not (args.wait or args.output):
        _emit(args, {**report, "status": approved["status"]})
        return EXIT_OK
    job = wait_done(api, job_id, quiet=quiet)
    report["job"] = job
    return _ended(api, args, job, report)


def _ended(api: Api, args: argparse.Namespace, job: dict[str, Any],
           report: dict[str, Any]) -> int:
    """The end of a job: its counts, and its result downloaded when it has one (a failed
    or cancelled job's partial result too)."""
    quiet = args.json
    status = job["status"]
    report["status"] = status
    if status == "done" or job.get("partial"):
        path, link = fetch_result(api, server_id(job.get("id"), "job"),
                                  Path(args.output) if args.output else None, quiet=quiet)
        report["result_file"] = str(path)
        report["row_count"] = link["row_count"]
        say(f"{status}: {job.get('success_rows')} rows answered, {job.get('error_rows')} "
            f"failed; result in {path}", quiet=quiet)
    else:
        say(f"{status}: {job.get('failure_reason') or 'no result to download'}", quiet=quiet)
    _emit(args, report)
    return EXIT_OK if status == "done" else EXIT_UNSUCCESSFUL


def _emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(report, indent=None))


def cmd_check(api: Api, args: argparse.Namespace) -> int:
    quiet = args.json
    input_id = upload(api, Path(args.file), quiet=quiet)
    try:
        check = api.call("POST", "/checks", {"input_id": input_id, "model": args.model},
                         expect=(200, 202))
    except CliError as refused:
        raise _not_deployed(refused, "input checks (POST /batch/v1/checks)") from None
    check_id = server_id(check.get("id"), "check")
    with _spinner("checking", quiet=quiet) as tick:
        while (check := api.call("GET", f"/checks/{check_id}"))["status"] not in (
                "passed", "failed"):
            tick(check["status"])
            time.sleep(POLL_SECONDS)
    errors = check.get("errors") or []
    if args.json:
        print(json.dumps(check))
    else:
        for row in errors:
            show(f"line {row.get('line')}: {row.get('custom_id')}: {row.get('reason')}")
        say(f"{check['status']}: {len(errors)} failing row{'s' if len(errors) != 1 else ''}",
            quiet=False)
    return EXIT_OK if check["status"] == "passed" else EXIT_UNSUCCESSFUL


def cmd_status(api: Api, args: argparse.Namespace) -> int:
    job = api.call("GET", f"/jobs/{args.job}")
    progress = api.call("GET", f"/jobs/{args.job}/progress")
    if args.json:
        print(json.dumps({**job, "progress": progress}))
        return EXIT_OK
    show(f"job {job['id']}: {job['status']} ({job['model']})")
    if job.get("est_cost_cents") is not None:
        show(f"  estimate:  {credits(job['est_cost_cents'])}, about "
             f"{job.get('est_processing_seconds')} s")
    eta = progress["eta_seconds"]
    show(f"  rows:      {progress['done_rows']} of {progress['total_rows'] or '?'} done"
         + (f", about {eta} s left" if eta else ""))
    if job["status"] in TERMINAL:
        show(f"  outcome:   {job.get('success_rows')} answered, {job.get('error_rows')} "
             f"failed, {job.get('truncated_rows')} truncated")
    if job.get("failure_reason"):
        show(f"  reason:    {job['failure_reason']}")
    return EXIT_OK


def _state_command(verb: str) -> Callable[[Api, argparse.Namespace], int]:
    def run(api: Api, args: argparse.Namespace) -> int:
        state = api.call("POST", f"/jobs/{args.job}/{verb}")
        if args.json:
            print(json.dumps(state))
        else:
            show(f"job {state['id']}: {state['status']}")
        return EXIT_OK

    return run


def cmd_result(api: Api, args: argparse.Namespace) -> int:
    path, link = fetch_result(api, args.job, Path(args.output) if args.output else None,
                              quiet=args.json)
    if args.json:
        print(json.dumps({**link, "result_file": str(path)}))
    else:
        show(f"{link['row_count']} rows{' (partial)' if link['partial'] else ''} in {path}")
    return EXIT_OK


def cmd_rerun(api: Api, args: argparse.Namespace) -> int:
    try:
        include = [part.strip() for part in args.include.split(",") if part.strip()] \
            if args.include else None
        child = api.call("POST", f"/jobs/{args.job}/rerun",
                         {"include": include} if include else None, expect=(200, 201, 202))
    except CliError as refused:
        raise _not_deployed(refused, "reruns (POST /batch/v1/jobs/{id}/rerun)") from None
    if args.json:
        print(json.dumps(child))
    else:
        show(f"rerun as job {child['id']}: {child['status']}")
    return EXIT_OK


# --- rows as they finish ------------------------------------------------------------------

TAIL_LIMIT = 10_000  # the most a page takes
TAIL_INTERVAL_SECONDS = 2.0


def complete_lines(path: Path) -> int:
    """The whole lines a file holds, a torn last line (a tail cut off mid-line) cut off so
    the next line is appended after a newline."""
    if not path.is_file():
        return 0
    lines, whole = 0, 0
    with path.open("rb") as source:
        for line in source:
            if not line.endswith(b"\n"):
                break
            lines += 1
            whole += len(line)
    if whole != path.stat().st_size:
        with path.open("r+b") as sink:
            sink.truncate(whole)
    return lines


def rows_page(api: Api, job_id: str, after: int, sink: IO[bytes]) -> tuple[int, bool]:
    """One GET /jobs/{id}/rows from line `after`, each whole line written to `sink` as it
    arrives; the cursor after what was written, and whether any row was (a page cut off
    mid-way leaves the cursor at the last whole line, the next page goes on from there).
    A job no row of which has finished yet (409) is an empty page."""
    url = f"{api.base}/jobs/{job_id}/rows"
    response = _retrying(functools.partial(
        api.session.get, url, params={"after": after, "limit": TAIL_LIMIT}, stream=True,
        timeout=TIMEOUT_SECONDS))
    if response.status_code == 409:
        return after, False
    if response.status_code != 200:
        raise _not_deployed(_refused(response), "rows while a job runs "
                                                "(GET /batch/v1/jobs/{id}/rows)")
    held, wrote = b"", after
    try:
        for block in iter(partial_read(response), b""):
            held += block
            cut = held.rfind(b"\n") + 1
            if cut:
                sink.write(held[:cut])
                sink.flush()
                wrote += held[:cut].count(b"\n")
                held = held[cut:]
    except _CUT_OFF:
        pass  # what arrived whole is kept; the next page goes on from it
    finally:
        response.close()
    return wrote, wrote > after


def _replaced_by_result(job: dict[str, Any]) -> bool:
    """Whether tail's FILE ends as the job's result file: a JSONL job that ended with one."""
    return job.get("format", "jsonl") == "jsonl" and job["status"] in TERMINAL and (
        job["status"] == "done" or bool(job.get("partial")))


def cmd_tail(api: Api, args: argparse.Namespace) -> int:
    """Write a job's rows as they finish, in file order, until it ends; exit as `submit
    --wait` does. With -o FILE, go on from the lines FILE already holds, and once the job
    has ended replace FILE by its result file (a JSONL job's: the same lines, each with its
    cost), so FILE ends the result byte for byte."""
    job_id = server_id(args.job, "job")
    quiet = args.json
    out = Path(args.output) if args.output else None
    if args.json and out is None:
        raise CliError("--json needs -o FILE: without it the rows go to stdout.", EXIT_USAGE)
    after = complete_lines(out) if out is not None else 0
    if after:
        say(f"{out}: {after} rows already there; going on from row {after + 1}", quiet=quiet)
    sink: IO[bytes] = out.open("ab") if out is not None else sys.stdout.buffer
    try:
        while True:
            job = api.call("GET", f"/jobs/{job_id}")
            ended = job["status"] in TERMINAL
            if ended and out is not None and _replaced_by_result(job):
                break  # the download below brings the rest, with every line's cost
            # Pages read after the job is seen ended are its result's: the rest of it.
            while True:
                after, more = rows_page(api, job_id, after, sink)
                if not more:
                    break
            if ended:
                break
            time.sleep(args.interval)
    finally:
        if out is not None:
            sink.close()
    status = job["status"]
    report: dict[str, Any] = {"id": job_id, "status": status}
    if out is not None and _replaced_by_result(job):
        fetch_result(api, job_id, out, quiet=quiet)
        after = complete_lines(out)
        report["result_file"] = str(out)
        say(f"{status}: {after} rows; the result in {out}", quiet=quiet)
    elif out is not None:
        report["rows_file"] = str(out)
        say(f"{status}: {after} rows in {out}", quiet=quiet)
    report["rows"] = after
    if job.get("failure_reason"):
        say(f"{status}: {job['failure_reason']}", quiet=args.json)
    _emit(args, report)
    return EXIT_OK if status == "done" else EXIT_UNSUCCESSFUL


# --- the command line -------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="anex", description="The anex batch API from a terminal. Reads ANEX_API_KEY and "
        f"ANEX_BASE_URL (default {DEFAULT_BASE_URL}).",
        epilog="Exit codes: 0 done, 1 API error, 2 usage, 3 job failed or cancelled (or "
               "failing rows found), 4 estimate not approved, 5 not offered by this server.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout, and no bars or prompts' noise")
    common.add_argument("--insecure", action="store_true",
                        help="allow plain http:// to a machine other than this one")
    commands = top.add_subparsers(dest="command", required=True)

    submit = commands.add_parser("submit", parents=[common],
                                 help="upload a file, show the estimate, approve, run")
    submit.add_argument("file", help="a JSONL (or .parquet) file of requests")
    submit.add_argument("--model", required=True)
    submit.add_argument("--max-output-tokens", type=int, default=None)
    submit.add_argument("--priority", choices=PRIORITIES, default=None,
                        help="the urgency tier: flex (half price, within 72 h), standard (the "
                             "server's default) or priority (1.75x, dispatched first)")
    submit.add_argument("--approve", action="store_true", help="approve without asking")
    submit.add_argument("--wait", action="store_true",
                        help="wait for the job to end and download its result")
    submit.add_argument("-o", "--output", help="where to write the result (implies --wait; "
                                               "default JOB_ID.jsonl)")
    submit.set_defaults(run=cmd_submit)

    check = commands.add_parser("check", parents=[common],
                                help="check a file's rows for a model; print every failing row")
    check.add_argument("file")
    check.add_argument("--model", required=True)
    check.set_defaults(run=cmd_check)

    for name, run, text in (
            ("status", cmd_status, "a job's status, estimate and progress"),
            ("approve", _state_command("approve"), "approve a job's estimate"),
            ("cancel", _state_command("cancel"), "cancel a job"),
            ("result", cmd_result, "download a job's result"),
            ("rerun", cmd_rerun, "run a finished job's failed rows again as a new job")):
        command = commands.add_parser(name, parents=[common], help=text)
        command.add_argument("job", help="the job id")
        if name == "result":
            command.add_argument("-o", "--output", help="default JOB_ID.jsonl")
        if name == "rerun":
            command.add_argument("--include", metavar="OUTCOMES", default=None,
                                 help="comma-separated outcomes to run again: error, "
                                      "truncated, format_error (default: error)")
        command.set_defaults(run=run)
    tail = commands.add_parser("tail", parents=[common],
                               help="write a job's rows as they finish, until it ends")
    tail.add_argument("job", help="the job id")
    tail.add_argument("-o", "--output", metavar="FILE",
                      help="append to FILE (going on from the rows it holds) and, once the "
                           "job has ended, replace it by the result file; default stdout")
    tail.add_argument("--interval", type=float, default=TAIL_INTERVAL_SECONDS, metavar="S",
                      help=f"seconds between polls (default {TAIL_INTERVAL_SECONDS:g})")
    tail.set_defaults(run=cmd_tail)
    return top


def fail(error: CliError, *, as_json: bool) -> NoReturn:
    if as_json:
        print(json.dumps({"error": {"status": error.status, "message": error.message}}))
    else:
        print(f"anex: {printable(error.message)}", file=sys.stderr)
    raise SystemExit(error.code)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    key = os.environ.get("ANEX_API_KEY", "").strip()
    try:
        if not key:
            raise CliError("Set ANEX_API_KEY to an API key (make run prints its demo key; "
                           "the console's Keys page makes others).", EXIT_USAGE)
        base = os.environ.get("ANEX_BASE_URL") or DEFAULT_BASE_URL
        problem = transport_problem(base_url(base), insecure=args.insecure)
        if problem:
            raise CliError(f"ANEX_BASE_URL {problem}", EXIT_USAGE)
        api = Api(base, key, insecure=args.insecure)
        code: int = args.run(api, args)
    except CliError as error:
        fail(error, as_json=args.json)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
