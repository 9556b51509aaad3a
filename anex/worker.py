"""Entry module for the worker roles' `dramatiq anex.worker` (anex/roles.py): sets Django up,
then loads every app's actors. Start a worker as its role (`python -m anex.roles worker-gpu`
or `worker-cpu`), which names its processes and queues."""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.utils.module_loading import autodiscover_modules  # noqa: E402

from jobs.dispatch import RUN, SAMPLE, run_queues_declare  # noqa: E402


def engine_processes_refuse(argv: list[str]) -> None:
    """A bare `dramatiq anex.worker` starts one process per core and takes every queue:
    each process would build its own engine for every model. Refused unless it runs one
    process or consumes no model's queue (the roles name both)."""
    if not argv or os.path.basename(argv[0]) not in ("dramatiq", "__main__.py"):
        return  # not Dramatiq's command line (a test's in-process worker)
    from dramatiq.cli import make_argument_parser

    args, _unknown = make_argument_parser().parse_known_args(argv[1:])
    takes_models = args.queues is None or any(
        queue.split(".")[0] in (RUN, SAMPLE) for queue in args.queues)
    if args.processes > 1 and takes_models:
        raise ImproperlyConfigured(
            f"dramatiq anex.worker with {args.processes} processes would build an engine in "
            "each: start `python -m anex.roles worker-gpu` (one process) or "
            "`python -m anex.roles worker-cpu` (no engine) instead.")


engine_processes_refuse(sys.argv)

# Each app keeps its actors in tasks.py (STYLE.md); importing them declares them.
autodiscover_modules("tasks")

# The chunks of the models this worker serves, in the regions it serves (ANEX_WORKER_*).
run_queues_declare()
