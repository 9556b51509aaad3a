"""Serve realtime models from warm engines on a loopback address (realtime/serving.py).

Loads one engine per --model, then listens; prints {"listening": URL, "models": [...]} on
one line once it answers. `make run` starts one per local realtime model; a deployment runs
one per model per machine and lists them in ANEX_REALTIME_ENGINES."""

from __future__ import annotations

import json
import os
import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.engines import EngineNotConfigured
from realtime.serving import EngineServer, engine_load, served_build


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", action="append", required=True, dest="models",
                            help="A model id to serve (repeat for more).")
        parser.add_argument("--host", default="127.0.0.1",
                            help="The address to listen on (default 127.0.0.1: the web tier "
                                 "on this machine; the server has no authentication).")
        parser.add_argument("--port", type=int, default=0,
                            help="The port (default 0: any free one, printed).")

    def handle(self, *args: Any, **options: Any) -> None:
        # vLLM's own log handler writes to stdout, where the one line above is read: its
        # records go through this process's logging (stderr) instead.
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        served = {}
        for model_id in dict.fromkeys(options["models"]):
            try:
                served[model_id] = served_build(model_id, *engine_load(model_id))
            except EngineNotConfigured as exc:
                raise CommandError(str(exc)) from exc
        server = EngineServer((options["host"], options["port"]), served)

        def stop(signum: int, frame: FrameType | None) -> None:
            # shutdown() waits for serve_forever, which runs on this thread: ask from another.
            threading.Thread(target=server.shutdown, daemon=True).start()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        self.stdout.write(json.dumps({"listening": server.url, "models": list(served)}))
        self.stdout.flush()
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            server.server_close()
