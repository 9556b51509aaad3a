"""Benchmark: the row checker against parsing alone, on chat JSONL files of 10k, 100k and 1M
rows.

    ANEX_RUN_DIR=... .venv/bin/python bench/validate_rows.py [--sizes 10000 100000 1000000]

Each run happens in a fresh subprocess, so its peak RSS (the child's own ru_maxrss) belongs
to that run alone; each side is run --repeats times, the sides taking turns, and its
fastest run kept (its highest RSS). Four sides per size: orjson parsing every line and
checking nothing; the checker (validate_jsonl, every rule, running sums and about 30 bytes
per custom_id kept) with a whitespace counter (Words: cheap, so that side measures the
checking); the floor of counting for real, orjson plus the tokenizer's encode_batch_fast
over every message's text; and the checker with the checkpoint's real tokenizer and chat
template, each row counted exactly as the prompt the engine will render. The checker sides
are warmed on one line first (imports, the template's compilation), as a worker is before
its first file.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen3.8-27b"
# The real tokenizer and chat template: the local tiny Qwen3 (its template is Qwen3's
# shape; `manage.py build_checkpoints` builds it under $ANEX_RUN_DIR/checkpoints).
CHECKPOINT = Path(os.environ.get("ANEX_RUN_DIR") or ROOT / ".run").resolve() \
    / "checkpoints" / "tiny-qwen3"
WORDS = ("the quick brown fox jumps over a lazy dog while batch inference counts every "
         "token twice and prices it once").split()


def rows_write(path: Path, rows: int) -> None:
    rng = random.Random(rows)  # noqa: S311 - sample text, not a secret
    with path.open("w") as handle:
        for n in range(rows):
            body: dict[str, object] = {"messages": [
                {"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(8, 40)))},
            ]}
            if n % 5 == 0:
                body["chat_template_kwargs"] = {"enable_thinking": n % 10 == 0}
            if n % 7 == 0:
                body["response_format"] = {"type": "json_object"}
            handle.write(json.dumps({"custom_id": f"row-{n}", "method": "POST",
                                     "url": "/v1/chat/completions", "body": body}) + "\n")


class Words:
    """The whitespace counter: one token per word of single-spaced text (this file's texts
    are words joined by single spaces, so this is len(text.split()) without building the
    list), batch and all, so that side measures the checks rather than a word splitter."""

    def __call__(self, text: str) -> int:
        return text.count(" ") + 1

    def count_batch(self, texts: list[str]) -> list[int]:
        return [text.count(" ") + 1 for text in texts]


def child(side: str, path: Path) -> None:
    """One measured run; prints its result as one JSON line."""
    sys.path.insert(0, str(ROOT))
    import orjson

    from inference.catalog import model_get
    from inference.rows.core import JobOptions
    from inference.tokens import checkpoint_tokens
    from jobs.validation import validate_jsonl

    model = model_get(MODEL)
    assert model is not None
    tokens = checkpoint_tokens(CHECKPOINT) if side in ("real", "floor") else None
    if side in ("whitespace", "real"):
        # What a worker has loaded before its first file: the checker's lazy imports and
        # the template's compilation, paid here on one line, off the clock.
        with path.open("rb") as stream:
            validate_jsonl(io.BytesIO(stream.readline()), JobOptions(model=model.id),
                           count_tokens=tokens or Words())  # type: ignore[arg-type]
    started = time.perf_counter()
    rows = 0
    with path.open("rb") as stream:
        if side in ("whitespace", "real"):
            counter = tokens if tokens is not None else Words()
            rows = validate_jsonl(stream, JobOptions(model=model.id),
                                  count_tokens=counter).rows  # type: ignore[arg-type]
        elif side == "orjson":
            for line in stream:
                orjson.loads(line)
                rows += 1
        else:  # floor: parse, and count every message's text in batches
            assert tokens is not None
            texts: list[str] = []
            for line in stream:
                texts.extend(m["content"] for m in orjson.loads(line)["body"]["messages"])
                rows += 1
                if len(texts) >= 2048:
                    tokens.count_batch(texts)
                    texts = []
            tokens.count_batch(texts)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_kib": peak_kib}))


def measure(side: str, path: Path) -> dict[str, float]:
    done = subprocess.run(  # our own interpreter, running this file
        [sys.executable, __file__, "--child", side, str(path)],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    print(f"{time.strftime('%Y-%m-%d')}  model {MODEL}; chat JSONL; Python "
          f"{sys.version.split()[0]}; {os.cpu_count()} CPU cores, load "
          f"{os.getloadavg()[0]:.1f}; rows/s (peak RSS MB), best of {args.repeats} runs "
          "taken in turns")
    header = (f"{'rows':>9} | {'orjson':>15} {'checker, ws':>17} {'ratio':>5} | "
              f"{'floor':>15} {'checker, real':>17} {'ratio':>5}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            path = Path(folder) / f"rows-{size}.jsonl"
            rows_write(path, size)
            # Each side is run `repeats` times, the sides taking turns, and its fastest run
            # kept: this machine's speed drifts from minute to minute, and a side measured
            # only in a slow minute would skew its ratio.
            runs: dict[str, dict[str, float]] = {}
            for _ in range(args.repeats):
                for side in ("orjson", "whitespace", "floor", "real"):
                    run = measure(side, path)
                    best = runs.get(side)
                    if best is None or run["seconds"] < best["seconds"]:
                        runs[side] = {**run, "peak_kib": max(
                            run["peak_kib"], best["peak_kib"] if best else 0)}
                    else:
                        best["peak_kib"] = max(best["peak_kib"], run["peak_kib"])
            assert all(run["rows"] == size for run in runs.values())

            def cell(side: str, runs: dict[str, dict[str, float]] = runs,
                     size: int = size) -> str:
                run = runs[side]
                return f"{size / run['seconds']:>9,.0f} ({run['peak_kib'] / 1024:>4.0f})"

            print(f"{size:>9,} | {cell('orjson'):>15} {cell('whitespace'):>17} "
                  f"{runs['orjson']['seconds'] / runs['whitespace']['seconds']:>5.2f} | "
                  f"{cell('floor'):>15} {cell('real'):>17} "
                  f"{runs['floor']['seconds'] / runs['real']['seconds']:>5.2f}")
            path.unlink()
    print("orjson: orjson.loads of every line, nothing checked; floor: orjson plus "
          "encode_batch_fast over every message's text; checker: validate_jsonl, every "
          "rule, with a whitespace counter (ws) or the checkpoint's tokenizer and chat "
          "template (real: each row counted as the prompt the engine renders); ratio: "
          "rows/s of the checker over its baseline")


if __name__ == "__main__":
    main()
