"""Entry module for `dramatiq anex.worker`: sets Django up, then loads every app's actors."""

import os

import django

from anex.workermetrics import worker_metrics_configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
# The metrics port (ANEX_WORKER_METRICS_PORT), set up before anything imports
# prometheus_client: its multiprocess directory is read once, on import.
metrics = worker_metrics_configure()
django.setup()

from django.utils.module_loading import autodiscover_modules  # noqa: E402

# Each app keeps its actors in tasks.py (STYLE.md); importing them declares them.
autodiscover_modules("tasks")

from jobs.dispatch import run_queues_declare  # noqa: E402

# The chunks of the models this worker serves, in the regions it serves (ANEX_WORKER_*).
run_queues_declare()

if metrics:
    import dramatiq

    from anex.workermetrics import worker_metrics_install

    worker_metrics_install(dramatiq.get_broker())
