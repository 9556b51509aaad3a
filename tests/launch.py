"""`make run` on a bare environment, as a newcomer starts it: nothing but a port and a run
directory of its own (its launcher starts its own PostgreSQL and Redis, gunicorn, a Dramatiq
worker, the clock and the realtime engines). tests/conftest.py's make_run is one per session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from inference.checkpoints import anex_checkpoints_value
from tests.servers import free_port, launcher_interrupt

ROOT = Path(__file__).resolve().parent.parent
SERVICE_VARIABLES = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ANEX_API_ORIGIN",
                     "ANEX_EU_API_ORIGIN", "ANEX_RUN_DIR", "ANEX_CHECKPOINTS",
                     "ANEX_REALTIME_ENGINES")


@dataclass(frozen=True)
class Running:
    port: int
    run_dir: Path
    key: str
    env: dict[str, str]
    log: Path
    launcher: subprocess.Popen[bytes]

    @property
    def base(self) -> str:
        return f"http://localhost:{self.port}/batch/v1"


@contextmanager
def make_run_launched(root: Path, checkpoint_dirs: dict[str, Path]) -> Iterator[Running]:
    """`make run` under root, serving the session's local checkpoints, until Ctrl-C."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
    env.update({"ANEX_RUN_DIR": str(root / "run"), "PORT": str(port),
                "STATIC_ROOT": str(root / "static")})
    log = root / "run.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "anex.devstack", "run"], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
            env={**env, "ANEX_CHECKPOINTS": anex_checkpoints_value(checkpoint_dirs)})
    try:
        # patience, not a timing check: `make run` loads every local engine (text, media,
        # embeddings) and starts a realtime server per realtime model; on a loaded 2-core
        # machine that has taken past 4 minutes
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline and "anex is up" not in log.read_text():
            assert launcher.poll() is None, log.read_text()
            time.sleep(0.5)
        output = log.read_text()
        assert "anex is up" in output, output
        key = re.search(r"demo API key\s+(sk-\S+)", output)
        assert key is not None, output
        yield Running(port=port, run_dir=root / "run", key=key.group(1), env=env, log=log,
                      launcher=launcher)
    finally:
        launcher_interrupt(launcher)
