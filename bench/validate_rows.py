"""Benchmark: the row checker against a naive read, on chat JSONL files of 10k, 100k and 1M
rows.

    .venv/bin/python bench/validate_rows.py [--sizes 10000 100000 1000000]

Each run happens in a fresh subprocess, so its peak RSS (the child's own ru_maxrss) belongs
to that run alone. The naive baseline json.loads every line into a list and checks nothing;
the checker runs every rule and keeps only running sums and 8 bytes per custom_id. The token
counter is a whitespace split on both sides' behalf (the checker calls it), so the figures
measure the checking, not a tokenizer.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen3.8-27b"
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


def child(side: str, path: Path) -> None:
    """One measured run; prints its result as one JSON line."""
    sys.path.insert(0, str(ROOT))
    from inference.catalog import model_get
    from jobs.validation import JobOptions, validate_jsonl

    model = model_get(MODEL)
    assert model is not None
    started = time.perf_counter()
    if side == "validator":
        with path.open("rb") as stream:
            rows = validate_jsonl(stream, JobOptions(model=model),
                                  count_tokens=lambda text: len(text.split())).rows
    else:
        with path.open("rb") as stream:
            loaded = [json.loads(line) for line in stream]
        rows = len(loaded)
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
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    print(f"model {MODEL}; chat JSONL; token counter: whitespace split; Python "
          f"{sys.version.split()[0]}")
    header = (f"{'rows':>9} {'file MB':>8} | {'validator rows/s':>16} {'peak RSS MB':>11} | "
              f"{'naive rows/s':>12} {'peak RSS MB':>11} | {'time x':>6} {'RSS x':>6}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            path = Path(folder) / f"rows-{size}.jsonl"
            rows_write(path, size)
            checked = measure("validator", path)
            naive = measure("baseline", path)
            assert checked["rows"] == naive["rows"] == size
            print(f"{size:>9,} {path.stat().st_size / 1e6:>8.1f} | "
                  f"{size / checked['seconds']:>16,.0f} {checked['peak_kib'] / 1024:>11.1f} | "
                  f"{size / naive['seconds']:>12,.0f} {naive['peak_kib'] / 1024:>11.1f} | "
                  f"{checked['seconds'] / naive['seconds']:>6.2f} "
                  f"{checked['peak_kib'] / naive['peak_kib']:>6.2f}")
            path.unlink()
    print("time x: validator seconds / naive seconds; RSS x: validator peak / naive peak")


if __name__ == "__main__":
    main()
