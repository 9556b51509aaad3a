"""`make run`'s launcher on a bare environment: it starts its own PostgreSQL and Redis,
serves /healthz and /openapi.json, prints the demo key, and Ctrl-C stops everything."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except OSError:
        return 0, b""


@pytest.mark.timeout(240)
def test_run_brings_everything_up_and_ctrl_c_takes_it_down(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ANEX_API_ORIGIN",
                        "ANEX_EU_API_ORIGIN")}
    env.update({"ANEX_RUN_DIR": str(tmp_path / "run"), "PORT": str(port),
                "STATIC_ROOT": str(tmp_path / "static")})
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

        status, body = get(f"http://127.0.0.1:{port}/healthz")
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
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            raise
    assert launcher.returncode == 0, Path(log.name).read_text()
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 0
    # Nothing it started is left behind: no server still using the run directory.
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers
    assert not (tmp_path / "run" / "postgres" / "postmaster.pid").exists()
