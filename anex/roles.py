"""The roles of a deployment, one command each (docs/deploy.md, "Roles").

    python -m anex.roles web          # gunicorn: the batch API, the console, /healthz
    python -m anex.roles worker-gpu   # one Dramatiq process: its models' run and sample queues
    python -m anex.roles worker-cpu   # estimates, ingest, webhooks, job start and finalize,
                                      # the periodic sweeps; no engine
    python -m anex.roles realtime --model ID [--host H --port P]  # a warm engine server
    python -m anex.roles clock        # the periodic clock (safe to run twice)
    python -m anex.roles migrate      # migrate the database, then exit
    python -m anex.roles --print ROLE # print the command instead of running it

This is the one place a role's command is defined: `make run` (anex/devstack.py) starts
these, the container image's commands are these (Dockerfile, compose.yaml), and so is the
scale harness's fleet. A role reads its settings strictly (anex/settings.py; a bad value
stops it at start), then replaces this process with its command (exec), so a supervisor's
signals reach gunicorn or Dramatiq directly. Arguments after the role go to the command.

What each role takes, from the environment:
- web: ANEX_WEB_BIND (host:port), ANEX_WEB_WORKERS, ANEX_WEB_THREADS,
  ANEX_WEB_SOCKET_TIMEOUT_SECONDS (each read and write on a connection).
- worker-gpu: ANEX_WORKER_MODELS (each with a checkpoint in ANEX_CHECKPOINTS),
  ANEX_WORKER_REGIONS (default world only: EU work runs only where "eu" is named),
  ANEX_GPU_WORKER_THREADS, and for its engine ANEX_GPU_MEMORY_FRACTION and
  ANEX_TENSOR_PARALLEL_SIZE. Always ONE process: each process would build its own engine,
  so a machine with several GPUs runs one worker-gpu per GPU (CUDA_VISIBLE_DEVICES) or
  per tensor-parallel group.
- worker-cpu: ANEX_CPU_WORKER_PROCESSES (default 1, never one per core),
  ANEX_CPU_WORKER_THREADS.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
# gunicorn's default access line carries the query string and the Referer, where a signed
# download link's token lives: the path alone is logged, never the query, and an invitation
# token in a path is masked (anex.accesslog).
ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(L)s'

WEB = "web"
WORKER_GPU = "worker-gpu"
WORKER_CPU = "worker-cpu"
REALTIME = "realtime"
CLOCK = "clock"
MIGRATE = "migrate"
ROLES = (WEB, WORKER_GPU, WORKER_CPU, REALTIME, CLOCK, MIGRATE)


@dataclass(frozen=True)
class Worker:
    """What a worker role's Dramatiq command consumes, and with how many processes."""

    queues: tuple[str, ...]
    processes: int
    threads: int


def gpu_worker() -> Worker:
    """The run, flex and sample queues of the models this worker serves, in the regions it names
    (jobs.dispatch), in one process."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from jobs.dispatch import model_queues

    models = settings.ANEX_WORKER_MODELS
    if not models:
        raise ImproperlyConfigured(
            "worker-gpu serves no model: set ANEX_WORKER_MODELS (and ANEX_CHECKPOINTS).")
    missing = [model for model in models if model not in settings.ANEX_CHECKPOINTS]
    if missing:
        raise ImproperlyConfigured(
            f"ANEX_WORKER_MODELS names {', '.join(missing)}, with no checkpoint in "
            "ANEX_CHECKPOINTS on this worker.")
    queues = tuple(queue for region in settings.ANEX_WORKER_REGIONS
                   for model in models for queue in model_queues(region, model))
    return Worker(queues=queues, processes=1, threads=settings.ANEX_GPU_WORKER_THREADS)


def cpu_queues() -> tuple[str, ...]:
    """Every queue but the per-model GPU ones: the fixed queues of jobs.dispatch and the
    realtime settlement's."""
    from jobs import dispatch
    from realtime.tasks import QUEUE as REALTIME_SETTLE

    return (*dispatch.FIXED_QUEUES, REALTIME_SETTLE)


def cpu_worker() -> Worker:
    from django.conf import settings

    return Worker(queues=cpu_queues(), processes=settings.ANEX_CPU_WORKER_PROCESSES,
                  threads=settings.ANEX_CPU_WORKER_THREADS)


def dramatiq_command(worker: Worker) -> list[str]:
    # --queues: Dramatiq consumes only these (and their delay queues), whatever else the
    # actors declare.
    return [sys.executable, "-m", "dramatiq", "anex.worker",
            "--processes", str(worker.processes), "--threads", str(worker.threads),
            "--queues", *worker.queues]


def engine_processes_refuse(argv: Sequence[str]) -> None:
    """A bare `dramatiq anex.worker` starts one process per core and takes every queue:
    each process would build its own engine for every model. Refused unless it runs one
    process or consumes no model's queue (the roles name both)."""
    program = Path(argv[0]).parts[-2:] if argv else ()
    if program[-1:] != ("dramatiq",) and program != ("dramatiq", "__main__.py"):
        return  # not Dramatiq's command line (a test's in-process worker)
    from django.core.exceptions import ImproperlyConfigured
    from dramatiq.cli import make_argument_parser

    from jobs.dispatch import RUN, SAMPLE

    args, _unknown = make_argument_parser().parse_known_args(argv[1:])
    takes_models = args.queues is None or any(
        queue.split(".")[0] in (RUN, SAMPLE) for queue in args.queues)
    if args.processes > 1 and takes_models:
        raise ImproperlyConfigured(
            f"dramatiq anex.worker with {args.processes} processes would build an engine in "
            "each: start `python -m anex.roles worker-gpu` (one process) or "
            "`python -m anex.roles worker-cpu` (no engine) instead.")


def manage_command(*args: str) -> list[str]:
    return [sys.executable, str(BASE_DIR / "manage.py"), *args]


def command(role: str, extra: Sequence[str] = ()) -> list[str]:
    """The argv a role runs, its settings read (ImproperlyConfigured on a bad one)."""
    from django.conf import settings

    if role == WEB:
        return [sys.executable, "-m", "gunicorn", "anex.wsgi:application",
                "--config", "python:anex.gunicorn_hooks",
                # every connection's reads and writes bounded (ANEX_WEB_SOCKET_TIMEOUT_SECONDS)
                "--worker-class", "anex.gunicorn_hooks.BoundedThreadWorker",
                "--bind", settings.ANEX_WEB_BIND,
                "--workers", str(settings.ANEX_WEB_WORKERS),
                "--threads", str(settings.ANEX_WEB_THREADS), "--graceful-timeout", "10",
                "--access-logfile", "-", "--access-logformat", ACCESS_LOG_FORMAT,
                "--logger-class", "anex.accesslog.MaskedAccessLogger", *extra]
    if role == WORKER_GPU:
        return [*dramatiq_command(gpu_worker()), *extra]
    if role == WORKER_CPU:
        return [*dramatiq_command(cpu_worker()), *extra]
    if role == REALTIME:
        return manage_command("serve_realtime", *extra)
    if role == CLOCK:
        return manage_command("runperiodic", *extra)
    if role == MIGRATE:
        return manage_command("migrate", "--noinput", *extra)
    raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show = args[:1] == ["--print"]
    if show:
        args = args[1:]
    if not args or args[0] not in ROLES:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
    if args[0] == WORKER_GPU:
        # A GPU worker builds its engines at start and reports ready only once they are
        # loaded (anex/workermetrics.py's /readyz), so no chunk waits on a cold engine.
        os.environ.setdefault("ANEX_WORKER_PRELOAD", "1")
    import django
    from django.core.exceptions import ImproperlyConfigured

    try:
        django.setup()  # the queues are read from the apps' modules
        argv_run = command(args[0], args[1:])
    except ImproperlyConfigured as error:
        print(f"anex {args[0]}: {error}", file=sys.stderr)
        return 2
    if show:
        print(shlex.join(argv_run))
        return 0
    if args[0] in (WORKER_GPU, WORKER_CPU):
        from anex.workermetrics import metrics_dir_make

        metrics_dir_make()  # the metrics port's private directory, for every process
    sys.stdout.flush()
    os.chdir(BASE_DIR)
    os.execv(argv_run[0], argv_run)  # noqa: S606 - our own argv, no shell to quote for


if __name__ == "__main__":
    sys.exit(main())
