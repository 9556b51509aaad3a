"""`make run`'s launcher on a bare environment: it starts its own PostgreSQL and Redis,
serves /healthz and /openapi.json, prints the demo key, and Ctrl-C stops everything."""

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

from inference.checkpoints import anex_checkpoints_value
from tests.servers import free_port, launcher_interrupt

# The local checkpoints are built (and the tiny Qwen3 trained) once per test session by the
# engine fixtures; make run takes them from ANEX_CHECKPOINTS instead of building its own.
pytest_plugins = ["tests.engine_fixtures"]

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except OSError:
        return 0, b""


# The first test of a session to take checkpoint_dirs waits for the checkpoints' build.
@pytest.mark.timeout(600)
def test_run_brings_everything_up_and_ctrl_c_takes_it_down(
        tmp_path: Path, checkpoint_dirs: dict[str, Path]) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ANEX_API_ORIGIN",
                        "ANEX_EU_API_ORIGIN")}
    env.update({"ANEX_RUN_DIR": str(tmp_path / "run"), "PORT": str(port),
                "STATIC_ROOT": str(tmp_path / "static"),
                "ANEX_CHECKPOINTS": anex_checkpoints_value(checkpoint_dirs)})
    log = (tmp_path / "run.log").open("w+")
    launcher = subprocess.Popen([sys.executable, "-m", "anex.devstack", "run"], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and "anex is up" not in Path(log.name).read_text():
            assert launcher.poll() is None, Path(log.name).read_text()
            time.sleep(0.5)
        output = Path(log.name).read_text()
        assert "anex is up" in output, output
        assert re.search(r"demo API key\s+sk-[a-z0-9]{12}_[A-Za-z0-9]{40}", output), output

        status, body = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and b'"database": "ok"' in body
        status, body = get(f"http://localhost:{port}/openapi.json")
        assert status == 200 and b'"openapi": "3.1' in body
        # The demo key works end to end: an upload target, the form POST, a ready input.
        key = re.search(r"demo API key\s+(sk-\S+)", output).group(1)  # type: ignore[union-attr]
        auth = {"Authorization": f"Bearer {key}"}
        created = requests.post(f"http://localhost:{port}/batch/v1/inputs", json={
            "format": "jsonl"}, headers=auth, timeout=30).json()
        assert created["upload_url"] == f"http://localhost:{port}/storage/world/upload"
        uploaded = requests.post(created["upload_url"], data=created["fields"], timeout=30,
                                 files={"file": ("in.jsonl", b'{"custom_id":"a"}\n')})
        assert uploaded.status_code == 204, uploaded.text
        polled = requests.get(f"http://localhost:{port}/batch/v1/inputs/{created['id']}",
                              headers=auth, timeout=30).json()
        assert polled["status"] == "ready"
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert any("gunicorn" in " ".join(c.cmdline()) for c in children)
        assert any("dramatiq" in " ".join(c.cmdline()) for c in children)
        assert any("runperiodic" in " ".join(c.cmdline()) for c in children)
    finally:
        stopped = launcher_interrupt(launcher)
    assert stopped, "Ctrl-C did not stop make run within 60 s"
    assert launcher.returncode == 0, Path(log.name).read_text()
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 0
    # Nothing it started is left behind: no server still using the run directory.
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers
    assert not (tmp_path / "run" / "postgres" / "postmaster.pid").exists()


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
