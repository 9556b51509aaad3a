"""Entry module for the worker roles' `dramatiq anex.worker` (anex/roles.py): sets Django up,
then loads every app's actors. Start a worker as its role (`python -m anex.roles worker-gpu`
or `worker-cpu`), which names its processes and queues."""

import os
import sys

import django

from anex.workermetrics import worker_metrics_configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
# The metrics port (ANEX_WORKER_METRICS_PORT), set up before anything imports
# prometheus_client: its multiprocess directory is read once, on import.
metrics = worker_metrics_configure()
django.setup()

from django.utils.module_loading import autodiscover_modules  # noqa: E402

from anex.roles import engine_processes_refuse  # noqa: E402
from jobs.dispatch import gpu_prefetch_install, run_queues_declare  # noqa: E402

# A bare multi-process `dramatiq anex.worker` taking model queues stops here (anex.roles).
engine_processes_refuse(sys.argv)

# Each app keeps its actors in tasks.py (docs/dev/style.md); importing them declares them.
autodiscover_modules("tasks")

# The chunks of the models this worker serves, in the regions it serves (ANEX_WORKER_*).
run_queues_declare()
# A GPU worker holds one chunk more than it runs, not twice its threads (jobs.dispatch).
gpu_prefetch_install()

if metrics:
    import dramatiq

    from anex.workermetrics import WORKER_PROCESS_CHECKS, worker_metrics_install
    from jobs.failures import worker_engine_state

    # Unready while a model's breaker is open: its engine keeps failing, and the worker hands
    # that model's work back instead of taking it (jobs.failures).
    WORKER_PROCESS_CHECKS["breaker"] = lambda: bool(worker_engine_state()["ready"])
    worker_metrics_install(dramatiq.get_broker())
