"""Rows per second of a whole anex job against the engine called directly, in one process,
on one engine, measured in alternating rounds so both sides see the same machine load.

    python -m anex.devstack exec -- .venv/bin/python bench/run_throughput.py \
        [--cases chat embed media cost-ready shared-prefix system-prompt duplicates]
        [--rows 2000] [--tokens 16 128] [--embed-rows 2000] [--cost-ready-rows 100000]
        [--rounds 3] [--run-batch] [--kv-cache-tokens N]

Without --cases: cost-ready, chat, media (with --media-rows) and embed, as before issue 43.
`--cases shared-prefix duplicates` runs issue 43's cases (below) and prints the lines
`shared-prefix`, `system-prompt`, `duplicates chat` and `duplicates embed`.

Chat (tiny-qwen3, greedy, thinking off): for each output cap,
  (a) a whole anex job after the engine is up: approve -> chunks through the broker and a
      worker as `make run` starts it (4 threads, Dramatiq's default poll of idle queues)
      -> the engine's feed -> chunk results -> the merged result file, timed from approve
      to done;
  (b) vLLM's LLM.chat directly, every row in one call, on the same engine;
  and, with --run-batch, (c) vLLM's batch runner (`python -m vllm.entrypoints.openai.
  run_batch`, what `vllm run-batch` runs), timed whole and with its start-up taken off.
Every row decodes the whole cap on both sides (ignore_eos: the trained tiny model would
otherwise stop after about 13 tokens whatever the cap, and the 128-token case would measure
the overheads, not decoding): LLM.chat is given ignore_eos, and the job's requests get it
where the job's SamplingParams reach the engine feed (this process is the worker; the
product itself never ignores EOS). Rows/s and output tokens/s are printed for both sides;
both sides' greedy outputs are compared row by row (text and token count).

Embeddings (all-minilm-l6-v2, --embed-rows short rows): (a) a whole anex embedding job
from approve to done, against (b) LLM.embed directly; and the seconds from submit to
cost_ready (every row checked and counted) of a --cost-ready-rows embedding job.

Media (tiny-vl, --media-rows rows each carrying one PNG picture as a data: URI, greedy,
thinking off, --media-tokens each): (a) a whole anex job, its pictures decoded by the worker
(inference.kinds.media) and handed to the engine beside the rendered prompt, against (b)
LLM.chat on the same engine given the same pictures already decoded (PIL images, as
`image_pil` parts), every row in one call.

Rows that share work (issue 43), tiny-qwen3 greedy, thinking off, --shared-tokens (16)
each, every row decoding its cap; the anex job is submitted (its estimate reads and plans
the rows: the grouping of rows that share work is done there) and timed from approve to
done, its submit -> cost_ready printed beside; LLM.chat gets every row in file order. The
chat engine's KV cache is capped for the run (--kv-cache-tokens, ANEX_KV_CACHE_TOKENS: the
same engine, so the same budget, on both sides, and for every chat case of the run;
16,384 tokens by default with shared-prefix or system-prompt)
and its prefix cache emptied (reset_prefix_cache) before each side. The cached share
printed is vLLM's num_cached_tokens over the prompt tokens of the requests the engine ran
(anex: those its feed ran; "rows report": the rows' usage.prompt_tokens_details, where
they carry it), so duplicates merged before the engine count nowhere.
  shared-prefix: --documents (120) made-up documents of --document-tokens (1,000) asked
      --questions (5) questions each, one row a question, the document first, the rows
      shuffled: 600 rows of about 1,020 tokens; the budget holds about 15 such rows, about
      an eighth of the documents. About 2 minutes a side in file order on 2 quiet cores
      (estimated; 5-7 minutes measured at a load of 10, 2026-12-06).
  system-prompt: --system-rows (1,000) rows, each one of --system-prompts (4) system
      prompts of --system-tokens (800) at random and its own short question: vLLM's own
      cache already keeps the few prompts.
  duplicates chat / duplicates embed: --duplicate-rows (2,000) short rows of which
      --duplicate-share (30 %) repeat an earlier row (its body, another custom_id), chat on
      tiny-qwen3 and embeddings on all-minilm-l6-v2 (LLM.embed on every row). The chat rows
      are shorter than a KV block (128 tokens on the CPU build): vLLM's prefix cache saves
      nothing on a repeat, only computing it once does.

Each round runs both sides, the order swapped every round (prefix caching favours the
second), on rows not seen before; the ratio printed is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
CHAT_MODEL, EMBED_MODEL, MEDIA_MODEL = "tiny-qwen3", "all-minilm-l6-v2", "tiny-vl"
# The worker `make run` starts (anex.devstack: `dramatiq anex.worker --processes 1 --threads
# 4`): 4 threads, and Dramatiq's own worker_timeout (an idle queue's consumer polls up to
# once a second, and is woken sooner by the broker's doorbell, anex.broker, as in make
# run), not a faster poll that would flatter the job side.
WORKER_THREADS = 4
# The chat engine's KV budget for the shared-prefix cases (both sides): 128 blocks of 128
# tokens, about 15 rows of a 1,000-token document at once, a tenth of --documents' 120.
SHARED_KV_TOKENS = 16_384


# What the engine feed ran for the jobs since the last reset (decode_the_cap counts it):
# requests, their prompt tokens and the tokens vLLM found in its prefix cache.
FED = {"requests": 0, "prompt": 0, "cached": 0}


def decode_the_cap() -> None:
    """Every job request decodes its whole cap (ignore_eos), as LLM.chat is asked to: set
    where the job's SamplingParams are handed to the engine feed, in this process. What the
    engine ran is counted into FED (vLLM's num_cached_tokens of each output)."""
    from inference.engines.feed import EngineFeed

    run = EngineFeed.run

    def run_to_the_cap(self: EngineFeed, prompts: Any, params: Any, *args: Any,
                       **kwargs: Any) -> Any:
        for item in params:
            if getattr(item, "max_tokens", None) and item.max_tokens > 1:  # not a decision
                item.ignore_eos = True
        results = run(self, prompts, params, *args, **kwargs)
        for result in results:
            if hasattr(result, "prompt_token_ids"):
                FED["requests"] += 1
                FED["prompt"] += len(result.prompt_token_ids or ())
                FED["cached"] += result.num_cached_tokens or 0
        return results

    EngineFeed.run = run_to_the_cap  # type: ignore[method-assign]


def chat_rows(path: Path, rows: int, tokens: int, tag: str) -> None:
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(json.dumps({
                "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user",
                                       "content": f"Tell me about item {tag}-{i}."}],
                         "chat_template_kwargs": {"enable_thinking": False}}}) + "\n")


def media_pictures(rows: int, tag: str) -> list[Any]:
    """One picture a row, each of its own colour (prefix caching reuses none)."""
    from PIL import Image

    seed = sum(map(ord, tag))
    return [Image.new("RGB", (96, 64), ((seed + i * 7) % 256, (i * 13) % 256, (i * 29) % 256))
            for i in range(rows)]


def media_rows(path: Path, pictures: list[Any], tokens: int) -> None:
    import base64
    import io

    with path.open("w") as handle:
        for i, picture in enumerate(pictures):
            png = io.BytesIO()
            picture.save(png, "PNG")
            url = f"data:image/png;base64,{base64.b64encode(png.getvalue()).decode()}"
            handle.write(json.dumps({
                "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "What is the main colour?"},
                    {"type": "image_url", "image_url": {"url": url}}]}],
                    "chat_template_kwargs": {"enable_thinking": False}}}) + "\n")


def embed_rows(path: Path, rows: int, tag: str) -> None:
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(json.dumps({
                "custom_id": f"row-{i}", "method": "POST", "url": "/v1/embeddings",
                "body": {"input": f"Short row {tag} number {i} about batch inference."}})
                + "\n")


def run_batch_seconds(checkpoint: Path, source: Path, context: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source),
             "-o", str(Path(scratch) / "out.jsonl"), "--model", str(checkpoint),
             "--served-model-name", CHAT_MODEL, "--max-model-len", str(context),
             "--enforce-eager", "--enable-prefix-caching"],
            check=True, capture_output=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"})
        return time.monotonic() - started


def _feed(model_id: str) -> Any:
    """What keeps the model's engine busy periods: the engine feed a chat model's chunks go
    through, or the embedding engine itself (each chunk's one engine run, timed by
    time_embedding_runs)."""
    from inference.kinds import engine_for

    engine = engine_for(model_id)
    return getattr(engine, "feed", engine if hasattr(engine, "busy_periods") else None)


def time_embedding_runs(engine: Any) -> None:
    """Each engine run of an embedding engine timed into its `busy_periods` (as the chat
    feed keeps its own): the bench's instrument on this process's engine, not the
    product's. Runs of LLM.embed on the same engine are timed too, and left out by time."""
    from collections import deque

    periods: deque[tuple[float, float]] = deque(maxlen=1024)
    engine.busy_periods = periods
    encode = engine.llm.encode

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = encode(*args, **kwargs)
        periods.append((started, time.monotonic()))
        return result

    engine.llm.encode = timed


class Bench:
    """The database, broker and worker of one process, and a funded organization."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, float, float]] = []
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")  # the actors the in-process worker runs
        from django.conf import settings

        from billing.services import credits_grant
        from console.actors import Actor
        from console.services import organization_create
        from inference.checkpoints import checkpoints_build

        built = checkpoints_build()
        settings.ANEX_CHECKPOINTS = {CHAT_MODEL: built["tiny-qwen3"],
                                     EMBED_MODEL: built["minilm"],
                                     MEDIA_MODEL: built["tiny-vl"]}
        settings.ANEX_WORKER_MODELS = [CHAT_MODEL, EMBED_MODEL, MEDIA_MODEL]
        self.settings = settings
        self.actor = Actor(system="bench")
        self.organization = organization_create(name="bench", actor=self.actor)
        credits_grant(organization=self.organization, cents=10**8, reason="bench",
                      actor=self.actor)

    def input_of(self, source: Path) -> Any:
        from anex.regions import Region
        from inference.constants import InputFormat
        from jobs.services.inputs import input_refresh, input_upload_create
        from jobs.storage import storage_for

        item, _ = input_upload_create(organization=self.organization, actor=self.actor,
                                      fmt=InputFormat.JSONL, residency=Region.WORLD)
        with source.open("rb") as handle:
            storage_for("world").write_stream(item.object_key,
                                              iter(lambda: handle.read(1 << 20), b""),
                                              max_bytes=10**10)
        return input_refresh(item=item)

    def job_run(self, source: Path, model: str, rows: int, tokens: int | None) -> float:
        """Approve -> done of a cost_ready job on this input; seconds. `self.spans` keeps
        where that time went: (approve -> first engine step, engine busy, engine idle
        between its first and last step, last step -> done)."""
        from inference.catalog import model_get
        from inference.kinds import kind_for
        from jobs.constants import JobStatus
        from jobs.models import Job

        catalog = model_get(model)
        assert catalog is not None
        job = Job.objects.create(organization=self.organization, input=self.input_of(source),
                                 model=model, task_type=kind_for(catalog).task,
                                 status=JobStatus.COST_READY,
                                 est_cost_cents=10**7, row_count=rows,
                                 max_output_tokens=tokens,
                                 reasoning=False if tokens is not None else None)
        return self.approve_and_wait(job, model)

    def job_submit_run(self, source: Path, model: str, rows: int,
                       tokens: int | None) -> tuple[float, float]:
        """A job as a customer's: submitted (the estimate reads, checks and plans every row,
        the grouping of rows that share work included), then approved. (approve -> done,
        submit -> cost_ready) in seconds."""
        from anex.regions import Region
        from inference.rows.core import JobOptions
        from jobs.constants import JobStatus
        from jobs.models import Job
        from jobs.services.submission import JobRequest, job_submit

        options = JobOptions(model=model, max_output_tokens=tokens,
                             reasoning=False if tokens is not None else None)
        item = self.input_of(source)
        wall = time.time()
        job = job_submit(organization=self.organization, actor=self.actor,
                         request=JobRequest(options=options, input_id=str(item.pk)),
                         host_region=Region.WORLD)
        estimate = self.wait_for(job.pk, (JobStatus.COST_READY, JobStatus.FAILED), wall)
        job = Job.objects.get(pk=job.pk)
        assert job.row_count == rows, job.failure_reason
        return self.approve_and_wait(job, model), estimate

    def approve_and_wait(self, job: Any, model: str) -> float:
        from jobs.constants import JobStatus
        from jobs.models import Job
        from jobs.services.lifecycle import job_approve

        feed = _feed(model)
        started, wall = time.monotonic(), time.time()
        job_approve(job=job, actor=self.actor)
        ended = started + self.wait_for(job.pk, (JobStatus.DONE, JobStatus.FAILED), wall)
        seconds = ended - started
        if feed is not None:
            periods = [(a, b) for a, b in feed.busy_periods if a >= started and b <= ended]
            if periods:
                busy = sum(b - a for a, b in periods)
                first, last = periods[0][0], periods[-1][1]
                self.spans.append((first - started, busy, last - first - busy, ended - last))
        self.last_job = Job.objects.get(pk=job.pk)
        assert self.last_job.status == JobStatus.DONE, self.last_job.failure_reason
        return seconds

    def wait_for(self, job_id: Any, statuses: tuple[str, ...], since: float) -> float:
        """Seconds from `since` (time.time()) until the job reached one of `statuses`, read
        off its JobEvent (stamped by the worker that moved it). Polled every half second:
        this process is the worker, and an ORM query every 20 ms here slowed its engine by
        15-30%."""
        from jobs.models import Job, JobEvent

        while Job.objects.get(pk=job_id).status not in statuses:
            time.sleep(0.5)
        event = JobEvent.objects.filter(job_id=job_id, to_status__in=statuses).latest("id")
        return event.at.timestamp() - since

    def result_rows(self) -> dict[str, dict[str, Any]]:
        import orjson

        from jobs.results import result_key
        from jobs.storage import storage_for

        out = {}
        with storage_for("world").open(result_key(self.last_job)) as handle:
            for line in handle:
                row = orjson.loads(line)
                out[row["custom_id"]] = row["response"]["body"]
        return out

    def submit_to_cost_ready(self, source: Path, rows: int) -> float:
        """submit -> cost_ready of an embedding job (every row checked and counted)."""
        from anex.regions import Region
        from inference.rows.core import JobOptions
        from jobs.constants import JobStatus
        from jobs.models import Job
        from jobs.services.submission import JobRequest, job_submit

        item = self.input_of(source)
        wall = time.time()
        job = job_submit(organization=self.organization, actor=self.actor,
                         request=JobRequest(options=JobOptions(model=EMBED_MODEL),
                                            input_id=str(item.pk)),
                         host_region=Region.WORLD)
        seconds = self.wait_for(job.pk, (JobStatus.COST_READY, JobStatus.FAILED), wall)
        finished = Job.objects.get(pk=job.pk)
        assert finished.row_count == rows, finished.failure_reason
        return seconds


def chat_bench(bench: Bench, rows: int, tokens: int, rounds: int,
               run_batch: bool) -> dict[str, Any]:
    from vllm import SamplingParams

    from inference.catalog import model_get
    from inference.kinds import engine_for

    model = model_get(CHAT_MODEL)
    assert model is not None
    llm = engine_for(CHAT_MODEL).llm  # type: ignore[union-attr]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    kwargs = {"enable_thinking": False}
    # Warm-up at full size: the first batch of a size pays for allocations both sides reuse.
    llm.chat([[{"role": "user", "content": f"warm up {i}"}] for i in range(rows)], params,
             use_tqdm=False, chat_template_kwargs=kwargs)
    ratios, anex_best, direct_best = [], float("inf"), float("inf")
    mismatched = generated = served_tokens = 0
    anex_total = direct_total = 0.0
    bench.spans = []
    folder = Path(tempfile.mkdtemp())
    for number in range(rounds):
        source = folder / f"chat-{tokens}-{number}.jsonl"
        chat_rows(source, rows, tokens, tag=f"{tokens}.{number}")
        conversations = [json.loads(line)["body"]["messages"] for line in source.open()]

        def direct(conversations: list[Any] = conversations) -> tuple[float, Any]:
            started = time.monotonic()
            outputs = llm.chat(conversations, params, use_tqdm=False,
                               chat_template_kwargs=kwargs)
            return time.monotonic() - started, outputs

        if number % 2 == 0:
            direct_seconds, outputs = direct()
            anex_seconds = bench.job_run(source, CHAT_MODEL, rows, tokens)
        else:
            anex_seconds = bench.job_run(source, CHAT_MODEL, rows, tokens)
            direct_seconds, outputs = direct()
        ratios.append(direct_seconds / anex_seconds)
        anex_best, direct_best = min(anex_best, anex_seconds), min(direct_best, direct_seconds)
        anex_total, direct_total = anex_total + anex_seconds, direct_total + direct_seconds
        served = bench.result_rows()
        for i, output in enumerate(outputs):
            body = served[f"row-{i}"]
            completion = output.outputs[0]
            generated += len(completion.token_ids)
            served_tokens += body["usage"]["completion_tokens"]
            if body["choices"][0]["message"]["content"] != completion.text or \
                    body["usage"]["completion_tokens"] != len(completion.token_ids):
                mismatched += 1
    result: dict[str, Any] = {"anex": rows / anex_best, "direct": rows / direct_best,
              "ratio": statistics.median(ratios), "ratios": ratios, "mismatched": mismatched,
              "generated": generated, "served_tokens": served_tokens,
              # Output tokens a second over all rounds, each side its own tokens.
              "anex_tokens": served_tokens / anex_total,
              "direct_tokens": generated / direct_total,
              "spans": [statistics.median(span) for span in zip(*bench.spans, strict=True)]}
    if run_batch:
        one = folder / "one.jsonl"
        chat_rows(one, 1, tokens, tag="one")
        checkpoint = bench.settings.ANEX_CHECKPOINTS[CHAT_MODEL]
        whole = run_batch_seconds(checkpoint, folder / f"chat-{tokens}-0.jsonl",
                                  model.context_tokens)
        startup = run_batch_seconds(checkpoint, one, model.context_tokens)
        result.update(run_batch=rows / whole, run_batch_work=rows / max(whole - startup, 1e-3))
    return result


def media_bench(bench: Bench, rows: int, tokens: int, rounds: int) -> dict[str, Any]:
    from vllm import SamplingParams

    from inference.kinds import engine_for

    llm = engine_for(MEDIA_MODEL).llm  # type: ignore[union-attr]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    kwargs = {"enable_thinking": False}

    def conversations(pictures: list[Any]) -> list[Any]:
        return [[{"role": "user", "content": [
            {"type": "text", "text": "What is the main colour?"},
            {"type": "image_pil", "image_pil": picture}]}] for picture in pictures]

    llm.chat(conversations(media_pictures(rows, "warm")), params, use_tqdm=False,
             chat_template_kwargs=kwargs)
    ratios, anex_best, direct_best = [], float("inf"), float("inf")
    mismatched = 0
    bench.spans = []
    folder = Path(tempfile.mkdtemp())
    for number in range(rounds):
        pictures = media_pictures(rows, f"media-{number}")
        source = folder / f"media-{number}.jsonl"
        media_rows(source, pictures, tokens)

        def direct(pictures: list[Any] = pictures) -> tuple[float, Any]:
            started = time.monotonic()
            outputs = llm.chat(conversations(pictures), params, use_tqdm=False,
                               chat_template_kwargs=kwargs)
            return time.monotonic() - started, outputs

        if number % 2 == 0:
            direct_seconds, outputs = direct()
            anex_seconds = bench.job_run(source, MEDIA_MODEL, rows, tokens)
        else:
            anex_seconds = bench.job_run(source, MEDIA_MODEL, rows, tokens)
            direct_seconds, outputs = direct()
        ratios.append(direct_seconds / anex_seconds)
        anex_best, direct_best = min(anex_best, anex_seconds), min(direct_best, direct_seconds)
        served = bench.result_rows()
        for i, output in enumerate(outputs):
            if served[f"row-{i}"]["choices"][0]["message"]["content"] != \
                    output.outputs[0].text:
                mismatched += 1
    return {"anex": rows / anex_best, "direct": rows / direct_best,
            "ratio": statistics.median(ratios), "ratios": ratios, "mismatched": mismatched,
            "spans": [statistics.median(span) for span in zip(*bench.spans, strict=True)]}


def cost_ready_seconds(bench: Bench, rows: int) -> float:
    """submit -> cost_ready of a `rows`-row embedding job (no engine: every row checked and
    counted with the checkpoint's tokenizer)."""
    source = Path(tempfile.mkdtemp()) / "cost-ready.jsonl"
    embed_rows(source, rows, tag="estimate")
    return bench.submit_to_cost_ready(source, rows)


def embed_bench(bench: Bench, rows: int, rounds: int) -> dict[str, Any]:
    from vllm.pooling_params import PoolingParams

    from inference.kinds import engine_for

    engine = engine_for(EMBED_MODEL)
    time_embedding_runs(engine)
    llm = engine.llm  # type: ignore[union-attr]
    params = PoolingParams(use_activation=False)  # as the engine asks (normalised after)
    llm.embed([f"warm up {i}" for i in range(min(rows, 10_000))], pooling_params=params,
              use_tqdm=False)
    ratios, anex_best, direct_best = [], float("inf"), float("inf")
    bench.spans = []
    folder = Path(tempfile.mkdtemp())
    for number in range(rounds):
        source = folder / f"embed-{number}.jsonl"
        embed_rows(source, rows, tag=str(number))
        texts = [json.loads(line)["body"]["input"] for line in source.open()]

        def direct(texts: list[str] = texts) -> float:
            started = time.monotonic()
            llm.embed(texts, pooling_params=params, use_tqdm=False)
            return time.monotonic() - started

        if number % 2 == 0:
            direct_seconds = direct()
            anex_seconds = bench.job_run(source, EMBED_MODEL, rows, None)
        else:
            anex_seconds = bench.job_run(source, EMBED_MODEL, rows, None)
            direct_seconds = direct()
        ratios.append(direct_seconds / anex_seconds)
        anex_best, direct_best = min(anex_best, anex_seconds), min(direct_best, direct_seconds)
    return {"anex": rows / anex_best, "direct": rows / direct_best,
            "ratio": statistics.median(ratios), "ratios": ratios,
            "spans": [statistics.median(span) for span in zip(*bench.spans, strict=True)]}


# -- rows that share work (issue 43) ---------------------------------------------------------

WORDS = ("batch inference engine token prefix cache document question answer model row file "
         "chunk worker queue result table river mountain market letter garden window summer "
         "winter history science number policy report customer invoice order shipment city "
         "station library music theatre coffee bridge harbour field forest island road").split()
QUESTIONS = ("What is this document mainly about?", "Who is named first in it?",
             "Summarise it in one sentence.", "Which place does it mention most?",
             "What number appears last?", "Is the tone formal or informal?",
             "What would a good title be?", "Name one thing it leaves out.")


def text_of(tokenizer: Any, tag: str, tokens: int) -> str:
    """Made-up prose of about `tokens` tokens of the checkpoint, opening with its own tag (no
    two texts share a KV block)."""
    import random

    rng = random.Random(tag)  # noqa: S311 (a benchmark's rows, the same every run)
    words = [f"Document {tag}."]
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words += [rng.choice(WORDS) for _ in range(max(8, tokens // 8))]
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[:tokens]
    return str(tokenizer.decode(ids))


def chat_line(custom_id: str, messages: list[dict[str, str]]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": messages,
                                "chat_template_kwargs": {"enable_thinking": False}}}) + "\n"


def shared_prefix_rows(path: Path, tokenizer: Any, documents: int, questions: int,
                       document_tokens: int, tag: str) -> None:
    """Every document asked `questions` questions, one row each (the document first, so the
    rows of a document share its tokens as a prefix), in a random order."""
    import random

    texts = [text_of(tokenizer, f"{tag}-{d}", document_tokens) for d in range(documents)]
    pairs = [(d, q) for d in range(documents) for q in range(questions)]
    random.Random(tag).shuffle(pairs)  # noqa: S311
    with path.open("w") as handle:
        for i, (d, q) in enumerate(pairs):
            handle.write(chat_line(f"row-{i}", [{"role": "user", "content":
                                                 f"{texts[d]}\n\nQuestion: {QUESTIONS[q]}"}]))


def system_prompt_rows(path: Path, tokenizer: Any, rows: int, prompts: int,
                       prompt_tokens: int, tag: str) -> None:
    """A few long system prompts, each row one of them (at random) and its own question."""
    import random

    rng = random.Random(tag)  # noqa: S311
    systems = [text_of(tokenizer, f"system {tag}-{p}", prompt_tokens) for p in range(prompts)]
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(chat_line(f"row-{i}", [
                {"role": "system", "content": rng.choice(systems)},
                {"role": "user", "content": f"Tell me about item {tag}-{i}."}]))


def repeated(rows: int, share: float, tag: str) -> list[int]:
    """For each row the row whose body it carries: itself, or (`share` of the rows, never
    the first) an earlier row's, chosen at random."""
    import random

    rng = random.Random(tag)  # noqa: S311
    repeats = set(rng.sample(range(1, rows), round(rows * share)))
    source: list[int] = []
    for i in range(rows):
        source.append(source[rng.randrange(i)] if i in repeats else i)
    return source


def duplicate_chat_rows(path: Path, rows: int, share: float, tag: str) -> None:
    with path.open("w") as handle:
        for i, j in enumerate(repeated(rows, share, tag)):
            handle.write(chat_line(f"row-{i}", [{"role": "user",
                                                 "content": f"Tell me about item {tag}-{j}."}]))


def duplicate_embed_rows(path: Path, rows: int, share: float, tag: str) -> None:
    with path.open("w") as handle:
        for i, j in enumerate(repeated(rows, share, tag)):
            handle.write(json.dumps({
                "custom_id": f"row-{i}", "method": "POST", "url": "/v1/embeddings",
                "body": {"input": f"Short row {tag} number {j} about batch inference."}})
                + "\n")


def cached_share(outputs: list[Any]) -> float:
    prompt = sum(len(o.prompt_token_ids or ()) for o in outputs)
    return sum(o.num_cached_tokens or 0 for o in outputs) / max(prompt, 1)


def served_cached_share(served: dict[str, dict[str, Any]]) -> float | None:
    """The cached share the job's rows report (usage.prompt_tokens_details.cached_tokens);
    None where they do not carry it."""
    prompt = cached = 0
    for body in served.values():
        usage = body.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if "cached_tokens" not in details:
            return None
        prompt += usage.get("prompt_tokens", 0)
        cached += details["cached_tokens"]
    return cached / max(prompt, 1)


def shared_chat_bench(bench: Bench, write: Any, rows: int, tokens: int,
                      rounds: int) -> dict[str, Any]:
    """A chat case of rows sharing work: `write(path, tag)` writes a round's rows. Both sides
    on the same engine (and its KV budget), its prefix cache emptied before each: (a) the
    job submitted (its estimate plans the rows: grouping lands there), approved, timed from
    approve to done; (b) LLM.chat on every row in file order."""
    from vllm import SamplingParams

    from inference.kinds import engine_for

    engine = engine_for(CHAT_MODEL)
    llm = engine.llm  # type: ignore[union-attr]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    kwargs = {"enable_thinking": False}
    folder = Path(tempfile.mkdtemp())

    def conversations_of(source: Path) -> list[Any]:
        return [json.loads(line)["body"]["messages"] for line in source.open()]

    def empty_cache() -> None:
        with engine.lock:  # type: ignore[union-attr]
            assert llm.reset_prefix_cache()

    warm = folder / "warm.jsonl"
    write(warm, "warm")
    llm.chat(conversations_of(warm)[:256], params, use_tqdm=False, chat_template_kwargs=kwargs)
    ratios, anex_best, direct_best = [], float("inf"), float("inf")
    direct_shares, anex_shares, served_shares, estimates = [], [], [], []
    mismatched = 0
    bench.spans = []
    for number in range(rounds):
        source = folder / f"round-{number}.jsonl"
        write(source, f"r{number}")
        conversations = conversations_of(source)

        def direct(conversations: list[Any] = conversations) -> tuple[float, Any]:
            empty_cache()
            started = time.monotonic()
            outputs = llm.chat(conversations, params, use_tqdm=False,
                               chat_template_kwargs=kwargs)
            return time.monotonic() - started, outputs

        def anex(source: Path = source) -> float:
            empty_cache()
            FED.update(requests=0, prompt=0, cached=0)
            seconds, estimate = bench.job_submit_run(source, CHAT_MODEL, rows, tokens)
            estimates.append(estimate)
            anex_shares.append(FED["cached"] / max(FED["prompt"], 1))
            return seconds

        if number % 2 == 0:
            direct_seconds, outputs = direct()
            anex_seconds = anex()
        else:
            anex_seconds = anex()
            direct_seconds, outputs = direct()
        ratios.append(direct_seconds / anex_seconds)
        anex_best, direct_best = min(anex_best, anex_seconds), min(direct_best, direct_seconds)
        direct_shares.append(cached_share(outputs))
        served = bench.result_rows()
        share = served_cached_share(served)
        if share is not None:
            served_shares.append(share)
        for i, output in enumerate(outputs):
            if served[f"row-{i}"]["choices"][0]["message"]["content"] != output.outputs[0].text:
                mismatched += 1
    return {"anex": rows / anex_best, "direct": rows / direct_best,
            "ratio": statistics.median(ratios), "ratios": ratios, "mismatched": mismatched,
            "anex_cached": statistics.median(anex_shares),
            "direct_cached": statistics.median(direct_shares),
            "served_cached": statistics.median(served_shares) if served_shares else None,
            "engine_requests": FED["requests"], "estimate": statistics.median(estimates),
            "spans": [statistics.median(span) for span in zip(*bench.spans, strict=True)]}


def duplicate_embed_bench(bench: Bench, rows: int, share: float,
                          rounds: int) -> dict[str, Any]:
    """Embedding rows of which `share` repeat an earlier row: the job submitted and approved
    (approve -> done) against LLM.embed on every row."""
    from vllm.pooling_params import PoolingParams

    from inference.kinds import engine_for

    engine = engine_for(EMBED_MODEL)
    if not hasattr(engine, "busy_periods"):
        time_embedding_runs(engine)
    llm = engine.llm  # type: ignore[union-attr]
    params = PoolingParams(use_activation=False)
    llm.embed([f"warm up {i}" for i in range(rows)], pooling_params=params, use_tqdm=False)
    ratios, anex_best, direct_best, estimates = [], float("inf"), float("inf"), []
    bench.spans = []
    folder = Path(tempfile.mkdtemp())
    for number in range(rounds):
        source = folder / f"embed-duplicates-{number}.jsonl"
        duplicate_embed_rows(source, rows, share, tag=f"d{number}")
        texts = [json.loads(line)["body"]["input"] for line in source.open()]

        def direct(texts: list[str] = texts) -> float:
            started = time.monotonic()
            llm.embed(texts, pooling_params=params, use_tqdm=False)
            return time.monotonic() - started

        def anex(source: Path = source) -> float:
            seconds, estimate = bench.job_submit_run(source, EMBED_MODEL, rows, None)
            estimates.append(estimate)
            return seconds

        if number % 2 == 0:
            direct_seconds = direct()
            anex_seconds = anex()
        else:
            anex_seconds = anex()
            direct_seconds = direct()
        ratios.append(direct_seconds / anex_seconds)
        anex_best, direct_best = min(anex_best, anex_seconds), min(direct_best, direct_seconds)
    return {"anex": rows / anex_best, "direct": rows / direct_best,
            "ratio": statistics.median(ratios), "ratios": ratios,
            "estimate": statistics.median(estimates),
            "spans": [statistics.median(span) for span in zip(*bench.spans, strict=True)]}


def shared_print(name: str, r: dict[str, Any], rows: int, rounds: int) -> None:
    served = "n/a" if r["served_cached"] is None else f"{r['served_cached']:.1%}"
    print(f"{name}: anex {r['anex']:7.1f} rows/s (engine cached {r['anex_cached']:.1%}, rows "
          f"report {served})  LLM.chat {r['direct']:7.1f} rows/s (cached "
          f"{r['direct_cached']:.1%})  anex/direct = {r['ratio']:.2f} (rounds "
          f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); engine requests of the last job "
          f"{r['engine_requests']} of {rows} rows; submit -> cost_ready {r['estimate']:.2f} s; "
          f"greedy outputs differing: {r['mismatched']} of {rows * rounds} rows", flush=True)
    spans_print(r["spans"])


def spans_print(spans: list[float]) -> None:
    if spans:
        start, busy, idle, finish = spans
        print(f"      anex job, median: approve -> first engine step {start:.2f} s, "
              f"engine busy {busy:.2f} s, idle between steps {idle:.2f} s, last "
              f"step -> done {finish:.2f} s", flush=True)


CASES = ("cost-ready", "chat", "media", "embed", "shared-prefix", "system-prompt",
         "duplicates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES,
                        help="the cases to run (default: cost-ready, chat, media where "
                             "--media-rows, embed, as before issue 43)")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--tokens", type=int, nargs="*", default=[16, 128])
    parser.add_argument("--embed-rows", type=int, default=2_000, help="0: skip")
    parser.add_argument("--cost-ready-rows", type=int, default=100_000, help="0: skip")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-batch", action="store_true")
    parser.add_argument("--media-rows", type=int, default=0, help="0: skip")
    parser.add_argument("--media-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-tokens", type=int, default=None,
                        help="the chat engine's KV budget (ANEX_KV_CACHE_TOKENS), both sides; "
                             f"default {SHARED_KV_TOKENS} with shared-prefix or system-prompt, "
                             "else vLLM's own sizing (0)")
    parser.add_argument("--documents", type=int, default=120)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--document-tokens", type=int, default=1000)
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--system-rows", type=int, default=1000)
    parser.add_argument("--system-tokens", type=int, default=800)
    parser.add_argument("--duplicate-rows", type=int, default=2000)
    parser.add_argument("--duplicate-share", type=float, default=0.3)
    parser.add_argument("--shared-tokens", type=int, default=16,
                        help="output tokens of the issue-43 chat cases")
    args = parser.parse_args()
    cases = args.cases or [c for c in ("cost-ready", "chat", "media", "embed")
                           if (c != "cost-ready" or args.cost_ready_rows)
                           and (c != "media" or args.media_rows)
                           and (c != "embed" or args.embed_rows)]
    if "shared-prefix" in cases and "system-prompt" not in cases:
        cases.append("system-prompt")  # the shared prefix vLLM's own cache already serves
    budget = args.kv_cache_tokens
    if budget is None:
        budget = SHARED_KV_TOKENS if {"shared-prefix", "system-prompt"} & set(cases) else 0
    bench = Bench()
    bench.settings.ANEX_KV_CACHE_TOKENS = budget  # before the chat engine is built
    import dramatiq

    from jobs.dispatch import run_queues_declare

    broker = dramatiq.get_broker()
    broker.flush_all()
    run_queues_declare()
    decode_the_cap()
    worker = dramatiq.Worker(broker, worker_threads=WORKER_THREADS)  # Dramatiq's poll
    worker.start()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} CPU cores, load "
          f"{os.getloadavg()[0]:.1f}, chunks of {bench.settings.ANEX_CHUNK_ROWS} rows, "
          f"{bench.settings.ANEX_DISPATCH_IN_FLIGHT} in flight, worker threads "
          f"{WORKER_THREADS} polling every {worker.worker_timeout} ms and woken by the broker's "
          f"doorbell (as make run), every "
          f"row decoding its cap, median of {args.rounds} alternating rounds; cases "
          f"{' '.join(cases)}", flush=True)
    try:
        run_cases(bench, cases, args, budget)
    finally:
        worker.stop()
    print(f"load at the end {os.getloadavg()[0]:.1f}")


def run_cases(bench: Bench, cases: list[str], args: argparse.Namespace, budget: int) -> None:
    if "cost-ready" in cases and args.cost_ready_rows:
        seconds = cost_ready_seconds(bench, args.cost_ready_rows)
        print(f"embed {args.cost_ready_rows} rows: submit -> cost_ready {seconds:.2f} s",
              flush=True)
    if {"shared-prefix", "system-prompt", "duplicates"} & set(cases):
        from inference.engines.runtime import kv_cache_tokens
        from inference.kinds import engine_for

        engine = engine_for(CHAT_MODEL)
        tokenizer = engine.llm.get_tokenizer()  # type: ignore[union-attr]
        held = kv_cache_tokens(engine.llm)  # type: ignore[union-attr]
        print(f"chat engine's KV cache: {held} tokens (budget {budget or 'unset'}): "
              f"{(held or 0) // (args.document_tokens + 40 + args.shared_tokens)} rows of a "
              f"{args.document_tokens}-token document at once, or that many of the "
              f"{args.documents} documents held for their other questions", flush=True)
    if "shared-prefix" in cases:
        rows = args.documents * args.questions
        r = shared_chat_bench(
            bench, lambda path, tag: shared_prefix_rows(
                path, tokenizer, args.documents, args.questions, args.document_tokens, tag),
            rows, args.shared_tokens, args.rounds)
        shared_print(f"shared-prefix {args.documents} documents of {args.document_tokens} "
                     f"tokens x {args.questions} questions = {rows} rows (shuffled) x "
                     f"{args.shared_tokens} tokens, KV {held} tokens", r, rows, args.rounds)
    if "system-prompt" in cases:
        r = shared_chat_bench(
            bench, lambda path, tag: system_prompt_rows(
                path, tokenizer, args.system_rows, args.system_prompts, args.system_tokens,
                tag),
            args.system_rows, args.shared_tokens, args.rounds)
        shared_print(f"system-prompt {args.system_prompts} system prompts of "
                     f"{args.system_tokens} tokens x {args.system_rows} rows x "
                     f"{args.shared_tokens} tokens, KV {held} tokens", r, args.system_rows,
                     args.rounds)
    if "duplicates" in cases:
        repeats = round(args.duplicate_rows * args.duplicate_share)
        r = shared_chat_bench(
            bench, lambda path, tag: duplicate_chat_rows(
                path, args.duplicate_rows, args.duplicate_share, tag),
            args.duplicate_rows, args.shared_tokens, args.rounds)
        shared_print(f"duplicates chat {args.duplicate_rows} rows ({repeats} repeating an "
                     f"earlier row) x {args.shared_tokens} tokens", r, args.duplicate_rows,
                     args.rounds)
    if "chat" in cases:
        for tokens in args.tokens:
            r = chat_bench(bench, args.rows, tokens, args.rounds, args.run_batch)
            print(
                f"chat  {args.rows} rows x {tokens:>3} tokens: anex {r['anex']:7.1f} rows/s "
                f"{r['anex_tokens']:8.0f} tokens/s  LLM.chat {r['direct']:7.1f} rows/s "
                f"{r['direct_tokens']:8.0f} tokens/s  anex/direct = {r['ratio']:.2f} "
                f"(rounds {', '.join(f'{x:.2f}' for x in r['ratios'])}); greedy outputs "
                f"differing: {r['mismatched']} of {args.rows * args.rounds} rows "
                f"({r['generated']} tokens direct, {r['served_tokens']} served; "
                f"{r['generated'] / (args.rows * args.rounds):.1f} a row)", flush=True)
            spans_print(r["spans"])
            if "run_batch" in r:
                print(f"      vLLM run-batch {r['run_batch']:.1f} rows/s whole, "
                      f"{r['run_batch_work']:.1f} rows/s without its start-up", flush=True)
    if "media" in cases:
        media_rows = args.media_rows or 200
        r = media_bench(bench, media_rows, args.media_tokens, args.rounds)
        print(
            f"media {media_rows} image rows x {args.media_tokens} tokens: anex "
            f"{r['anex']:7.1f} rows/s  LLM.chat (pictures decoded) {r['direct']:7.1f} "
            f"rows/s  anex/direct = {r['ratio']:.2f} (rounds "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); greedy outputs differing: "
            f"{r['mismatched']} of {media_rows * args.rounds} rows", flush=True)
        spans_print(r["spans"])
    if "embed" in cases and args.embed_rows:
        r = embed_bench(bench, args.embed_rows, args.rounds)
        print(
            f"embed {args.embed_rows} rows: anex {r['anex']:7.1f} rows/s  LLM.embed "
            f"{r['direct']:7.1f} rows/s  anex/direct = {r['ratio']:.2f} (rounds "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])})", flush=True)
        spans_print(r["spans"])
    if "duplicates" in cases:
        r = duplicate_embed_bench(bench, args.duplicate_rows, args.duplicate_share,
                                  args.rounds)
        print(
            f"duplicates embed {args.duplicate_rows} rows ({repeats} repeating an earlier "
            f"row): anex {r['anex']:7.1f} rows/s  LLM.embed {r['direct']:7.1f} rows/s  "
            f"anex/direct = {r['ratio']:.2f} (rounds "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); submit -> cost_ready "
            f"{r['estimate']:.2f} s", flush=True)
        spans_print(r["spans"])


if __name__ == "__main__":
    main()
