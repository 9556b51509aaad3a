"""Entry module for `dramatiq anex.worker`: sets Django up, then loads every app's actors."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
django.setup()

from django.utils.module_loading import autodiscover_modules  # noqa: E402

# Each app keeps its actors in tasks.py (STYLE.md); importing them declares them.
autodiscover_modules("tasks")

from jobs.dispatch import run_queues_declare  # noqa: E402

# The chunks of the models this worker serves, in the regions it serves (ANEX_WORKER_*).
run_queues_declare()
