"""Serve realtime models from warm engines to the web tier (realtime/serving.py): only
requests signed with ANEX_REALTIME_ENGINE_SECRET are answered.

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

from django.conf import settings
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
                                 "on this machine; put TLS in front of any other).")
        parser.add_argument("--port", type=int, default=0,
                            help="The port (default 0: any free one, printed).")
        parser.add_argument("--fd", type=int, default=None,
                            help="Serve on this listening socket, bound and handed over by "
                                 "the parent process (make run), instead of --host/--port.")
        parser.add_argument("--allowed-host", action="append", default=[], dest="hosts",
                            help="A name the web tier reaches this server by (the Host it "
                                 "sends), beside the address it listens on (repeat).")

    def handle(self, *args: Any, **options: Any) -> None:
        # vLLM's own log handler writes to stdout, where the one line above is read: its
        # records go through this process's logging (stderr) instead.
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        secret = settings.ANEX_REALTIME_ENGINE_SECRET
        if not secret:
            raise CommandError("ANEX_REALTIME_ENGINE_SECRET is not set: the engine server "
                               "answers only requests the web tier signs with the secret "
                               "they share (docs/realtime.md, \"How it is served\").")
        served = {}
        for model_id in dict.fromkeys(options["models"]):
            try:
                served[model_id] = served_build(model_id, *engine_load(model_id))
            except EngineNotConfigured as exc:
                raise CommandError(str(exc)) from exc
        server = EngineServer((options["host"], options["port"]), served, secret=secret,
                              hosts=options["hosts"], fd=options["fd"])

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
