"""`make run`'s launcher on a bare environment: it starts its own PostgreSQL and Redis,
serves /readyz and /openapi.json, prints the demo key, and Ctrl-C stops everything. The
launch is the session's one `make run` (tests/conftest.py's make_run), which these tests
share with the others that drive one; its Ctrl-C is the last of them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import requests

from tests.launch import Running
from tests.servers import launcher_interrupt

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except OSError:
        return 0, b""


def test_run_brings_everything_up(make_run: Running) -> None:
    """The session's `make run` (tests/launch.py: a bare environment, as a newcomer starts
    it) is ready, answers, prints a demo key that works end to end, and runs the roles."""
    output = make_run.log.read_text()
    assert re.search(r"demo API key\s+sk-[a-z0-9]{12}_[A-Za-z0-9]{40}", output), output
    port = make_run.port
    status, body = get(f"http://127.0.0.1:{port}/readyz")
    assert status == 200 and b'"database": "ok"' in body
    status, body = get(f"http://localhost:{port}/openapi.json")
    assert status == 200 and b'"openapi": "3.1' in body
    # The demo key works end to end: an upload target, the form POST, a ready input.
    auth = {"Authorization": f"Bearer {make_run.key}"}
    created = requests.post(f"http://localhost:{port}/batch/v1/inputs", json={
        "format": "jsonl"}, headers=auth, timeout=30).json()
    assert created["upload_url"] == f"http://localhost:{port}/storage/world/upload"
    uploaded = requests.post(created["upload_url"], data=created["fields"], timeout=30,
                             files={"file": ("in.jsonl", b'{"custom_id":"a"}\n')})
    assert uploaded.status_code == 204, uploaded.text
    polled = requests.get(f"http://localhost:{port}/batch/v1/inputs/{created['id']}",
                          headers=auth, timeout=30).json()
    assert polled["status"] == "ready"
    children = psutil.Process(make_run.launcher.pid).children(recursive=True)
    assert any("gunicorn" in " ".join(c.cmdline()) for c in children)
    assert any("dramatiq" in " ".join(c.cmdline()) for c in children)
    assert any("runperiodic" in " ".join(c.cmdline()) for c in children)


@pytest.mark.stops_make_run
def test_ctrl_c_takes_everything_down(make_run: Running) -> None:
    """Ctrl-C on the session's `make run`, after every other test that drives it
    (tests/conftest.py orders this one last): everything it started stops, and its
    embedded PostgreSQL with it."""
    launcher = make_run.launcher
    assert launcher.poll() is None, "make run stopped before its Ctrl-C"
    stopped = launcher_interrupt(launcher)
    assert stopped, "Ctrl-C did not stop make run within 60 s"
    assert launcher.returncode == 0, make_run.log.read_text()
    assert get(f"http://127.0.0.1:{make_run.port}/healthz")[0] == 0
    # Nothing it started is left behind: no server still using the run directory.
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(make_run.run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers
    assert not (make_run.run_dir / "postgres" / "postmaster.pid").exists()


def launcher_holding(run_dir: Path, release: Path) -> subprocess.Popen[bytes]:
    """`devstack exec` on run_dir's embedded Redis, holding it until `release` exists."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["ANEX_RUN_DIR"] = str(run_dir)
    return subprocess.Popen(
        [sys.executable, "-m", "anex.devstack", "exec", "--", "sh", "-c",
         f"while [ ! -e '{release}' ]; do sleep 0.1; done"],
        cwd=ROOT, env=env, start_new_session=True)


def redis_answers(run_dir: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(run_dir / "redis.sock"),
                                socket_timeout=2).ping())
    except redis.RedisError:
        return False


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.timeout(180)
def test_the_last_launcher_out_stops_the_redis_they_shared(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    users = run_dir / "redis.users"
    # given one launcher that started the embedded Redis, and a second that attached to it
    first = launcher_holding(run_dir, tmp_path / "release-first")
    wait_for(lambda: redis_answers(run_dir) and users.exists() and users.read_text() != "")
    second = launcher_holding(run_dir, tmp_path / "release-second")
    wait_for(lambda: len(users.read_text().split()) == 2)
    try:
        # when the one that started it finishes first
        (tmp_path / "release-first").touch()
        assert first.wait(timeout=60) == 0
        # then the other one still has its Redis
        assert redis_answers(run_dir)
        # and once the last one finishes, nothing is left running
        (tmp_path / "release-second").touch()
        assert second.wait(timeout=60) == 0
        assert not redis_answers(run_dir)
        assert users.read_text() == ""
    finally:
        for launcher in (first, second):
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
