"""What vLLM itself does with rows that share a prompt prefix, called directly (issue 43): the
same rows in three orders on one engine with a KV-cache budget smaller than the documents.

    python -m anex.devstack exec -- .venv/bin/python bench/prefix_order.py \
        [--documents 200] [--questions 5] [--document-tokens 1000] [--tokens 16]
        [--kv-cache-tokens 32768] [--rounds 2] [--orders random grouped leader-step leader-done]

Each row is one document's tokens then one question's (token ids: no template, so the
shared prefix is exactly the document), `--tokens` output tokens, greedy, ignore_eos. The
engine is the product's (inference.engines.runtime.llm_load, prefix caching on) with the
budget given as ANEX_KV_CACHE_TOKENS would give it. Orders, each after
llm.reset_prefix_cache():
  random       the rows shuffled (a file whose questions are interleaved), LLM.generate;
  grouped      each document's rows together, LLM.generate;
  leader-step  grouped, fed by add_request/step: a document's first row is added, its other
               rows only once it has been through a step (its prefill cached);
  leader-done  the same, the other rows only once the first has finished.
Printed per order: rows/s (the best round) and the cached share (vLLM's num_cached_tokens
over prompt tokens; the most there is to share is (Q-1)/Q of the document tokens, of which
vLLM hits whole KV blocks only: 128 tokens on the CPU build).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")


def rows_of(documents: int, questions: int, document_tokens: int,
            vocabulary: int) -> list[tuple[int, list[int]]]:
    """(document, prompt ids) for every row, grouped by document."""
    rng = random.Random(43)  # noqa: S311 (made-up rows, not secrets)
    asked = [[rng.randrange(100, vocabulary) for _ in range(12 + q)] for q in range(questions)]
    out = []
    for d in range(documents):
        # Each document its own first token: no two documents share a block.
        document = [100 + d % (vocabulary - 100)] + [rng.randrange(100, vocabulary)
                                                     for _ in range(document_tokens - 1)]
        out += [(d, document + asked[q]) for q in range(questions)]
    return out


def generate(llm: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def leader_first(llm: Any, rows: list[tuple[int, list[int]]], params: Any,
                 after: str) -> list[Any]:
    """Rows in order through add_request/step; a document's later rows are held (and every
    row behind them, so the order stands) until its first row has been through a step
    ("step": it has an output, its prefill done) or has finished ("done")."""
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    leader_params = params.clone()
    leader_params.output_kind = RequestOutputKind.DELTA
    follower_params = params.clone()
    follower_params.output_kind = RequestOutputKind.FINAL_ONLY
    ready: set[int] = set()  # documents whose first row passed the gate
    led: set[int] = set()
    outputs: dict[str, Any] = {}
    said: dict[str, list[int]] = {}  # a leader's tokens so far (its outputs are deltas)
    next_row = 0
    while next_row < len(rows) or engine.has_unfinished_requests():
        while next_row < len(rows):
            document, prompt = rows[next_row]
            if document not in led:
                led.add(document)
                engine.add_request(f"L{document}:{next_row}", {"prompt_token_ids": prompt},
                                   leader_params)
            elif document in ready:
                engine.add_request(f"F{document}:{next_row}", {"prompt_token_ids": prompt},
                                   follower_params)
            else:
                break
            next_row += 1
        for output in engine.step():
            kind = output.request_id.partition(":")[0]
            if kind.startswith("L"):
                if after == "step" or output.finished:
                    ready.add(int(kind[1:]))
                said.setdefault(output.request_id, []).extend(output.outputs[0].token_ids)
                if output.finished:
                    output.outputs[0].token_ids = said[output.request_id]
            if output.finished:
                outputs[output.request_id] = output
    return list(outputs.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--document-tokens", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--kv-cache-tokens", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--orders", nargs="*",
                        default=["random", "grouped", "leader-step", "leader-done"])
    args = parser.parse_args()
    import django

    django.setup()
    from django.conf import settings

    settings.ANEX_KV_CACHE_TOKENS = args.kv_cache_tokens
    from vllm import SamplingParams

    from inference.checkpoints import checkpoints_build
    from inference.engines.runtime import kv_cache_tokens, llm_load

    checkpoint = Path(checkpoints_build()["tiny-qwen3"])
    llm = llm_load(checkpoint, runner="generate", max_model_len=2048).llm
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    held = kv_cache_tokens(llm)
    vocabulary = llm.get_tokenizer().vocab_size
    grouped = rows_of(args.documents, args.questions, args.document_tokens, vocabulary)
    shuffled = grouped[:]
    random.Random(7).shuffle(shuffled)  # noqa: S311
    prompt_tokens = sum(len(p) for _, p in grouped)
    block = llm.llm_engine.vllm_config.cache_config.block_size
    whole = args.document_tokens // block * block
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} CPU cores, load "
          f"{os.getloadavg()[0]:.1f}; {args.documents} documents x {args.questions} questions "
          f"= {len(grouped)} rows of {len(grouped[0][1])}-{len(grouped[-1][1])} tokens, "
          f"{args.tokens} output tokens (ignore_eos); KV cache {held} tokens "
          f"(~{(held or 0) // (args.document_tokens + 32)} rows at once); "
          f"max_num_seqs {scheduler.max_num_seqs}, max_num_batched_tokens "
          f"{scheduler.max_num_batched_tokens}; the most sharable "
          f"{(args.questions - 1) * args.documents * args.document_tokens / prompt_tokens:.1%}"
          f" of prompt tokens, {(args.questions - 1) * args.documents * whole / prompt_tokens:.1%}"
          f" in whole {block}-token blocks (what vLLM's cache can hit)", flush=True)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    generate(llm, [p for _, p in shuffled[:64]], params)  # warm-up
    runs: dict[str, list[float]] = {order: [] for order in args.orders}
    shares: dict[str, float] = {}
    outputs_of: dict[str, list[list[int]]] = {}
    for number in range(args.rounds):
        for order in (args.orders if number % 2 == 0 else args.orders[::-1]):
            llm.reset_prefix_cache()
            started = time.monotonic()
            if order == "random":
                outputs = generate(llm, [p for _, p in shuffled], params)
            elif order == "grouped":
                outputs = generate(llm, [p for _, p in grouped], params)
            else:
                outputs = leader_first(llm, grouped, params, after=order.split("-")[1])
            seconds = time.monotonic() - started
            runs[order].append(seconds)
            cached = sum(o.num_cached_tokens or 0 for o in outputs)
            shares[order] = cached / prompt_tokens
            assert len(outputs) == len(grouped)
            outputs_of[order] = by_row(order, outputs, grouped, shuffled)
            print(f"  round {number} {order:12} {len(grouped) / seconds:7.1f} rows/s "
                  f"({seconds:.1f} s), cached {shares[order]:.1%}", flush=True)
    base = statistics.median(runs[args.orders[0]])
    for order in args.orders:
        best = min(runs[order])
        print(f"{order:12} {len(grouped) / best:7.1f} rows/s (best of {args.rounds}; "
              f"rounds {', '.join(f'{len(grouped) / s:.1f}' for s in runs[order])}), cached "
              f"{shares[order]:.1%}, {base / statistics.median(runs[order]):.2f}x "
              f"{args.orders[0]} (medians)", flush=True)
    first = outputs_of[args.orders[0]]
    differing = {order: sum(a != b for a, b in zip(first, outputs, strict=True))
                 for order, outputs in outputs_of.items()}
    print(f"greedy outputs differing from {args.orders[0]}'s, row by row: "
          f"{', '.join(f'{order} {count}' for order, count in differing.items())} of "
          f"{len(grouped)} (random token ids: near-ties that a different batch breaks "
          f"otherwise); load at the end {os.getloadavg()[0]:.1f}", flush=True)


def by_row(order: str, outputs: list[Any], grouped: list[tuple[int, list[int]]],
           shuffled: list[tuple[int, list[int]]]) -> list[list[int]]:
    """Each row's output ids, in grouped order."""
    if order == "grouped":
        return [list(o.outputs[0].token_ids) for o in outputs]
    if order == "random":
        place = {id(row): i for i, row in enumerate(grouped)}
        out: list[list[int]] = [[] for _ in grouped]
        for row, o in zip(shuffled, outputs, strict=True):
            out[place[id(row)]] = list(o.outputs[0].token_ids)
        return out
    out = [[] for _ in grouped]
    for o in outputs:
        out[int(o.request_id.partition(":")[2])] = list(o.outputs[0].token_ids)
    return out


if __name__ == "__main__":
    main()
