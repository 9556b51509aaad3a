"""A load test of the realtime API beside the batch API, with locust, against `make run`.

    ANEX_ORG_RATE_LIMIT_PER_MINUTE=10000000 make run     # in one terminal
    ANEX_RUN_DIR=.run python -m anex.devstack exec -- \
        .venv/bin/python bench/realtime_load.py [--url http://localhost:8000] [--step 60] \
        [--honour-retry-after]

With --access-log (the log `make run` writes: gunicorn's access lines, each ending in the
seconds the server took) it also prints each step's job reads as the server timed them,
apart from the client's wait for its own turn: the client shares the machine's cores.
The users are locust's FastHttpUser (geventhttpclient) unless `--client requests` (locust's
HttpUser, python-requests, several times the CPU a request on the client's side).

(The load test's organization sends everything with one key, whose own limit it sets high;
the organization-wide API rate, 3,000 a minute by default, is the web tier's setting, so
`make run` is started with it raised: otherwise the steps past 32 users measure that limit,
and the run says so.)

The mix per simulated customer: 70 % realtime embeddings, 10 % realtime decisions, 15 %
batch job reads (GET /batch/v1/jobs/{id}), 5 % an upload and a submit. The users ramp
1 -> 32 -> 128 -> 256, `--step` seconds a step (60 by default; shorten it on a small
machine). A user asks again at once after a refusal, a client that ignores Retry-After
(the harsher load); with --honour-retry-after it waits the refusal's Retry-After first, as
the openai SDK does before it retries. Then it checks, through the database and Redis of
the environment (the same ANEX_RUN_DIR as `make run`):

- no 5xx up to saturation, and past it only 429 or 503, each with Retry-After;
- answered realtime requests equal the usage rows metered for them (plus at most those the
  client gave up on: a request served after its client left is billed, its work was done);
- once settled, the ledger's realtime charges equal the settled sum, floored;
- no concurrency slot and no reservation is left in Redis;
- GET /batch/v1/jobs/{id} p99 per step (the target: 100 ms while realtime is saturated);
- the web tier's CPU per request, per step (the gunicorn workers' CPU time in the step,
  read from /proc at each step's end, divided by the requests the step answered, refusals
  included; the 1-user step, where nothing is refused, is the figure to compare with the
  3.5 ms target), and the realtime requests/s of the busiest step whose p99 is within
  150 ms.

Locust lets each user finish the request it has in flight when the run ends (its stop
timeout), so every request the server answered is also counted by the client.

It prints the figures and exits 1 when an assertion fails. The locust side runs in its own
process (gevent patches sockets, which the Django side must not share): this file is both
the driver (`main`) and the locustfile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
STEPS = (1, 32, 128, 256)
MINILM = "all-minilm-l6-v2"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Does the customer need an answer "
                                                       "today?"},
             "team": {"type": "choice", "instructions": "Which team should handle this?",
                      "criteria": {"billing": "invoices, payments, refunds",
                                   "technical": "bugs and outages", "other": "anything else"}}}
REALTIME = ("embeddings", "systemone")


# -- the locust side ----------------------------------------------------------------------

if os.environ.get("ANEX_LOAD_KEY"):
    from locust import FastHttpUser, HttpUser, LoadTestShape, events, task
    from urllib3 import encode_multipart_formdata

    KEY = os.environ["ANEX_LOAD_KEY"]
    JOB = os.environ["ANEX_LOAD_JOB"]
    STEP_SECONDS = float(os.environ.get("ANEX_LOAD_STEP", "60"))
    RECORD = Path(os.environ["ANEX_LOAD_RECORD"])
    HONOUR_RETRY_AFTER = os.environ.get("ANEX_LOAD_HONOUR_RETRY_AFTER") == "1"
    CLIENT = FastHttpUser if os.environ.get("ANEX_LOAD_CLIENT", "fast") == "fast" else HttpUser
    UPLOAD = b"".join(json.dumps({"custom_id": f"r{i}", "body": {"input": f"text {i}"}}
                                 ).encode() + b"\n" for i in range(20))
    seen: list[tuple[float, str, int, float, bool]] = []
    # Requests sent and not yet answered, by (user, start): any still here when locust
    # quits (a user stopped mid-request) are recorded as given up on (status 0), since the
    # server may have answered and billed them.
    pending: dict[tuple[int, float], str] = {}

    def sending(user: Any, name: str) -> float:
        started = time.time()
        pending[(id(user), started)] = name
        return started

    def answered(response: Any, name: str, started: float, user: Any = None) -> None:
        """Record one answer; a refusal past saturation (429/503) must carry Retry-After
        (which the user, with --honour-retry-after, waits before its next request)."""
        pending.pop((id(user), started), None)
        status = response.status_code
        retry_after = response.headers.get("Retry-After")
        has_retry = retry_after is not None
        if user is not None and HONOUR_RETRY_AFTER and status in (429, 503) and has_retry:
            user.backoff = float(retry_after)
        seen.append((started, name, status, (time.time() - started) * 1000,
                     status not in (429, 503) or has_retry))
        if status < 500 or (status == 503 and has_retry):
            response.success()
        else:
            response.failure(f"{status}")

    class Customer(CLIENT):  # type: ignore[valid-type,misc]
        backoff = 0.0  # the Retry-After of its last refusal, with --honour-retry-after
        default_headers = {"Authorization": f"Bearer {KEY}"}  # FastHttpUser's

        def wait_time(self) -> float:
            """No wait between requests, or after a refusal the seconds its Retry-After
            said (as the openai SDK does before it retries) with --honour-retry-after."""
            backoff, self.backoff = self.backoff, 0.0
            return backoff

        def on_start(self) -> None:
            if CLIENT is HttpUser:
                self.client.headers.update(self.default_headers)

        @task(70)
        def embed(self) -> None:
            started = sending(self, "embeddings")
            with self.client.post("/realtime/v1/embeddings", name="embeddings",
                                  json={"model": MINILM, "input": "a search query "
                                        f"{int(started * 1000) % 997}"},
                                  catch_response=True) as response:
                answered(response, "embeddings", started, self)

        @task(10)
        def decide(self) -> None:
            started = sending(self, "systemone")
            with self.client.post("/realtime/v1/systemone", name="systemone",
                                  json={"model": "laya", "state": "We were billed twice for "
                                        "March. Please refund it today.",
                                        "questions": QUESTIONS},
                                  catch_response=True) as response:
                answered(response, "systemone", started, self)

        @task(15)
        def read_job(self) -> None:
            started = time.time()
            with self.client.get(f"/batch/v1/jobs/{JOB}", name="job read",
                                 catch_response=True) as response:
                answered(response, "job read", started)

        @task(5)
        def upload_and_submit(self) -> None:
            started = time.time()
            with self.client.post("/batch/v1/inputs", name="upload", json={"format": "jsonl"},
                                  catch_response=True) as response:
                answered(response, "upload", started)
                if response.status_code != 201 and response.status_code != 200:
                    return
                target = response.json()
            # The upload target is the storage's own URL (no API key needed there); the form
            # is built here, for both clients (FastHttpUser takes no `files`).
            form, content_type = encode_multipart_formdata(
                [*target["fields"].items(), ("file", ("input.jsonl", UPLOAD))])
            self.client.post(target["upload_url"], name="upload file", data=form,
                             headers={"Content-Type": content_type})
            started = time.time()
            with self.client.post("/batch/v1/jobs", name="submit", json={
                    "input_id": target["id"], "model": MINILM}, catch_response=True) as response:
                answered(response, "submit", started)

    class Ramp(LoadTestShape):
        """1 -> 32 -> 128 -> 256 users, STEP_SECONDS each, then stop."""

        def tick(self) -> tuple[int, float] | None:
            step = int(self.get_run_time() // STEP_SECONDS)
            if step >= len(STEPS):
                return None
            return STEPS[step], float(STEPS[step])  # spawned within a second

    @events.quitting.add_listener
    def _record(environment: Any, **kwargs: Any) -> None:
        seen.extend((started, name, 0, -1.0, True)
                    for (_user, started), name in list(pending.items()))
        RECORD.write_text(json.dumps(seen))


# -- the driver ---------------------------------------------------------------------------

def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _gunicorn_workers(url: str) -> list[int]:
    """The processes holding the socket that listens on url's port (the gunicorn master and
    its workers, which rename themselves): their CPU time is read, nothing is sent to them."""
    port = urlsplit(url).port or 80
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if links & inodes:
            found.append(int(proc.name))
    return found


def _step_cpu_sampler(workers: list[int], started: float, step: float) -> list[float]:
    """The web tier's CPU seconds in each step, filled in by a thread at each step's end."""
    import threading

    cpu: list[float] = []

    def sample() -> None:
        last = _cpu_seconds(workers)
        for index in range(len(STEPS)):
            time.sleep(max(0.0, started + (index + 1) * step - time.time()))
            now = _cpu_seconds(workers)
            cpu.append(now - last)
            last = now

    threading.Thread(target=sample, daemon=True).start()
    return cpu


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://localhost:8000")
    parser.add_argument("--step", type=float, default=60.0, help="seconds a step")
    parser.add_argument("--honour-retry-after", action="store_true",
                        help="each user waits a refusal's Retry-After before its next "
                             "request (by default it asks again at once)")
    parser.add_argument("--client", choices=("fast", "requests"), default="fast",
                        help="locust's FastHttpUser (default) or HttpUser (python-requests)")
    parser.add_argument("--access-log", type=Path,
                        help="make run's output: also report the job reads as the server "
                             "timed them")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from billing.constants import EntryKind
    from billing.models import LedgerEntry
    from billing.services import credits_grant
    from console.actors import Actor
    from console.services import api_key_create, organization_create
    from realtime.concurrency import reservations_in_flight, slots_in_flight
    from realtime.models import RealtimeSettlement, RealtimeUsage
    from realtime.services.settlement import realtime_charges_settle_all

    system = Actor(system="load test")
    organization = organization_create(name=f"load test {int(time.time())}", actor=system)
    credits_grant(organization=organization, cents=1_000_000, reason="load test", actor=system)
    key, plaintext = api_key_create(organization=organization, actor=system, name="load",
                                    rate_limit_per_minute=10_000_000)
    job_id = _first_job(args.url, plaintext)
    workers = _gunicorn_workers(args.url)
    if not workers:
        raise SystemExit("no gunicorn serving anex.wsgi on this machine: start `make run`")
    with tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "seen.json"
        cpu_before = _cpu_seconds(workers)
        started = time.time()
        step_cpu = _step_cpu_sampler(workers, started, args.step)
        subprocess.run(
            [sys.executable, "-m", "locust", "-f", __file__, "--headless", "--host", args.url,
             "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "60"],
            env={**os.environ, "ANEX_LOAD_KEY": plaintext, "ANEX_LOAD_JOB": str(job_id),
                 "ANEX_LOAD_STEP": str(args.step), "ANEX_LOAD_RECORD": str(record),
                 "ANEX_LOAD_HONOUR_RETRY_AFTER": "1" if args.honour_retry_after else "0",
                 "ANEX_LOAD_CLIENT": args.client},
            cwd=ROOT, check=False)
        cpu = _cpu_seconds(workers) - cpu_before
        seen = json.loads(record.read_text())
    problems = _report(seen, started, args.step, cpu, step_cpu)
    if args.access_log:
        _report_server_side(args.access_log, str(job_id), started, args.step)
    # The invariants, once the requests in flight have ended and the usage is settled.
    time.sleep(2)
    realtime_charges_settle_all(settled_before=_now())
    answered = sum(1 for _t, name, status, _ms, _ok in seen if name in REALTIME and status == 200)
    # A request whose client gave up (status 0: no answer reached it) may still have been
    # served and billed: the engine did the work.
    lost = sum(1 for _t, name, status, _ms, _ok in seen if name in REALTIME and status == 0)
    usage = RealtimeUsage.objects.filter(organization=organization).count()
    last = RealtimeSettlement.objects.filter(api_key=key).order_by("-id").first()
    charged = -sum(LedgerEntry.objects.filter(organization=organization, job=None,
                                              kind=EntryKind.CHARGE)
                   .values_list("balance_delta", flat=True))
    slots = slots_in_flight(organization_id=organization.pk)
    held = reservations_in_flight(organization_id=organization.pk)
    print(f"answered realtime {answered} (and {lost} the client gave up on), usage rows "
          f"{usage}; settled "
          f"{last.charged_cents if last else 0} credits, ledger charged {charged}; "
          f"slots left {slots}, reservations left {held}")
    problems += [p for p, bad in (
        ("usage rows not between the answered requests and those plus the ones the client "
         "gave up on", not answered <= usage <= answered + lost),
        ("ledger charges != settled sum", charged != (last.charged_cents if last else 0)),
        ("slots or reservations left in Redis", slots or held)) if bad]
    for problem in problems:
        print(f"FAILED: {problem}")
    raise SystemExit(1 if problems else 0)


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def _first_job(url: str, plaintext: str) -> str:
    """A job of the load test's organization to read: one small embedding job."""
    import requests

    auth = {"Authorization": f"Bearer {plaintext}"}
    target = requests.post(f"{url}/batch/v1/inputs", json={"format": "jsonl"}, headers=auth,
                           timeout=30).json()
    line = json.dumps({"custom_id": "r0", "body": {"input": "hello"}}).encode() + b"\n"
    requests.post(target["upload_url"], data=target["fields"],
                  files={"file": ("input.jsonl", line)}, timeout=30).raise_for_status()
    job = requests.post(f"{url}/batch/v1/jobs", json={"input_id": target["id"],
                                                      "model": MINILM},
                        headers=auth, timeout=30)
    job.raise_for_status()
    return str(job.json()["id"])


def _report(seen: list[list[Any]], started: float, step: float, cpu: float,
            step_cpu: list[float]) -> list[str]:
    """The figures per step; what broke the rules."""
    problems = []
    print(f"{'users':>6} {'request':<12} {'n':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"statuses")
    best = 0.0
    for index, users in enumerate(STEPS):
        low, high = started + index * step, started + (index + 1) * step
        # (less the requests still unanswered when locust quit: no time to count)
        rows = [row for row in seen if low <= row[0] < high and row[3] >= 0]
        for name in ("embeddings", "systemone", "job read", "upload", "submit"):
            mine = [row for row in rows if row[1] == name]
            if not mine:
                continue
            times = [row[3] for row in mine]
            statuses: dict[int, int] = {}
            for row in mine:
                statuses[row[2]] = statuses.get(row[2], 0) + 1
            p99 = _percentile(times, 0.99)
            print(f"{users:>6} {name:<12} {len(mine):>7} {len(mine) / step:>8.1f} "
                  f"{_percentile(times, 0.5):>8.1f} {p99:>8.1f} {statuses}")
        realtime = [row for row in rows if row[1] in REALTIME and row[2] == 200]
        if realtime and _percentile([row[3] for row in realtime], 0.99) <= 150:
            best = max(best, len(realtime) / step)
        if index < len(step_cpu) and rows:
            print(f"{users:>6} web tier CPU {step_cpu[index]:.1f} s over {len(rows)} requests "
                  f"answered: {step_cpu[index] / len(rows) * 1000:.2f} ms a request")
    fives = [row for row in seen if row[2] >= 500 and not (row[2] == 503 and row[4])]
    unretried = [row for row in seen if not row[4]]
    answered = sum(1 for row in seen if row[1] in REALTIME and row[2] == 200)
    print(f"web tier CPU {cpu:.1f} s over {answered} answered realtime requests: "
          f"{cpu / max(answered, 1) * 1000:.2f} ms a request (batch requests' CPU included)")
    print(f"realtime requests/s at p99 <= 150 ms: {best:.1f}")
    # (A submit's 429 is the reference's own: ten jobs awaiting approval already.)
    limited = [row for row in seen if row[2] == 429 and row[1] != "submit"]
    if limited:
        problems.append(f"{len(limited)} answers 429: the load test's organization reached a "
                        "rate limit (start make run with ANEX_ORG_RATE_LIMIT_PER_MINUTE "
                        "raised), so those steps measured the limit, not saturation")
    if fives:
        problems.append(f"{len(fives)} answers 5xx other than 503 with Retry-After "
                        f"(first: {fives[0][1]} {fives[0][2]})")
    if unretried:
        problems.append(f"{len(unretried)} 429/503 without Retry-After")
    return problems


def _report_server_side(log: Path, job_id: str, started: float, step: float) -> None:
    """Each step's job reads as gunicorn timed them (its access line's last field: from
    reading the request to the response written), beside the client's times above, which
    also hold the wait for the client's own turn on the shared cores."""
    from datetime import datetime

    path = f'"GET /batch/v1/jobs/{job_id} '
    times: list[tuple[float, float]] = []  # (when, ms)
    for line in log.read_text(errors="replace").splitlines():
        if path not in line:
            continue
        try:
            stamp = line.split("[", 1)[1].split("]", 1)[0]
            when = datetime.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z").timestamp()
            times.append((when, float(line.rsplit(" ", 1)[1]) * 1000))
        except (IndexError, ValueError):
            continue
    print("job reads as the server timed them (access log):")
    for index, users in enumerate(STEPS):
        low, high = started + index * step, started + (index + 1) * step
        mine = [ms for when, ms in times if low <= when < high]
        if mine:
            print(f"{users:>6} {'job read':<12} {len(mine):>7} {len(mine) / step:>8.1f} "
                  f"{_percentile(mine, 0.5):>8.1f} {_percentile(mine, 0.99):>8.1f}")


if __name__ == "__main__":
    main()
