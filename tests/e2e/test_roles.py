"""Each role's entry command (`python -m anex.roles ROLE`, what `make run`, the container
image and the scale harness start) run as a process against the real PostgreSQL and Redis,
and seen ready by what it does: the web tier answers /healthz, each worker takes the work
of its queues and no other, the clock ticks, the migration exits 0. Placement through the
real broker: an EU chunk is never taken by a worker that did not name the EU region."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import dramatiq
import psutil
import pytest

from anex.redis import redis_client
from jobs import dispatch
from tests.roles import (
    ROOT,
    broker_empty,
    pending,
    role_environment,
    role_running,
    until_alive,
)
from tests.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "tiny-qwen3"


def get_json(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except OSError:
        return 0, {}


def processes_of(pid: int) -> int:
    """The worker processes a role's Dramatiq command was started with (exec'd by it)."""
    command = psutil.Process(pid).cmdline()
    assert command[1:4] == ["-m", "dramatiq", "anex.worker"], command
    return int(command[command.index("--processes") + 1])


@pytest.fixture
def broker() -> dramatiq.Broker:
    return broker_empty()


def test_migrate_runs_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "migrate.log"
    with role_running("migrate", log=log) as process:
        assert process.wait(timeout=300) == 0, log.read_text()
    assert "No migrations to apply" in log.read_text()


def test_the_web_role_answers_healthz(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "web.log"
    with role_running("web", log=log, ANEX_WEB_BIND=f"127.0.0.1:{port}",
                      ANEX_WEB_WORKERS="1", ANEX_WEB_THREADS="2") as process:
        until_alive(lambda: get_json(f"http://127.0.0.1:{port}/healthz")[0] == 200,
                    process, log)
        assert get_json(f"http://127.0.0.1:{port}/healthz")[1]["status"] == "ok"


def test_the_cpu_worker_takes_its_queues_and_never_a_models(
        broker: dramatiq.Broker, tmp_path: Path) -> None:
    from jobs.tasks import idempotency_records_purge_task
    from realtime.tasks import realtime_charges_settle_task

    idempotency_records_purge_task.send()  # a periodic sweep
    realtime_charges_settle_task.send()  # the realtime settlement's own queue
    dispatch.send("job_estimate_task", str(uuid.uuid4()))  # an estimate (of no job)
    dispatch.chunk_send(chunk_id=uuid.uuid4(), region="world", model=MODEL)
    log = tmp_path / "worker-cpu.log"
    with role_running("worker-cpu", log=log, ANEX_CPU_WORKER_THREADS="2") as process:
        until_alive(lambda: pending(dispatch.PERIODIC) + pending("realtime")
                    + pending(dispatch.ESTIMATE) == 0, process, log)
        # Ready and working, and the chunk is still waiting for a GPU worker.
        assert pending(dispatch.run_queue("world", MODEL)) == 1
        assert processes_of(process.pid) == 1


def test_an_eu_chunk_is_taken_only_by_a_worker_that_names_the_eu(
        broker: dramatiq.Broker, tmp_path: Path) -> None:
    # given an EU chunk queued before a world one and a world sample
    checkpoints = f"{MODEL}={tmp_path}"
    dispatch.chunk_send(chunk_id=uuid.uuid4(), region="eu", model=MODEL)
    dispatch.chunk_send(chunk_id=uuid.uuid4(), region="world", model=MODEL)
    dispatch.sample_send(job_id=uuid.uuid4(), region="world", model=MODEL)
    world, eu = dispatch.run_queue("world", MODEL), dispatch.run_queue("eu", MODEL)
    # when a GPU worker that names no region runs, it takes the world chunk and sample
    log = tmp_path / "worker-gpu.log"
    with role_running("worker-gpu", log=log, ANEX_CHECKPOINTS=checkpoints,
                      ANEX_WORKER_MODELS=MODEL) as process:
        until_alive(lambda: pending(world) + pending(dispatch.sample_queue("world", MODEL))
                    == 0, process, log)
        # then the EU chunk is left for an EU worker, however long this one runs
        assert pending(eu) == 1
        assert processes_of(process.pid) == 1  # one process, one engine
    # and a worker that names the EU takes it
    log = tmp_path / "worker-gpu-eu.log"
    with role_running("worker-gpu", log=log, ANEX_CHECKPOINTS=checkpoints,
                      ANEX_WORKER_MODELS=MODEL, ANEX_WORKER_REGIONS="eu") as process:
        until_alive(lambda: pending(eu) == 0, process, log)


def test_a_gpu_worker_that_names_no_region_serves_the_world_region_only() -> None:
    # The role's own entry command, with the default regions: EU work is never taken by a
    # worker that did not name the EU.
    result = subprocess.run([sys.executable, "-m", "anex.roles", "--print", "worker-gpu"],
                            env=role_environment(ANEX_CHECKPOINTS=f"{MODEL}={ROOT}",
                                                 ANEX_WORKER_MODELS=MODEL),
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == [f"run.world.{MODEL}", f"run.world.{MODEL}.flex",
                                          f"sample.world.{MODEL}"]
    assert ".eu." not in result.stdout


def test_the_clock_ticks(broker: dramatiq.Broker, tmp_path: Path) -> None:
    client = redis_client()
    for key in client.scan_iter("anex:periodic:*"):  # this period's ticks, sent already
        client.delete(key)
    log = tmp_path / "clock.log"
    with role_running("clock", log=log) as process:
        until_alive(lambda: pending(dispatch.PERIODIC) > 0 and pending("realtime") > 0,
                    process, log)


def test_make_run_starts_the_role_commands(make_run) -> None:  # type: ignore[no-untyped-def]
    """`make run`'s children are the roles' own commands (anex.roles execs them)."""
    launcher = psutil.Process(make_run.launcher.pid)
    commands = [" ".join(child.cmdline()) for child in launcher.children()]
    # (gunicorn's master retitles itself "gunicorn: master [anex.wsgi:application]")
    assert any("gunicorn" in line and "anex.wsgi:application" in line
               for line in commands), commands
    assert any("anex.worker" in line and "--queues estimate" in line for line in commands), \
        commands
    assert any("anex.worker" in line and f"run.eu.{MODEL}" in line and "--processes 1" in line
               for line in commands), commands
    assert any("runperiodic" in line for line in commands), commands
    assert any("serve_realtime" in line for line in commands), commands
    # The engines take the CPU after the rest (anex/devstack.py ENGINE_NICENESS), their own
    # processes too; the web tier, the CPU worker and the clock keep the default.
    def is_engine(child: psutil.Process) -> bool:
        line = " ".join(child.cmdline())
        return "serve_realtime" in line or f"run.eu.{MODEL}" in line

    engines = [child for child in launcher.children() if is_engine(child)]
    assert len(engines) >= 2, commands
    assert all(process.nice() == 10 for engine in engines
               for process in (engine, *engine.children(recursive=True)))
    assert all(child.nice() == 0 for child in launcher.children() if not is_engine(child))


def test_the_realtime_role_serves_its_engine(
        checkpoint_dirs: dict[str, Path], tmp_path: Path) -> None:
    from inference.checkpoints import anex_checkpoints_value

    port = free_port()
    log = tmp_path / "realtime.log"
    with role_running("realtime", "--model", "all-minilm-l6-v2", "--port", str(port),
                      log=log, ANEX_CHECKPOINTS=anex_checkpoints_value(checkpoint_dirs),
                      ANEX_REALTIME_ENGINE_SECRET="s" * 64) as process:
        until_alive(lambda: get_json(f"http://127.0.0.1:{port}/health")[0] == 200,
                    process, log, timeout=300)
