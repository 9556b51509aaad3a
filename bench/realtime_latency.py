"""Realtime latency: p50/p99 and requests/s for a single-text embedding (MiniLM) and a
three-question decision (laya on tiny-qwen3), at 1, 8 and 32 concurrent clients, through
anex (gunicorn as `make run` runs it: authentication, checks, the concurrency slot, the
forward over a pooled connection, billing) and sent straight to the engine server process;
our overhead per percentile is the difference.

    python -m anex.devstack exec -- .venv/bin/python bench/realtime_latency.py [SECONDS]

It starts what `make run` starts for realtime (one engine server per model, gunicorn with
2 workers x 16 threads) on free ports, with the local checkpoints ($ANEX_RUN_DIR/checkpoints,
built if missing), and an organization with credits in the database of the environment.
Each client is a thread with its own keep-alive connection; every level runs SECONDS
(default 8) after a short warm-up, direct first, then through anex. "per call" is how many
requests one engine call answered on average (the engine server's micro-batching).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")

MINILM = "all-minilm-l6-v2"
QUERY = "How do I cancel a running job?"
CONCURRENCY = (1, 8, 32)
WARM_UP_SECONDS = 1.5
EMBEDDING: dict[str, Any] = {"model": MINILM, "input": QUERY}
DECISION: dict[str, Any] = {
    "model": "laya",
    "state": {"body": "We were billed twice for March. Please refund it today."},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "invoices, payments, refunds",
                              "technical": "bugs and outages", "other": "everything else"}},
        "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
        "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                        "criteria": ["calm", "annoyed", "angry"]}}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer in {timeout:.0f} s")


# What the web server and the engine servers share; the direct side signs with it too.
SECRET = secrets.token_hex(32)


def signed(headers: dict[str, str], url: str, body: dict[str, Any]
           ) -> Callable[[], dict[str, str]]:
    """Headers for each request straight to an engine server, signed as the web tier signs
    them: a fresh timestamp and nonce per request (an engine server answers a nonce once)."""
    import hashlib

    from realtime.engine_client import deadline_seconds, engine_signed_headers

    parts = urllib3.util.parse_url(url)
    host, path = f"{parts.host}:{parts.port}", parts.path or "/"
    timeout_ms = str(int(deadline_seconds() * 1000))
    digest = hashlib.sha256(json.dumps(body).encode()).hexdigest()

    def sign() -> dict[str, str]:
        return {**headers, "X-Anex-Timeout-Ms": timeout_ms, **engine_signed_headers(
            SECRET, host=host, path=path, timeout_ms=timeout_ms, body_digest=digest)}

    return sign


@contextmanager
def stack(env: dict[str, str]) -> Iterator[tuple[dict[str, str], str]]:
    """The engine servers and the web server, as make run starts them."""
    processes: list[subprocess.Popen[bytes]] = []
    engines: dict[str, str] = {}
    quiet = subprocess.DEVNULL
    try:
        for model_id in (MINILM, "laya"):
            port = free_port()
            processes.append(subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "serve_realtime", "--model", model_id,
                 "--port", str(port)], env=env, cwd=ROOT, stdout=quiet, stderr=quiet))
            engines[model_id] = f"http://127.0.0.1:{port}"
        web_port = free_port()
        web_env = {**env, "ANEX_REALTIME_ENGINES": ";".join(f"{m}={u}" for m, u in
                                                            engines.items()),
                   "ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE": "10000000"}
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "anex.wsgi:application", "--bind",
             f"127.0.0.1:{web_port}", "--workers", "2", "--threads", "16"],
            env=web_env, cwd=ROOT, stdout=quiet, stderr=quiet))
        for url, process in zip(engines.values(), processes, strict=False):
            wait_for(f"{url}/health", process)
        wait_for(f"http://127.0.0.1:{web_port}/healthz", processes[-1])
        yield engines, f"http://127.0.0.1:{web_port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


@dataclass
class Level:
    latencies: list[float]
    seconds: float
    errors: int

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


def load(url: str, body: dict[str, Any], headers: Callable[[], dict[str, str]], clients: int,
         seconds: float) -> Level:
    """`clients` threads sending `body` back to back for `seconds` (after a warm-up), each
    request with the headers `headers()` gives."""
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    errors = [0]
    failures: dict[int, bytes] = {}
    lock = threading.Lock()
    start = time.monotonic() + WARM_UP_SECONDS
    stop = start + seconds

    path = urllib3.util.parse_url(url).path or "/"

    def client() -> None:
        pool = urllib3.connection_from_url(url, maxsize=1, retries=False)
        mine: list[float] = []
        while (now := time.monotonic()) < stop:
            response = pool.urlopen("POST", path, body=payload, headers=headers())
            took = time.monotonic() - now
            if response.status != 200:
                with lock:
                    errors[0] += 1
                    failures[response.status] = response.data[:200]
            elif now >= start:
                mine.append(took)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for status, answer in failures.items():
        print(f"  ({status} from {url}: {answer.decode(errors='replace')})")
    return Level(latencies=latencies, seconds=seconds, errors=errors[0])


@dataclass(frozen=True)
class Batching:
    calls: int
    requests: int

    def __sub__(self, other: Batching) -> Batching:
        return Batching(self.calls - other.calls, self.requests - other.requests)

    @property
    def per_call(self) -> float:
        """Requests one engine call answered, on average (the micro-batching)."""
        return self.requests / self.calls if self.calls else 0.0


def batching(engine: str) -> Batching:
    with urllib.request.urlopen(f"{engine}/health", timeout=5) as response:  # noqa: S310
        (served,) = json.loads(response.read())["models"].values()
    return Batching(served["engine_calls"], served["requests"])


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from billing.services import credits_grant
    from console.actors import Actor
    from console.services import api_key_create, organization_create
    from inference.checkpoints import anex_checkpoints_value, checkpoints_build

    call_command("migrate", "--noinput", verbosity=0)
    checkpoints = anex_checkpoints_value(checkpoints_build())
    system = Actor(system="bench")
    organization = organization_create(name="realtime bench", actor=system)
    credits_grant(organization=organization, cents=100_000, reason="bench", actor=system)
    _key, plaintext = api_key_create(organization=organization, actor=system, name="bench")
    env = {**os.environ, "ANEX_CHECKPOINTS": checkpoints,
           "ANEX_REALTIME_CONCURRENCY": "1000", "ANEX_REALTIME_ENGINE_SECRET": SECRET,
           "ANEX_REALTIME_PROCESS_CONCURRENCY": "1000"}
    print(f"realtime latency, {os.cpu_count()} CPUs, {seconds:g} s per level, "
          f"Django {django.get_version()}, DEBUG={settings.DEBUG}")
    with stack(env) as (engines, web):
        auth = {"Authorization": f"Bearer {plaintext}", "Content-Type": "application/json"}
        plain = {"Content-Type": "application/json"}
        cases: list[tuple[str, dict[str, Any], str, dict[str, Any], str]] = [
            ("embedding (1 text)", EMBEDDING,
             f"{engines[MINILM]}/v1/embeddings", {**EMBEDDING, "input": [QUERY]},
             f"{web}/realtime/v1/embeddings"),
            ("decision (3 questions)", DECISION, f"{engines['laya']}/v1/systemone", DECISION,
             f"{web}/realtime/v1/systemone"),
        ]
        header = (f"{'request':<24}{'clients':>8}{'path':>8}{'p50 ms':>9}{'p99 ms':>9}"
                  f"{'req/s':>9}{'errors':>8}{'per call':>10}")
        print(header)
        print("-" * len(header))
        for name, anex_body, direct_url, direct_body, anex_url in cases:
            engine = direct_url.rsplit("/v1/", 1)[0]
            for clients in CONCURRENCY:
                before = batching(engine)
                direct = load(direct_url, direct_body, signed(plain, direct_url, direct_body),
                              clients, seconds)
                middle = batching(engine)
                ours = load(anex_url, anex_body, lambda: auth, clients, seconds)
                after = batching(engine)
                for label, level, per_call in (("engine", direct, middle - before),
                                               ("anex", ours, after - middle)):
                    print(f"{name:<24}{clients:>8}{label:>8}{level.percentile(0.5):>9.2f}"
                          f"{level.percentile(0.99):>9.2f}{level.rate:>9.1f}{level.errors:>8}"
                          f"{per_call.per_call:>10.1f}")
                print(f"{'':<24}{'':>8}{'overhead':>8}"
                      f"{ours.percentile(0.5) - direct.percentile(0.5):>+9.2f}"
                      f"{ours.percentile(0.99) - direct.percentile(0.99):>+9.2f}"
                      f"{ours.rate - direct.rate:>+9.1f}")


if __name__ == "__main__":
    main()
