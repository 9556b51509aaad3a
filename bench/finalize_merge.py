"""The finalize merge alone: rows/s, peak RSS and storage calls of the product's own merge
(jobs.results.result_write, what job_finalize runs) over a job's chunk result objects, on
the local filesystem backend and on moto S3 (a `python -m moto.server` process, as the
scale harness runs it), before and after.

"before" is jobs/results.py as it was at --before (a git revision, loaded from git into
its own module beside today's code); "after" is this checkout's. Both run over the same
chunk objects in a fresh process each (so peak RSS is the merge's own), the result's
SHA-256 is printed for both (byte-identical, or the line says DIFFERENT), and the ratio
(with --rounds, the modes alternate and the median ratio is printed: the machine is shared).

    python -m anex.devstack exec -- .venv/bin/python bench/finalize_merge.py \
        [--rows 200000] [--chunk-rows 256] [--backend local s3] [--format jsonl parquet]
        [--mode before after] [--before fcc63b5] [--rounds 3] [--profile after]

--mode grouped merges the same rows run as a grouped job's chunks (issue 43: each chunk's
rows a run of a fixed random permutation, Chunk.spans naming them, so the merge puts them
back in file order through its spool, jobs.results._in_row_order); with `--mode after
grouped` the two results are byte-identical.

--profile MODE writes a cProfile of that mode's merge (per backend and format) under
--base and prints its top entries (every thread's: the rows are made in boto3's upload
thread). The job and its chunks are model instances that are never saved; the database is
asked only by the parquet input's S3 cache (which jobs run), migrated by the setup.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The model each --task's rows are priced on: the scale harness's chat model, and an
# embedding model priced per token (rows as the embed kind writes them, 384 floats each).
MODELS = {"chat": ("qwen3.8-27b", "chat"), "embed": ("qwen3-embedding-8b", "embed")}
VECTOR_WIDTH = 384
BUCKETS = {"world": "anex-bench-world", "eu": "anex-bench-eu"}
BEFORE = "fcc63b5"  # the last commit before the read-ahead merge


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(backend: str, base: Path, endpoint: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANEX_S3")}
    env.update(DJANGO_SETTINGS_MODULE="anex.settings", PYTHONPATH=str(ROOT),
               ANEX_STORAGE_BACKEND=backend, ANEX_STORAGE_ROOT=str(base / "storage"))
    if backend == "s3":
        env.update(ANEX_S3_BUCKET=BUCKETS["world"], ANEX_S3_EU_BUCKET=BUCKETS["eu"],
                   ANEX_S3_REGION="us-east-1", ANEX_S3_EU_REGION="us-east-1",
                   ANEX_S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")  # noqa: S106 (moto's)
    return env


# --- the child: one setup or one merge, in its own process ----------------------------------


def _job(spec: dict[str, Any], *, grouped: bool = False) -> tuple[Any, list[Any]]:
    from jobs.models import Chunk, Input, Job

    model, task = MODELS[spec["task"]]
    job = Job(id=uuid.UUID(spec["grouped_job" if grouped else "job"]),
              organization_id=uuid.UUID(spec["organization"]),
              model=model, format=spec["format"], data_residency="world", task_type=task,
              row_count=spec["rows"])
    job.input = Input(object_key=spec["input_key"], content_pin=spec.get("pin", ""))
    chunks = [Chunk(job=job, index=index, first_row=index * spec["chunk_rows"],
                    row_count=min(spec["chunk_rows"], spec["rows"] - index * spec["chunk_rows"]))
              for index in range((spec["rows"] + spec["chunk_rows"] - 1) // spec["chunk_rows"])]
    if grouped:
        order = list(range(spec["rows"]))
        random.Random(43).shuffle(order)  # noqa: S311 (a benchmark's order)
        for chunk in chunks:
            planned = order[chunk.first_row:chunk.first_row + chunk.row_count]
            chunk.spans = [value for index in planned for value in (index, 0, 0)]
    return job, chunks


def _embed_record(index: int, job: Any, rng: random.Random) -> dict[str, Any]:
    """A row's record as the embed kind writes it into its chunk's result (a unit-length
    scale of random floats, the row's own token count)."""
    from inference.constants import RowOutcome
    from inference.kinds.base import InputRow, ServedRow
    from inference.kinds.embed import embeddings_body
    from inference.pricing import Usage, usage_json
    from jobs.services.rows import record

    tokens = rng.randint(8, 40)
    vector = [rng.uniform(-0.2, 0.2) for _ in range(VECTOR_WIDTH)]
    served = ServedRow(outcome=RowOutcome.SUCCESS, status_code=200,
                       body=embeddings_body(job.model, [vector], tokens),
                       usage=Usage(input_tokens=tokens))
    return {**record(InputRow(index, f"row-{index}", {}), served),
            "usage": usage_json(served.usage)}


def _record(index: int, job: Any, rng: random.Random) -> dict[str, Any]:
    """A row's record as the chat kind writes it into its chunk's result (the simulated
    engine's shape: a chat completion body, the row's own usage)."""
    if job.task_type == "embed":
        return _embed_record(index, job, rng)
    ident = f"row-{index}"
    prompt, completion = rng.randint(20, 400), rng.randint(1, 200)
    usage = {"input_tokens": prompt, "output_tokens": completion}
    if index % 97 == 13:
        return {"i": index, "id": ident, "outcome": "error", "status_code": 400, "body": None,
                "output": None, "embedding": None,
                "error": {"message": "failed", "type": "invalid_request_error", "code": None,
                          "param": None}, "usage": {}}
    answer = f"simulated answer {index:016x}"
    finish = "length" if index % 89 == 7 else "stop"
    body = {"id": f"chatcmpl-{job.pk.hex[:12]}-{index}", "object": "chat.completion",
            "created": 1767225600, "model": job.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "completion_tokens_details": {"reasoning_tokens": 0}}}
    return {"i": index, "id": ident, "outcome": "truncated" if finish == "length" else "success",
            "status_code": 200, "body": body, "output": answer, "embedding": None,
            "error": None, "usage": usage}


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    from inference.catalog import model_get
    from inference.pricing import Usage, price, usage_from_json
    from jobs.jsonl import line_dumps
    from jobs.results import chunk_key
    from jobs.storage import storage_for

    job, chunks = _job(spec)
    storage = storage_for("world")
    rng = random.Random(21)  # noqa: S311 (a benchmark's rows, the same every run)
    total = Usage()
    kept: list[bytes] = []
    for chunk in chunks:
        records = [_record(i, job, rng) for i in range(chunk.first_row,
                                                       chunk.first_row + chunk.row_count)]
        total = sum((usage_from_json(r["usage"]) for r in records), total)
        lines = [line_dumps(r) for r in records]
        if spec.get("grouped"):
            kept += lines
        storage.write_stream(chunk_key(job, chunk.index), iter(lines), max_bytes=2**40)
    if spec.get("grouped"):  # the same rows, as a grouped job's chunks hold them
        grouped, grouped_chunks = _job(spec, grouped=True)
        for chunk in grouped_chunks:
            storage.write_stream(chunk_key(grouped, chunk.index),
                                 (kept[index] for index in chunk.spans[0::3]),
                                 max_bytes=2**40)
    if spec["format"] == "parquet":
        import pyarrow as pa
        from django.core.management import call_command

        call_command("migrate", verbosity=0)  # the S3 input cache asks which jobs run
        import pyarrow.parquet as pq

        local = Path(spec["base"]) / f"input-{spec['job']}.parquet"
        pq.write_table(pa.table({"id": [f"row-{i}" for i in range(spec["rows"])],
                                 "prompt": [f"question {i}" for i in range(spec["rows"])]}),
                       local)
        with local.open("rb") as handle:
            storage.write_stream(spec["input_key"], iter(lambda: handle.read(1 << 20), b""),
                                 max_bytes=2**40)
        local.unlink()
        return {"pin": storage.fingerprint(spec["input_key"])[1],
                "charge": price(model_get(job.model), total).cents}  # type: ignore[arg-type]
    return {"charge": price(model_get(job.model), total).cents}  # type: ignore[arg-type]


def _before_module(rev: str) -> Any:
    """jobs/results.py as it was at `rev`, as a module of its own."""
    import types

    source = subprocess.run(["git", "show", f"{rev}:jobs/results.py"],  # noqa: S607 (git on PATH)
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("jobs.results_before")
    module.__file__ = f"<jobs/results.py at {rev}>"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 (the product's own code)
    return module


class _Calls:
    """Storage calls as the backend makes them: S3 requests as botocore sends them (every
    GET, every part of an upload, from whichever thread and client), local opens and
    writes as the backend is called."""

    def __init__(self, storage: Any) -> None:
        from botocore.endpoint import Endpoint

        from jobs.storage import S3RegionStorage

        self.count = 0
        if isinstance(storage, S3RegionStorage):
            Endpoint._send = self._counted(Endpoint._send)  # type: ignore[method-assign]
        else:
            for name in ("open", "write_stream", "read_range"):
                setattr(storage, name, self._counted(getattr(storage, name)))
            if hasattr(storage, "whole_reader"):  # each read_each read (after)
                real = storage.whole_reader
                storage.whole_reader = lambda: self._counted(real())

    def _counted(self, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return method(*args, **kwargs)
        return counted


def _profile_threads() -> list[Any]:
    """A cProfile of this thread and of every thread started from now on (the merge's
    rows are made in boto3's upload thread and read in the read-ahead's)."""
    import cProfile
    import threading

    profilers = [cProfile.Profile()]

    def started(*_: Any) -> None:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()

    threading.setprofile(started)
    profilers[0].enable()
    return profilers


def child_merge(spec: dict[str, Any], mode: str, profile: str) -> dict[str, Any]:
    import resource

    from jobs.storage import storage_for

    module: Any
    if mode == "before":
        module = _before_module(spec["before"])
    else:
        import jobs.results as module
    job, chunks = _job(spec, grouped=mode == "grouped")
    storage = storage_for("world")
    calls = _Calls(storage)
    profilers = _profile_threads() if profile else []
    start = time.perf_counter()
    # The key and the rows lead what either version returns (a pair before issue 40).
    key, rows = module.result_write(job, chunks, charge=spec["charge"])[:2]
    seconds = time.perf_counter() - start
    if profilers:
        import pstats
        import threading

        profilers[0].disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        stats = pstats.Stats(profilers[0])
        for other in profilers[1:]:
            stats.add(other)
        stats.dump_stats(profile)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    merge_calls = calls.count
    digest = hashlib.sha256()
    with storage.open(key) as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    storage.delete(key)
    return {"rows": rows, "seconds": seconds, "peak_mib": peak_kib / 1024,
            "calls": merge_calls, "sha256": digest.hexdigest()}


def child(argv: list[str]) -> None:
    import django

    django.setup()
    spec = json.loads(argv[1])
    if argv[0] == "setup":
        answer = child_setup(spec)
    else:
        answer = child_merge(spec, argv[2], argv[3])
    print("RESULT " + json.dumps(answer), flush=True)


# --- the parent -----------------------------------------------------------------------------


def _run_child(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"child {args[0]} failed ({done.returncode})")
    line = [text for text in done.stdout.splitlines() if text.startswith("RESULT ")][-1]
    return dict(json.loads(line.removeprefix("RESULT ")))


def _moto(base: Path) -> tuple[subprocess.Popen[bytes], str]:
    import boto3

    port = _free_port()
    log = (base / "moto.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # noqa: S106 (moto's)
    for bucket in BUCKETS.values():
        client.create_bucket(Bucket=bucket)
    return server, endpoint


def _top(profile: Path, lines: int = 25) -> None:
    import pstats

    pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(lines)
    pstats.Stats(str(profile)).sort_stats("tottime").print_stats(lines)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-rows", type=int, default=256, help="ANEX_CHUNK_ROWS's default")
    parser.add_argument("--backend", nargs="+", default=["local", "s3"],
                        choices=["local", "s3"])
    parser.add_argument("--format", nargs="+", default=["jsonl"], choices=["jsonl", "parquet"])
    parser.add_argument("--task", default="chat", choices=sorted(MODELS),
                        help="the rows' kind: chat completions, or 384-float embeddings")
    parser.add_argument("--mode", nargs="+", default=["before", "after"],
                        choices=["before", "after", "grouped"])
    parser.add_argument("--before", default=BEFORE, help="the git revision 'before' runs")
    parser.add_argument("--rounds", type=int, default=1,
                        help="merges per mode, the modes' order swapped every round")
    parser.add_argument("--profile", default="", choices=["", "before", "after"])
    parser.add_argument("--base", type=Path, default=Path("/tmp/anex-finalize-bench"))  # noqa: S108 (a benchmark's)
    args = parser.parse_args()
    args.base.mkdir(parents=True, exist_ok=True)
    server = None
    endpoint = ""
    if "s3" in args.backend:
        server, endpoint = _moto(args.base)
    try:
        for backend in args.backend:
            env = _environment(backend, args.base, endpoint)
            for fmt in args.format:
                spec: dict[str, Any] = {
                    "job": str(uuid.uuid4()), "organization": str(uuid.uuid4()),
                    "rows": args.rows, "chunk_rows": args.chunk_rows, "format": fmt,
                    "base": str(args.base), "before": args.before, "task": args.task,
                    "grouped_job": str(uuid.uuid4()), "grouped": "grouped" in args.mode}
                spec["input_key"] = f"inputs/{spec['organization']}/{spec['job']}.{fmt}"
                started = time.perf_counter()
                spec.update(_run_child(env, "setup", json.dumps(spec)))
                objects = -(-args.rows // args.chunk_rows)
                print(f"{backend} {fmt}: {args.rows:,} rows in {objects:,} "
                      f"chunk objects set up in {time.perf_counter() - started:.1f} s; charge "
                      f"{spec['charge']:,} credits", flush=True)
                results: dict[str, dict[str, Any]] = {}
                ratios: list[float] = []
                for turn in range(args.rounds):
                    modes = args.mode if turn % 2 == 0 else args.mode[::-1]
                    for mode in modes:
                        profile = (args.base / f"{backend}-{fmt}-{mode}.prof"
                                   if args.profile == mode and turn == 0 else "")
                        result = results[mode] = _run_child(env, "merge", json.dumps(spec),
                                                            mode, str(profile))
                        print(f"  {mode:6s} {result['rows'] / result['seconds']:>9,.0f} rows/s "
                              f"({result['seconds']:.1f} s for {result['rows']:,} rows), peak "
                              f"RSS {result['peak_mib']:.0f} MiB, {result['calls']:,} storage "
                              f"calls, sha256 {result['sha256'][:16]}", flush=True)
                        if profile:
                            _top(Path(profile))
                    if len(results) == 2:
                        first, second = (results[mode] for mode in args.mode)
                        ratios.append(first["seconds"] / second["seconds"])
                        same = first["sha256"] == second["sha256"]
                        print(f"  {args.mode[1]}/{args.mode[0]}: {ratios[-1]:.2f}x rows/s; "
                              f"result {'byte-identical' if same else 'DIFFERENT'}",
                              flush=True)
                if len(ratios) > 1:
                    print(f"  {args.mode[1]}/{args.mode[0]}, median of {len(ratios)} rounds: "
                          f"{statistics.median(ratios):.2f}x rows/s", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
