"""Ingest keeps the worker's memory flat: peak RSS against file size.

Serves generated JSONL files of several sizes over loopback HTTP and ingests each one in a
fresh process, (a) through anex's own copy (jobs.services.inputs.input_copy: the SSRF-safe
fetcher streamed into storage) and (b) through a naive copy that reads the whole body and
then writes it. Prints peak RSS for both and the ratio.

    python -m anex.devstack exec -- python bench/ingest_memory.py [MB ...]   (default 20 200)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = (json.dumps({"custom_id": "row", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": "x" * 200}]}})
        + "\n").encode()


class Source(BaseHTTPRequestHandler):
    """Streams `size` bytes of JSONL made on the fly, so the server holds none of it."""

    def do_GET(self) -> None:
        size = int(self.path.strip("/").split(".")[0])
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        block = LINE * (1024 * 1024 // len(LINE) + 1)
        sent = 0
        try:
            while sent < size:
                piece = block[: size - sent]
                self.wfile.write(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the submit-time size probe reads the headers and hangs up

    def log_message(self, *args: object) -> None:
        pass


CHILD = r"""
import os, resource, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "anex.settings"
django.setup()
from console.actors import Actor
from anex.regions import Region
from console.services import organization_create
from inference.constants import InputFormat
from jobs.services.inputs import input_copy, input_ingest_create
from jobs.storage import storage_for
mode, url = sys.argv[1], sys.argv[2]
actor = Actor(system="bench")
organization = organization_create(name="bench", actor=actor)
item, _ = input_ingest_create(organization=organization, actor=actor, source_url=url,
                              fmt=InputFormat.JSONL, callback_url=None, residency=Region.WORLD)
if mode == "anex":
    assert input_copy(input_id=item.pk) == "ready", item.pk
else:
    from anex.net import fetch
    with fetch("GET", url, tenant="bench", max_bytes=10**12) as response:
        body = response.read()
    storage_for(Region.WORLD).write_stream(item.object_key, iter([body]), max_bytes=10**12)
size = storage_for(Region.WORLD).size(item.object_key)
storage_for(Region.WORLD).delete(item.object_key)
print(size, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(mode: str, url: str, env: dict[str, str]) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, url], env=env, cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.split()
    return int(out[-2]), int(out[-1])  # bytes copied, peak RSS in KiB


def main() -> None:
    sizes_mb = [int(arg) for arg in sys.argv[1:]] or [20, 200]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Source)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as storage_root:
        env = {**os.environ, "ANEX_FETCH_ALLOW_LOOPBACK": "true",
               "ANEX_STORAGE_BACKEND": "local", "ANEX_STORAGE_ROOT": storage_root,
               "ANEX_INPUT_MAX_BYTES": str(10**12)}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=ROOT,
                       check=True)
        print(f"{'file':>8}  {'anex peak RSS':>14}  {'naive peak RSS':>15}  {'naive / anex':>12}")
        for size_mb in sizes_mb:
            url = f"http://127.0.0.1:{server.server_address[1]}/{size_mb * 1024 * 1024}.jsonl"
            copied, anex_kib = run("anex", url, env)
            assert copied == size_mb * 1024 * 1024
            _, naive_kib = run("naive", url, env)
            print(f"{size_mb:>6}MB  {anex_kib / 1024:>12.1f}MB  {naive_kib / 1024:>13.1f}MB"
                  f"  {naive_kib / anex_kib:>11.2f}x")
    server.shutdown()


if __name__ == "__main__":
    main()
