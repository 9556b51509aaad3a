"""Run the periodic clock (anex/periodic.py) until stopped."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand

from anex.periodic import run_forever


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        stop = {"requested": False}

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop["requested"] = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, request_stop)
        # The actors live in each app's tasks module; importing them declares them.
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")
        run_forever(lambda: stop["requested"], interval=1.0)
