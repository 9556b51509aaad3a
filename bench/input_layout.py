"""Benchmark: what the estimate's layout of a JSONL input costs (jobs.validation.layout),
against what it saves (a whole read of the input by the sample's pick and another by the
start's plan; docs/dev/decisions/2026-12-06-one-read-of-the-input.md).

    python -m anex.devstack exec -- .venv/bin/python bench/input_layout.py [--rows 200000]

On one chat JSONL file held in memory (no storage: the reads saved are timed without their
I/O, which only adds to them), each side's best of --repeats runs, the sides taking turns:
the checks (validate_jsonl, whitespace token counter: the cheapest checking, so the
layout's share is at its largest) without and with the layout; the layout alone, fed the
checks' blocks; and one planning read as the start made it (every line, rows counted).

With the layout, the rows' share keys and their grouped order (jobs.validation.grouping,
issue 43) are timed too: "checks + layout + keys" is what the estimate now runs, and
"keys alone" the recorder of keys fed the same blocks, its order sorted. `--embed` times
an embedding file (no prefix levels; the 100k-row submit -> cost_ready case).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import django

# This checkout's code, whichever checkout the environment's editable install names.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
django.setup()

from inference.rows.core import JobOptions  # noqa: E402
from jobs.jsonl import input_rows  # noqa: E402
from jobs.validation import validate_jsonl  # noqa: E402
from jobs.validation.grouping import ShareKeys  # noqa: E402
from jobs.validation.layout import RowLayout  # noqa: E402
from jobs.validation.lines import chunks_bounded  # noqa: E402

MODEL = "qwen3.8-27b"
EMBED_MODEL = "qwen3-embedding-8b"
CHUNK_ROWS = 256


def words(text: str) -> int:
    return len(text.split())


def content(rows: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": f"Say hello to {i}. " * (1 + i % 9)}]}}
    ).encode() + b"\n" for i in range(rows))


def embed_content(rows: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
        "body": {"input": f"Embed this sentence number {i}. " * (1 + i % 5)}}
    ).encode() + b"\n" for i in range(rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--embed", action="store_true", help="an embedding file")
    args = parser.parse_args()
    data = embed_content(args.rows) if args.embed else content(args.rows)
    options = JobOptions(model=EMBED_MODEL if args.embed else MODEL)
    blocks = list(chunks_bounded(io.BytesIO(data), 10 * 1024 * 1024))

    def keys() -> ShareKeys:
        return ShareKeys(prefixes=not args.embed)

    def checks(layout: bool, keyed: bool = False) -> Callable[[], None]:
        def run() -> None:
            recorder = RowLayout(chunk_rows=CHUNK_ROWS, sample_rows=64,
                                 keys=keys() if keyed else None) if layout else None
            report = validate_jsonl(io.BytesIO(data), options, count_tokens=words,
                                    layout=recorder)
            laid = recorder.finish(report.rows) if recorder is not None else None
            assert recorder is None or laid is not None
            assert not keyed or (laid is not None and laid.grouped is not None)
        return run

    def layout_alone() -> None:
        recorder = RowLayout(chunk_rows=CHUNK_ROWS, sample_rows=64)
        for number, lines, chunk in blocks:
            recorder.block(number, lines, chunk)
        assert recorder.finish(args.rows) is not None

    def keys_alone() -> None:
        recorder = RowLayout(chunk_rows=CHUNK_ROWS, sample_rows=64, keys=keys())
        for number, lines, chunk in blocks:
            recorder.block(number, lines, chunk)
        laid = recorder.finish(args.rows)
        assert laid is not None and laid.grouped is not None

    def planning_read() -> None:
        rows = 0
        for _start, _end, _line in input_rows(io.BufferedReader(io.BytesIO(data))):
            rows += 1
        assert rows == args.rows

    sides = {"checks": checks(False), "checks + layout": checks(True),
             "checks + layout + keys": checks(True, keyed=True),
             "layout alone": layout_alone, "layout + keys alone": keys_alone,
             "one planning read": planning_read}
    best = dict.fromkeys(sides, float("inf"))
    checks(True)()  # warmed: imports, the kind's fast lane
    for _ in range(args.repeats):
        for name, run in sides.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    kind = "embedding" if args.embed else "chat"
    print(f"{args.rows:,} {kind} rows, {len(data) / 1e6:.1f} MB, {len(blocks)} blocks, "
          f"chunks of {CHUNK_ROWS}")
    for name, seconds in best.items():
        print(f"  {name:>22}: {seconds * 1000:8.1f} ms  {args.rows / seconds:12,.0f} rows/s")


if __name__ == "__main__":
    main()
