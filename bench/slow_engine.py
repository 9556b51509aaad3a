"""A realtime engine server whose every engine call takes a second longer: a simulation of
a slow model, for the load test's second run (bench/realtime_load.py, issue 23: "again with
an engine that answers in 1 s"). The bench's instrument, never the product's.

It is the product's own engine server (realtime/serving.py, as `manage.py serve_realtime`
starts it: the real engine, its batcher, the signature and Host checks), with each batch's
engine call preceded by a sleep of --delay seconds. Start it, then `make run` with its URL:

    ANEX_REALTIME_ENGINE_SECRET=s ANEX_RUN_DIR=.run python -m anex.devstack exec -- \\
        .venv/bin/python bench/slow_engine.py --model all-minilm-l6-v2 --port 8101
    (the same with --model laya --port 8102)
    ANEX_REALTIME_ENGINE_SECRET=s ANEX_REALTIME_ENGINES="all-minilm-l6-v2=\\
        http://127.0.0.1:8101;laya=http://127.0.0.1:8102" make run

(`make run` keeps the engines an environment names, and starts none of its own.) Start one
per model, as `make run` starts its engine servers: two vLLM engines stepping at once in
one process share vLLM's forward context, and on this machine that failed an engine step
(a KeyError in get_attention_context) and then corrupted the process's heap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=1.0,
                        help="seconds added to every engine call (simulated)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    import django

    django.setup()
    from django.conf import settings

    from realtime.serving import EngineServer, engine_load, served_build

    item = served_build(args.model, *engine_load(args.model))
    run = item.batcher.run

    def slow(rows: list[Any]) -> list[Any]:
        time.sleep(args.delay)  # simulated: the slow model's time
        return run(rows)

    item.batcher.run = slow
    served = {args.model: item}
    server = EngineServer(("127.0.0.1", args.port), served,
                          secret=settings.ANEX_REALTIME_ENGINE_SECRET)
    print(json.dumps({"listening": server.url, "models": list(served),
                      "simulated_delay_seconds": args.delay}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
