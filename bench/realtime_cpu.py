"""The web tier's CPU per realtime request, this checkout against a baseline, in one run.

    flock /tmp/heavy.lock python -m anex.devstack exec -- \
        .venv/bin/python bench/realtime_cpu.py [--baseline REF] [--seconds 6] [--rounds 3] \
        [--cases embeddings systemone "job read"]

Each side is a gunicorn started as the web role starts it (anex/roles.py: the access log,
its masking logger), with one worker of 16 threads and its own metrics directory (as
`make run` gives each web worker), from its own checkout: this one, and REF's files
unpacked into a temporary directory (default BASELINE, the commit before the realtime
fast path). Both forward to one stub engine server on loopback (a thread here
answering canned vectors and decisions at once), so what is measured is the web tier
alone: the gunicorn worker's CPU time (/proc, user + system) over the requests it answered,
for a one-text embedding and a one-question decision, sent by CLIENTS keep-alive clients,
and for the batch API's job poll (GET /batch/v1/jobs/{id}, the load test's job read; the
baseline JOB_READ_BASELINE is the commit before its prepared read).
The sides take turns, `--rounds` rounds each, and the figure is each side's median round;
the ratio is this checkout's over the baseline's.

A second figure is taken in process: each side's Django (a child process in its checkout)
answers N requests through its WSGI application, without gunicorn or sockets on the
client side, and the request thread's CPU time (time.thread_time) is divided by N.

The web tier counts inputs with the model's tokenizer when it has the checkpoint
(ANEX_CHECKPOINTS, as `make run` gives it); without one it falls back to byte bounds, a
little cheaper: the environment's value is passed to both sides alike. Nothing here is the
load test's figure (bench/realtime_load.py: make run's two workers, the engines, the mix,
everything on the same cores); this one isolates the web tier's own work per request.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The commit before the realtime fast path
# (docs/dev/decisions/2026-12-02-the-realtime-fast-path.md).
BASELINE = "65ecd33"
CLIENTS = 4
THREADS = 16  # a make run web worker's
WARM_UP_SECONDS = 1.0
IN_PROCESS_REQUESTS = 1500
MINILM = "all-minilm-l6-v2"
EMBEDDING: dict[str, Any] = {"model": MINILM, "input": "How do I cancel a running job?"}
DECISION: dict[str, Any] = {
    "model": "laya", "state": {"body": "We were billed twice for March. Please refund it."},
    "questions": {"urgent": {"type": "noul",
                             "instructions": "Does the customer need an answer today?"}}}
# (name, path, body): a body is POSTed, None is a GET; {job} is the bench's job.
CASES: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("embeddings", "/realtime/v1/embeddings", EMBEDDING),
    ("systemone", "/realtime/v1/systemone", DECISION),
    ("job read", "/batch/v1/jobs/{job}", None))
# The commit before GET /jobs/{id}'s prepared read
# (docs/dev/decisions/2026-12-03-the-job-poll-compiled-once.md).
JOB_READ_BASELINE = "36f0bd3"


# -- the stub engine -----------------------------------------------------------------------

def _engine_answer(path: str, body: dict[str, Any]) -> bytes:
    if path.endswith("/embeddings"):
        return json.dumps({"data": [{"embedding": [1.0] + [0.0] * 383, "prompt_tokens": 9}
                                    for _ in body.get("input", [])]}).encode()
    return json.dumps({
        "answers": {name: {"type": "noul", "noul": 0.9, "confidence": 0.9,
                           "answer_confidence": 0.9} for name in body.get("questions", {})},
        "input_tokens": 21, "routing": {"model": "english", "reason": "text is Latin"},
    }).encode()


class _Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = _engine_answer(self.path, body)
        # One write: headers and body in one segment, no delayed-ACK stall.
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(answer) + answer)

    def do_GET(self) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the sides -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def baseline_checkout(ref: str) -> Iterator[Path]:
    """REF's files in a temporary directory (git archive: the repository is not touched)."""
    with tempfile.TemporaryDirectory(prefix="anex-baseline-") as tmp:
        git = shutil.which("git") or "git"
        archive = subprocess.run([git, "archive", "--format=tar", ref], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class Web:
    """One side's gunicorn: the web role's command, one worker, from its checkout."""

    def __init__(self, name: str, tree: Path, env: dict[str, str], threads: int) -> None:
        self.name, self.tree = name, tree
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        # Its own empty metrics directory, as make run gives the web role (the request
        # counters are then kept in prometheus_client's multiprocess files).
        self.metrics = tempfile.TemporaryDirectory(prefix="anex-bench-metrics-")
        env = {**env, "ANEX_WEB_BIND": f"127.0.0.1:{self.port}", "ANEX_WEB_WORKERS": "1",
               "ANEX_WEB_THREADS": str(threads), "PYTHONPATH": str(tree),
               "PROMETHEUS_MULTIPROC_DIR": self.metrics.name}
        # The role's own command line, as that checkout builds it, run in its tree.
        argv = json.loads(subprocess.run(
            [sys.executable, "-c", "import json, sys; sys.argv = ['x']; import django; "
             "django.setup(); from anex.roles import command; "
             "print(json.dumps(command('web')))"],
            cwd=tree, env=env, check=True, capture_output=True, text=True).stdout)
        self.process = subprocess.Popen(argv, cwd=tree, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{name}: gunicorn exited: {self.log.read()[-2000:]!r}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2):  # noqa: S310
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: gunicorn did not answer") from None
                time.sleep(0.3)
        (self.worker,) = _children(self.process.pid)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:].decode(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
        self.metrics.cleanup()


def load(url: str, path: str, body: dict[str, Any] | None, headers: dict[str, str],
         seconds: float, worker: int) -> tuple[int, float]:
    """CLIENTS keep-alive clients sending `body` (None: a GET) for `seconds` after a
    warm-up: the requests answered in the measured window and the worker's CPU seconds
    over it."""
    import urllib3

    payload = None if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    answered = [0]
    failures: list[str] = []
    lock = threading.Lock()
    start = time.monotonic() + WARM_UP_SECONDS
    stop = start + seconds
    measured = threading.Event()
    cpu: list[float] = []

    def client() -> None:
        pool = urllib3.connection_from_url(url, maxsize=1, retries=False)
        mine = 0
        while (now := time.monotonic()) < stop:
            response = pool.urlopen(method, path, body=payload, headers=headers)
            if response.status != 200:
                with lock:
                    failures.append(f"{response.status} {response.data[:200]!r}")
            elif now >= start:
                mine += 1
        with lock:
            answered[0] += mine

    def meter() -> None:
        time.sleep(max(0.0, start - time.monotonic()))
        before = _cpu_seconds(worker)
        time.sleep(max(0.0, stop - time.monotonic()))
        cpu.append(_cpu_seconds(worker) - before)
        measured.set()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    threads.append(threading.Thread(target=meter))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, first: {failures[0]}")
    return answered[0], cpu[0]


# -- in process (a child per side, in its checkout) ----------------------------------------

def in_process_child(path: str, body: dict[str, Any] | None, key: str, count: int) -> float:
    """This checkout's WSGI application answering `count` requests: thread CPU ms each."""
    import django

    django.setup()
    from django.core.wsgi import get_wsgi_application

    application = get_wsgi_application()
    payload = b"" if body is None else json.dumps(body).encode()

    def call() -> None:
        environ = {
            "REQUEST_METHOD": "GET" if body is None else "POST", "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(payload)),
            "HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_HOST": "127.0.0.1:8000",
            "wsgi.input": io.BytesIO(payload), "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True,
            "wsgi.run_once": False, "wsgi.version": (1, 0)}
        status: list[str] = []

        def start_response(line: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(line)
            return lambda data: None

        answer = application(environ, start_response)
        b"".join(answer)
        answer.close()
        if not status[0].startswith("200"):
            raise SystemExit(f"in process: {status[0]}")

    for _ in range(200):
        call()
    started = time.thread_time()
    for _ in range(count):
        call()
    return (time.thread_time() - started) / count * 1000


def in_process(tree: Path, env: dict[str, str], path: str, body: dict[str, Any] | None,
               key: str) -> float:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", path, json.dumps(body),
         key, str(IN_PROCESS_REQUESTS)],
        cwd=tree, env={**env, "PYTHONPATH": str(tree), "ANEX_BENCH_TREE": str(tree)},
        check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


# -- the run -------------------------------------------------------------------------------

def setup_key() -> tuple[str, str]:
    """An organization with credits, a key and a priced job, in the environment's
    database: the key's plaintext and the job's id."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from billing.services import credits_grant
    from console.actors import Actor
    from console.services import api_key_create, organization_create
    from jobs.constants import JobStatus
    from jobs.models import Job

    call_command("migrate", "--noinput", verbosity=0)
    system = Actor(system="bench")
    organization = organization_create(name="realtime cpu bench", actor=system)
    credits_grant(organization=organization, cents=1_000_000, reason="bench", actor=system)
    _key, plaintext = api_key_create(organization=organization, actor=system, name="bench")
    job = Job.objects.create(organization=organization, model=MINILM,
                             status=JobStatus.COST_READY, est_cost_cents=1, row_count=1)
    return plaintext, str(job.pk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="git ref to compare against")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=THREADS, help="the worker's threads")
    parser.add_argument("--cases", nargs="+", choices=[case[0] for case in CASES],
                        default=[case[0] for case in CASES])
    args = parser.parse_args()
    key, job_id = setup_key()
    cases = [(case, path.format(job=job_id), body) for case, path, body in CASES
             if case in args.cases]
    results: dict[tuple[str, str], list[float]] = {}
    with engine() as engine_url, baseline_checkout(args.baseline) as tree:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "anex.settings",
               "ANEX_REALTIME_ENGINES": f"{MINILM}={engine_url};laya={engine_url}",
               "ANEX_REALTIME_ENGINE_SECRET": secrets.token_hex(16),
               "ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE": "100000000",
               "ANEX_ORG_RATE_LIMIT_PER_MINUTE": "100000000",
               "ANEX_REALTIME_CONCURRENCY": "1000"}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        sides = {"baseline": tree, "this": ROOT}
        print(f"realtime web tier CPU per request: {os.cpu_count()} CPUs, baseline "
              f"{args.baseline}, {CLIENTS} clients, gunicorn 1 worker x {args.threads} threads, "
              f"{args.rounds} rounds of {args.seconds:g} s a side, tokenizers "
              f"{'on' if env.get('ANEX_CHECKPOINTS') else 'off'}")
        webs = {name: Web(name, path, env, args.threads) for name, path in sides.items()}
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        try:
            for case, path, body in cases:
                for web in webs.values():  # warm: the first requests load and connect
                    load(web.url, path, body, headers, 2.0, web.worker)
                for _ in range(args.rounds):
                    for name, web in webs.items():
                        answered, cpu = load(web.url, path, body, headers, args.seconds,
                                             web.worker)
                        results.setdefault((case, name), []).append(cpu / answered * 1000)
        except SystemExit:
            for web in webs.values():
                print(f"-- {web.name}'s gunicorn log, its end:\n{web.log_tail()}")
            raise
        finally:
            for web in webs.values():
                web.stop()
        inproc = {(case, name): in_process(path_, env, path, body, key)
                  for case, path, body in cases for name, path_ in sides.items()}
    width = 6 * args.rounds
    print(f"{'request':<12}{'side':<10}{'gunicorn ms':>12}  {'rounds':<{width}}"
          f"{'in process ms':>15}")
    for case, _path, _body in cases:
        for name in sides:
            rounds = results[(case, name)]
            print(f"{case:<12}{name:<10}{statistics.median(rounds):>12.2f}  "
                  f"{' '.join(f'{r:5.2f}' for r in rounds):<{width}}"
                  f"{inproc[(case, name)]:>15.2f}")
        ratio = (statistics.median(results[(case, "this")])
                 / statistics.median(results[(case, "baseline")]))
        inratio = inproc[(case, "this")] / inproc[(case, "baseline")]
        print(f"{case:<12}{'ratio':<10}{ratio:>12.2f}  {'':<{width}}{inratio:>15.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.path.insert(0, os.environ.get("ANEX_BENCH_TREE", str(ROOT)))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
        print(in_process_child(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4],
                               int(sys.argv[5])))
    else:
        main()
