"""The scale harness (issue 21 item 7; benchmark code, never part of the product).

    make bench-scale                                   # every scenario, default sizes
    make bench-scale ARGS="--scenario S1 --rows 20000"  # one scenario, the small form
    python -m bench.scale --scenario S4 S6 --rows 20000

A deployment on this machine (bench/scale/cluster.py: PostgreSQL through PgBouncer in
transaction pooling, Redis on TCP with AOF, moto S3, gunicorn, two clocks, a CPU worker
(estimates, starts and every job's finalize) and four SIMULATED GPU workers running the
product's real worker with the simulated engine of bench/scale/simengine.py) driven through
the public batch API, one scenario at a time:

  S1  a big chat job (--rows, default 1,000,000): every line, in order, the simulated
      answer; one charge equal to the price of the rows' summed usage; rows/s against the
      simulated fleet's ideal (the whole run, and the chunk phase alone); each simulated
      GPU's own account of its time (batch fill, the engine empty, between steps); each
      worker's share; statements and broker calls per chunk
  S2  at 20 % of the big job another organization's 1,000-row job: approve -> done
  S3  at 20 % a sampled job (no max_output_tokens): submit -> cost_ready
  S4  a GPU worker's process group SIGKILLed at 30 %, restarted 60 s later
  S5  Redis shut down with no save at 50 %, restarted empty (20 submits meanwhile)
  S6  PostgreSQL restarted at 60 %
  S7  S3 unreachable for 60 s at 70 %
  S8  a poison row that makes the simulated step raise (S8a), and a worker whose simulated
      engine dies at 40 % (S8b)
  S9  the big job's finalize on moto, run by the CPU worker (job_finalize_task, sent by its
      last chunk's settle): merges, seconds within its time limit, done, billed
  S12 REAL engine, not simulated (--rows, default 20,000): on a cluster of its own whose
      GPU workers are the product's worker-gpu role with the real tiny-qwen3 vLLM engine,
      the job (greedy, max_output_tokens 8) run on one worker, then again on two with one
      SIGKILLed at 30 % and restarted after --outage-seconds: every line once, in order,
      1 charge, done, every answer identical to the one-worker run's
  S4-S8 also check: 0 rows lost, 0 duplicated, 1 charge, job done, and the chunks of another
  organization's job running meanwhile never charged a second attempt.

Every figure is printed, with PASS or FAIL. The machine running it is shared: timings are
what this machine gave, and the ratio to the simulated ideal is the figure to read.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# This checkout's code alone, in this process too (bench/scale/pathfix/sitecustomize.py).
sys.meta_path[:] = [finder for finder in sys.meta_path
                    if not getattr(finder, "__module__", "").startswith("__editable__")]

from bench.scale.cluster import (  # noqa: E402
    MODEL,
    REAL,
    REAL_MODEL,
    SIMULATED,
    Cluster,
    env_knobs,
    say,
)
from bench.scale.scenarios import REAL_ENGINE, SCENARIOS, Harness  # noqa: E402

# The big job's rows when --rows is not given: the sizes.
ROWS_DEFAULT = {SIMULATED: 1_000_000, REAL: 20_000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", nargs="+", default=["all"],
                        help="S1 ... S9, S12 ... S14 (or 'all', the default)")
    parser.add_argument("--rows", type=int, default=None,
                        help="the big job's rows (default 1,000,000; S12's 20,000)")
    parser.add_argument("--other-rows", type=int, default=1_000,
                        help="the other organization's job (S2, S4-S8)")
    parser.add_argument("--model", default=MODEL,
                        help="the chat model of the catalog the simulated fleet serves "
                             "(S12's REAL fleet serves tiny-qwen3)")
    parser.add_argument("--workers", type=int, default=4,
                        help="simulated GPU workers (S12: 1, then 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker")
    parser.add_argument("--step-ms", type=int, default=50, help="simulated step time")
    parser.add_argument("--batch", type=int, default=100, help="simulated running batch")
    parser.add_argument("--decode", type=int, default=8,
                        help="simulated steps (output tokens) per row")
    parser.add_argument("--chunk-rows", type=int, default=256, help="ANEX_CHUNK_ROWS")
    parser.add_argument("--in-flight", type=int, default=20, help="ANEX_DISPATCH_IN_FLIGHT")
    parser.add_argument("--stale-seconds", type=int, default=60,
                        help="ANEX_HEARTBEAT_STALE_SECONDS")
    parser.add_argument("--outage-seconds", type=int, default=60,
                        help="S4's and S12's restart delay and S7's S3 outage")
    parser.add_argument("--timeout", type=int, default=0,
                        help="seconds a big job may take (0: 20x its ideal + 10 min; S12: 1 h)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a real tiny-qwen3 checkpoint for the estimates' tokenizer "
                             "(default: a simulation tokenizer, built here); S12's engines "
                             "load it (default: the local one, built under .run/checkpoints "
                             "as make run builds it)")
    parser.add_argument("--base", type=Path, default=Path("/tmp/anex-scale"))  # noqa: S108 (a benchmark's)
    parser.add_argument("--keep", action="store_true", help="leave the logs under --base")
    args = parser.parse_args(argv)
    wanted = [name.upper() for name in args.scenario]
    if wanted == ["ALL"]:
        wanted = list(SCENARIOS)
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")

    # A Ctrl-C or SIGTERM still stops every process group started.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results: dict[str, bool] = {}
    # The simulated scenarios share one deployment; S12 gets a REAL-engine one of its own.
    for engine in (SIMULATED, REAL):
        names = [name for name in wanted if (name in REAL_ENGINE) == (engine == REAL)]
        if names and not run_on(engine, names, args, results):
            break  # interrupted
    say("summary: " + ", ".join(f"{name} {'PASS' if ok else 'FAIL'}"
                                for name, ok in results.items()))
    return 0 if results and all(results.values()) else 1


def run_on(engine: str, names: list[str], args: argparse.Namespace,
           results: dict[str, bool]) -> bool:
    """Start a deployment whose GPU workers run `engine`, run the scenarios on it, stop it;
    False when interrupted."""
    run_args = argparse.Namespace(**vars(args))
    run_args.rows = args.rows or ROWS_DEFAULT[engine]
    if engine == REAL and importlib.util.find_spec("vllm") is None:
        say(f"{', '.join(names)} FAIL: the REAL engine needs vLLM installed (make install-cpu)")
        results.update(dict.fromkeys(names, False))
        return True
    if engine == REAL:
        # One REAL worker at start; S12 starts the second itself.
        checkpoint = args.checkpoint or real_checkpoint()
        cluster = Cluster(base=args.base, model=REAL_MODEL, gpu_workers=1,
                          worker_threads=args.threads, engine=REAL,
                          env_extra=env_knobs(run_args))
    else:
        from bench.scale.simcheckpoint import simulated_checkpoint

        checkpoint = args.checkpoint or simulated_checkpoint(args.base.parent /
                                                             "anex-scale-checkpoint")
        cluster = Cluster(base=args.base, model=args.model, gpu_workers=args.workers,
                          worker_threads=args.threads, env_extra=env_knobs(run_args))
    interrupted = False
    try:
        cluster.start(checkpoint)
        harness = Harness(cluster, run_args)
        if engine == REAL:
            say(f"REAL-engine fleet: the product's worker-gpu role with the real "
                f"{REAL_MODEL} vLLM engine (no simulation); checkpoint {checkpoint}")
        else:
            say(f"SIMULATED fleet: {args.workers} workers x batch {args.batch} / "
                f"({args.decode} steps x {args.step_ms} ms) = ideal "
                f"{harness.ideal_rows_per_second:,.0f} rows/s; checkpoint {checkpoint}")
        for name in names:
            say(f"=== {name}: {(SCENARIOS[name].__doc__ or name).strip().splitlines()[0]}")
            try:
                results[name] = SCENARIOS[name](harness)
            except Exception as error:  # a scenario that broke is a FAIL, the rest still run
                import traceback

                traceback.print_exc()
                say(f"{name} FAIL: the scenario raised {type(error).__name__}: {error}")
                results[name] = False
    except KeyboardInterrupt:
        say("interrupted")
        interrupted = True
    finally:
        cluster.stop()
        if not args.keep:  # the logs stay; the database's files go
            shutil.rmtree(args.base / "pg" / "data", ignore_errors=True)
    return not interrupted


def real_checkpoint() -> Path:
    """The local tiny-qwen3 checkpoint, built (once, about a minute) where make run builds
    it when no --checkpoint names one."""
    from inference.checkpoints import TINY_QWEN3, checkpoints_build

    return checkpoints_build(dest=ROOT / ".run" / "checkpoints")[TINY_QWEN3]


if __name__ == "__main__":
    sys.exit(main())
