"""Entry module for the worker roles' `dramatiq anex.worker` (anex/roles.py): sets Django up,
then loads every app's actors. Start a worker as its role (`python -m anex.roles worker-gpu`
or `worker-cpu`), which names its processes and queues."""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
django.setup()

from django.utils.module_loading import autodiscover_modules  # noqa: E402

from anex.roles import engine_processes_refuse  # noqa: E402
from jobs.dispatch import run_queues_declare  # noqa: E402

# A bare multi-process `dramatiq anex.worker` taking model queues stops here (anex.roles).
engine_processes_refuse(sys.argv)

# Each app keeps its actors in tasks.py (STYLE.md); importing them declares them.
autodiscover_modules("tasks")

# The chunks of the models this worker serves, in the regions it serves (ANEX_WORKER_*).
run_queues_declare()
