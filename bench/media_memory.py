"""A chunk of 200 image rows resolved within the worker's memory: peak RSS of bringing and
decoding its media (inference.kinds.media) against the decoded size, windowed as served
and all at once.

A local HTTPS host (a test CA, loopback allowed) serves a JPEG under 200 distinct URLs, so
every row is fetched and decoded on its own; each run is a fresh process that resolves the
chunk through media_windows and hands each window to a stand-in engine that holds the
window's requests (as the real one holds them while it runs) and reads every picture.
"all at once" sets the window past the chunk: what the worker would hold without windows.

    python -m anex.devstack exec -- python bench/media_memory.py [WIDTHxHEIGHT ...]
    (default 1024x768 2400x1800)
"""

from __future__ import annotations

import io
import os
import ssl
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = 200


def jpeg(width: int, height: int) -> bytes:
    """A picture that compresses as a photo does (noise, smoothed)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(7).integers(0, 256, (height // 8, width // 8, 3),
                                               dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).resize((width, height), Image.Resampling.BILINEAR).save(
        out, "JPEG", quality=85)
    return out.getvalue()


CHILD = r"""
import os, resource, sys, uuid, django
os.environ["DJANGO_SETTINGS_MODULE"] = "anex.settings"
django.setup()
from types import SimpleNamespace
from inference.catalog import model_get
from inference.kinds import kind_for
from inference.kinds import media as kinds_media
from inference.kinds.base import InputRow
from inference.engines.media import DECODED_KEY

mode, base, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "at-once":
    kinds_media.WINDOW_BYTES = 1 << 62
model = model_get("gemma4-12b")
kind = kind_for(model)
job = SimpleNamespace(organization_id=uuid.uuid4(), video_fps=None, model=model.id,
                      reasoning=None, reasoning_effort="", response_format=None)
chunk = [InputRow(i, f"r{i}", {"messages": [{"role": "user", "content": [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": f"{base}/img/{i}.jpg"}}]}]})
    for i in range(rows)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
context = kinds_media.media_context(job, model, kind)
windows = served = 0
for window in kinds_media.media_windows(job, chunk, paths=kind.media_paths, context=context):
    requests = [kind.engine_request(job, resolved.body) for _, resolved in window
                if resolved.error is None]
    del window
    for request in requests:  # the engine reads every picture while it holds them all
        for part in request.messages[0]["content"]:
            if DECODED_KEY in part:
                part[DECODED_KEY].image.getpixel((0, 0))
                served += 1
    windows += 1
    del requests
print(served, windows, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def host_of(body: bytes) -> type[BaseHTTPRequestHandler]:
    """A handler serving `body` at every path."""

    class Host(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Host


def run(mode: str, base: str, env: dict[str, str]) -> tuple[int, int, int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, base, str(ROWS)], env=env,
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    served, windows, before, peak = (int(value) for value in out[-4:])
    return served, windows, before, peak  # peak RSS in KiB


def main() -> None:
    import trustme

    sizes = [tuple(int(n) for n in arg.split("x")) for arg in sys.argv[1:]] \
        or [(1024, 768), (2400, 1800)]
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with tempfile.TemporaryDirectory() as directory:
        bundle = Path(directory) / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        env = {**os.environ, "ANEX_FETCH_ALLOW_LOOPBACK": "true",
               "ANEX_FETCH_CA_BUNDLE": str(bundle)}
        print(f"{'picture':>10} {'file':>8} {'decoded, 200 rows':>18}  {'windows':>7}  "
              f"{'peak RSS windowed':>17}  {'peak RSS at once':>16}")
        for width, height in sizes:
            body = jpeg(width, height)

            server = ThreadingHTTPServer(("127.0.0.1", 0), host_of(body))
            server.socket = context.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            base = f"https://127.0.0.1:{server.server_address[1]}"
            served, windows, before, windowed = run("windowed", base, env)
            assert served == ROWS, served
            _, _, _, at_once = run("at-once", base, env)
            server.shutdown()
            decoded_mb = ROWS * width * height * 3 / 2**20
            print(f"{width}x{height} {len(body) / 2**20:>6.1f}MB {decoded_mb:>16.0f}MB  "
                  f"{windows:>7}  {windowed / 1024:>15.0f}MB  {at_once / 1024:>14.0f}MB"
                  f"   (process before resolving: {before / 1024:.0f}MB)")


if __name__ == "__main__":
    main()
