"""A SIMULATED chat engine for the scale harness (benchmark code, never part of the product).

No model runs here. The simulation stands in for a GPU's continuous batching behind the
product's own engine feed (inference/engines/feed.py), so everything above the engine step
(the chunk's rows read from storage, the feed, the results written, the database and the
broker) is the product's real code:

- SimulatedLLM is what the feed drives (`llm.llm_engine.add_request / step /
  abort_request`). One simulated step sleeps STEP seconds (time.sleep releases the GIL, as
  a GPU kernel does) and advances every running request by one token; at most BATCH
  requests run at once, the rest wait for a free slot. A request finishes after its
  simulated output length (DECODE steps, capped by the job's max_tokens). One simulated
  worker's ideal rate is BATCH / (DECODE x STEP) rows a second.
- SimulatedChatEngine is what the chat kind calls (`generate(rows, settings)`): each row is
  answered deterministically from its messages (`simulated_answer`), so the harness can
  check every line of a result.

Faults the scenarios inject:
- a row whose text contains POISON makes every simulated step it is in raise (S8);
- a file named ENGINE_DEAD in the worker's run directory makes every simulated step raise
  from then on: a worker whose engine died (S8).

Settings come from the environment (ANEX_SIM_STEP_MS, ANEX_SIM_BATCH, ANEX_SIM_DECODE);
each generate call appends one line to simulation-stats.jsonl in the worker's run
directory (ANEX_RUN_DIR), from which the harness reads each worker's share.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engines import ChatOutcome, ChatRow, ChatSettings
from inference.engines.feed import EngineFeed, RequestFailed
from inference.engines.types import RowError

POISON = "SIMULATED-POISON-ROW"
ENGINE_DEAD = "simulated-engine-dead"
STATS = "simulation-stats.jsonl"


def simulated_settings() -> tuple[float, int, int]:
    """(step seconds, batch, decode steps) of the simulated GPU, from the environment."""
    return (int(os.environ.get("ANEX_SIM_STEP_MS", "50")) / 1000,
            int(os.environ.get("ANEX_SIM_BATCH", "100")),
            int(os.environ.get("ANEX_SIM_DECODE", "8")))


def row_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return "\n".join(parts)


def simulated_answer(messages: Any) -> str:
    """The simulated engine's answer to a row: a digest of its messages (the harness checks
    every result line against it)."""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]
    return f"simulated answer {digest}"


def simulated_prompt_tokens(messages: Any) -> int:
    """A deterministic stand-in for the prompt's token count: words plus 4 per turn."""
    turns = len(messages) if isinstance(messages, list) else 1
    return len(row_text(messages).split()) + 4 * turns


class SimulatedStepFailed(RuntimeError):
    """A simulated engine step that raised (a poison row, or an engine that died)."""


@dataclass
class _Params:
    """What the feed hands the simulated engine per request (it sets output_kind)."""

    max_tokens: int
    output_kind: Any = None


@dataclass
class _Output:
    request_id: str
    finished: bool
    tokens: int


@dataclass
class _Running:
    request_id: str
    left: int
    produced: int = 0
    poison: bool = False


@dataclass
class SimulatedEngineCore:
    """The part of vllm.LLM's llm_engine the feed calls, simulated."""

    step_seconds: float
    batch: int
    decode: int
    run_dir: Path
    waiting: deque[_Running] = field(default_factory=deque)
    running: dict[str, _Running] = field(default_factory=dict)
    steps: int = 0
    # Where the simulated GPU's time went (the harness's per-worker loss figures): slots
    # filled over the steps, seconds inside step() beyond the sleep asked, and seconds
    # between steps while requests were in the engine (the feed's own turn) or while it
    # was empty (no work handed in).
    slot_steps: int = 0
    oversleep: float = 0.0
    between_busy: float = 0.0
    between_idle: float = 0.0
    _left_at: float = 0.0
    _left_busy: bool = False

    def add_request(self, request_id: str, prompt: dict[str, Any], params: _Params) -> None:
        self.waiting.append(_Running(request_id=request_id,
                                     left=max(1, min(self.decode, params.max_tokens)),
                                     poison=bool(prompt.get("poison"))))

    def abort_request(self, ids: list[str], internal: bool = False) -> None:
        gone = set(ids)
        for request_id in gone:
            self.running.pop(request_id, None)
        self.waiting = deque(item for item in self.waiting if item.request_id not in gone)

    def step(self) -> list[_Output]:
        entered = time.monotonic()
        if self._left_at:
            if self._left_busy:
                self.between_busy += entered - self._left_at
            else:
                self.between_idle += entered - self._left_at
        while self.waiting and len(self.running) < self.batch:
            item = self.waiting.popleft()
            self.running[item.request_id] = item
        self.slot_steps += len(self.running)
        slept = time.monotonic()
        time.sleep(self.step_seconds)  # the simulated GPU step: the GIL is released
        self.oversleep += time.monotonic() - slept - self.step_seconds
        self.steps += 1
        try:
            return self._advance()
        finally:
            self._left_at = time.monotonic()
            self._left_busy = bool(self.running or self.waiting)

    def _advance(self) -> list[_Output]:
        if (self.run_dir / ENGINE_DEAD).exists():
            raise SimulatedStepFailed("simulated engine died (the harness's fault injection)")
        if any(item.poison for item in self.running.values()):
            raise SimulatedStepFailed("simulated engine step raised on a poison row")
        outputs = []
        for item in list(self.running.values()):
            item.left -= 1
            item.produced += 1
            if item.left <= 0:
                del self.running[item.request_id]
                outputs.append(_Output(item.request_id, True, item.produced))
        return outputs


class SimulatedLLM:
    """Stands in for vllm.LLM as the product's EngineFeed uses it."""

    def __init__(self, core: SimulatedEngineCore) -> None:
        self.llm_engine = core


class SimulatedChatEngine:
    """A SIMULATION of inference.engines.ChatEngine: the same generate() contract, rows
    answered deterministically through the product's EngineFeed and a simulated step."""

    load_seconds = 0.0

    def __init__(self, *, model_id: str, reasoning: bool) -> None:
        step, batch, decode = simulated_settings()
        self.model_id = model_id
        self.reasoning = reasoning
        self.decode = decode
        self.run_dir = Path(os.environ.get("ANEX_RUN_DIR", "."))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.core = SimulatedEngineCore(step_seconds=step, batch=batch, decode=decode,
                                        run_dir=self.run_dir)
        self.feed = EngineFeed(SimulatedLLM(self.core), threading.Lock())
        self._stats_lock = threading.Lock()

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        texts = [row_text(row.messages) for row in rows]
        prompts = [{"poison": POISON in text} for text in texts]
        params = [_Params(max_tokens=settings.max_tokens) for _ in rows]
        started = time.monotonic()
        results = self.feed.run(prompts, params)
        outcomes = []
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, RequestFailed):  # the step failed on this row alone
                outcomes.append(ChatOutcome.failed(RowError.engine_failed()))
            elif isinstance(result, Exception):
                raise result  # not the row's fault: the chunk fails, as ChatEngine does
            else:
                outcomes.append(self._outcome(row, result, settings))
        self._record(len(rows), time.monotonic() - started)
        return outcomes

    def _outcome(self, row: ChatRow, output: _Output, settings: ChatSettings) -> ChatOutcome:
        thinking = self.reasoning and \
            (row.chat_template_kwargs or {}).get("enable_thinking") is not False
        tokens = output.tokens
        reasoning_tokens = tokens // 2 if thinking else 0
        return ChatOutcome(
            content=simulated_answer(row.messages),
            reasoning="simulated reasoning" if thinking else None,
            finish_reason="length" if self.decode > settings.max_tokens else "stop",
            prompt_tokens=simulated_prompt_tokens(row.messages), completion_tokens=tokens,
            reasoning_tokens=reasoning_tokens)

    def _record(self, rows: int, seconds: float) -> None:
        core = self.core
        line = json.dumps({"pid": os.getpid(), "rows": rows, "seconds": round(seconds, 3),
                           "at": round(time.time(), 3), "steps": core.steps,
                           "slot_steps": core.slot_steps,
                           "oversleep": round(core.oversleep, 3),
                           "between_busy": round(core.between_busy, 3),
                           "between_idle": round(core.between_idle, 3)})
        with self._stats_lock, (self.run_dir / STATS).open("a") as handle:
            handle.write(line + "\n")
