"""Rows per second on the same 2,000 chat rows, three ways, on the local tiny Qwen3:

  (a) a whole anex job after the engine is up: approve -> chunks through the broker and a
      worker -> one engine call per chunk -> chunk results -> the merged result file;
  (b) vLLM's LLM.chat directly, all rows in one call, on the same engine;
  (c) vLLM's batch runner (`python -m vllm.entrypoints.openai.run_batch`, what
      `vllm run-batch` runs), timed whole and with its start-up (a 1-row run) taken off.

    python -m anex.devstack exec -- .venv/bin/python bench/run_throughput.py [ROWS] [TOKENS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")


def rows_file(path: Path, rows: int, tokens: int) -> None:
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(json.dumps({
                "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "tiny-qwen3", "max_completion_tokens": tokens,
                         "messages": [{"role": "user", "content": f"Tell me about item {i}."}],
                         "chat_template_kwargs": {"enable_thinking": False}}}) + "\n")


def run_batch_seconds(checkpoint: Path, source: Path, context: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source),
             "-o", str(Path(scratch) / "out.jsonl"), "--model", str(checkpoint),
             "--served-model-name", "tiny-qwen3", "--max-model-len", str(context),
             "--enforce-eager", "--enable-prefix-caching"],
            check=True, capture_output=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"})
        return time.monotonic() - started


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    import django

    django.setup()
    import dramatiq
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")  # the actors the in-process worker runs
    from anex.broker import run_queues_declare
    from console.actors import Actor
    from console.services import organization_create
    from inference.catalog import model_get
    from inference.checkpoints import checkpoints_build
    from inference.engines import engine_for
    from inference.engines.runtime import llm_load
    from jobs.constants import JobStatus
    from jobs.models import Job
    from jobs.services.inputs import input_upload_create
    from jobs.services.lifecycle import job_approve
    from jobs.storage import storage_for

    checkpoint = checkpoints_build()["tiny-qwen3"]
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint}
    settings.ANEX_WORKER_MODELS = ["tiny-qwen3"]
    model = model_get("tiny-qwen3")
    assert model is not None
    source = Path(tempfile.mkdtemp()) / "rows.jsonl"
    rows_file(source, rows, tokens)
    one_row = source.with_name("one.jsonl")
    rows_file(one_row, 1, tokens)

    engine = engine_for("tiny-qwen3")  # (a) and (b) share this engine, loaded once here
    llm = llm_load(checkpoint, runner="generate", max_model_len=model.context_tokens).llm

    # (b) LLM.chat directly: every row in one call.
    from vllm import SamplingParams

    conversations = [json.loads(line)["body"]["messages"] for line in source.open()]
    # The engine's own settings (greedy, same cap), so both sides generate the same tokens.
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    llm.chat(conversations[:8], params, use_tqdm=False,
             chat_template_kwargs={"enable_thinking": False})  # warm-up
    started = time.monotonic()
    outputs = llm.chat(conversations, params, use_tqdm=False,
                       chat_template_kwargs={"enable_thinking": False})
    direct = time.monotonic() - started
    direct_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)

    # (a) a whole anex job, engine already up.
    actor = Actor(system="bench")
    organization = organization_create(name="bench", actor=actor)
    from billing.services import credits_grant

    credits_grant(organization=organization, cents=10**7, reason="bench", actor=actor)
    from console.constants import Region
    from jobs.constants import InputFormat

    item, _ = input_upload_create(organization=organization, actor=actor,
                                  fmt=InputFormat.JSONL, residency=Region.WORLD)
    storage_for("world").write_stream(item.object_key, iter([source.read_bytes()]),
                                      max_bytes=10**9)
    from jobs.services.inputs import input_refresh

    item = input_refresh(item=item)
    job = Job.objects.create(organization=organization, input=item, model="tiny-qwen3",
                             status=JobStatus.COST_READY, est_cost_cents=10**6, row_count=rows,
                             max_output_tokens=tokens, reasoning=False)
    broker = dramatiq.get_broker()
    broker.flush_all()
    run_queues_declare()
    worker = dramatiq.Worker(broker, worker_threads=1)  # the only worker of this process
    worker.start()
    del engine
    started = time.monotonic()
    job_approve(job=job, actor=actor)
    while Job.objects.get(pk=job.pk).status not in (JobStatus.DONE, JobStatus.FAILED):
        time.sleep(0.05)
    whole_job = time.monotonic() - started
    worker.stop()
    finished = Job.objects.get(pk=job.pk)
    assert finished.status == JobStatus.DONE
    from jobs.models import Chunk

    anex_tokens = sum(chunk.usage.get("output_tokens", 0) for chunk in Chunk.objects.filter(
        job=finished))

    # (c) the batch runner, in its own process (it loads the model itself).
    batch_total = run_batch_seconds(checkpoint, source, model.context_tokens)
    batch_startup = run_batch_seconds(checkpoint, one_row, model.context_tokens)
    batch_work = max(batch_total - batch_startup, 1e-3)

    print(f"{rows} rows x {tokens} output tokens, tiny-qwen3 on {os.cpu_count()} CPU cores, "
          f"chunks of {settings.ANEX_CHUNK_ROWS}")
    print(f"(a) anex job            {rows / whole_job:9.1f} rows/s  ({whole_job:.1f} s, "
          f"{anex_tokens} tokens generated)")
    print(f"(b) LLM.chat direct     {rows / direct:9.1f} rows/s  ({direct:.1f} s, "
          f"{direct_tokens} tokens generated)")
    print(f"(c) run-batch, whole    {rows / batch_total:9.1f} rows/s  ({batch_total:.1f} s)")
    print(f"(c) run-batch, no start {rows / batch_work:9.1f} rows/s  ({batch_work:.1f} s)")
    print(f"anex / direct = {direct / whole_job:.2f}   anex / run-batch (whole) = "
          f"{batch_total / whole_job:.2f}   anex / run-batch (no start-up) = "
          f"{batch_work / whole_job:.2f}")


if __name__ == "__main__":
    main()
