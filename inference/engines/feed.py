"""One thread keeps a generate engine fed: requests from every caller flow into one running
batch (docs/dev/decisions/2026-12-01-feeding-the-engine.md).

vLLM's LLM.generate adds a call's requests and steps the engine until they are all done,
so a chunk per call drains the batch at the end of every chunk and leaves the engine idle
while the next chunk is read and rendered and the last one's results written. Here the
worker's chunk threads (the Dramatiq worker runs several) hand their rendered prompts to
the feed and wait; the feed's thread adds them between two engine steps, so the next
chunk's rows join the batch while the current one is still generating, and each caller gets
its own outputs back, in order, as soon as its last row finishes.

Only the feed's thread touches the engine while it has work: it holds the engine's lock
(runtime.Loaded.lock) from its first request until the engine is empty, so another user of
the same vLLM engine (the decision engine on a shared checkpoint) waits, as before, for a
quiet engine. A request the engine refuses as it is added fails alone (its slot carries the
exception).

A failed step (docs/dev/decisions/2026-12-02-failure-classes-and-the-breaker.md, "A failed engine
step"): every request it held is taken out and run again apart, in halves, the feed's other callers
waiting meanwhile; a half that finishes delivers its outputs, one that fails again is halved, and a
request that fails alone is the one at fault: its slot carries RequestFailed, its row's error. So
the other requests in that batch (other chunks, other tenants') are answered as if nothing happened,
and no chunk is failed, deferred or charged an attempt for another's row. When every request
fails alone, a request of nobody's (one token in, one out) tells the rows from the engine:
answered, the requests are at fault, each its row's error (a chunk of poisoned rows alone in
the engine fails its rows, not the engine); failed too, the engine is (EngineFailing). An
engine that is dead (vLLM's EngineDeadError), or failing, fails every caller, whose chunks
go back for another worker (jobs.failures: the engine's failure, no attempt spent, unless it
recurs on the same chunk).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from anex.logsafe import exception_summary
from inference.engines.forward import FORWARD

logger = logging.getLogger(__name__)

# vLLM's name for an engine that stopped for good: nothing run on it again can succeed.
_DEAD = "EngineDeadError"


class EngineFailing(RuntimeError):
    """Every request of a failed step failed again alone: the engine's fault, not a row's
    (jobs.failures classes it with vLLM's own engine errors)."""


class RequestFailed(Exception):
    """A request the engine's step failed on, in the batch and again alone: its row's
    error, not its caller's (the other requests of the step, or the feed's own, were run
    again and answered)."""


# The steps the engine may take to answer the feed's own request (one token) before it is
# taken for failing.
_PROBE_STEPS = 16



@dataclass
class _Batch:
    """One caller's requests: an output (or the exception that refused it) per prompt."""

    prompts: Sequence[Any]
    params: Sequence[Any]
    results: list[Any] = field(default_factory=list)
    left: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    request_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Held:
    """One request taken back from the engine after a failed step, to run again."""

    batch: _Batch
    position: int


class EngineFeed:
    """The feed of one vLLM engine (vllm.LLM). `run` is safe from any number of threads."""

    def __init__(self, llm: Any, lock: threading.Lock) -> None:
        self.llm = llm
        self.lock = lock
        self._inbox: queue.SimpleQueue[_Batch | tuple[str, list[str]]] = queue.SimpleQueue()
        self._waiting: dict[str, tuple[_Batch, int]] = {}
        self._ids = itertools.count()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None
        # What ran together (the benchmark's profile and the tests read them): the most
        # callers whose requests were in the engine at once, and the seconds it had work.
        self.peak_callers = 0
        self.busy_seconds = 0.0
        self.busy_periods: deque[tuple[float, float]] = deque(maxlen=1024)  # (start, end)

    def run(self, prompts: Sequence[Any], params: Sequence[Any]) -> list[Any]:
        """Every prompt through the engine alongside whatever else is running; one item per
        prompt, in order: its RequestOutput, or the exception the engine refused it with."""
        if not prompts:
            return []
        batch = _Batch(prompts=prompts, params=params, results=[None] * len(prompts),
                       left=len(prompts))
        self._ensure_thread()
        self._inbox.put(batch)
        try:
            batch.done.wait()
        except BaseException:
            # The caller is interrupted (a time limit, a shutdown): its rows stop using the
            # engine rather than finishing for nobody.
            self._inbox.put(("abort", list(batch.request_ids)))
            raise
        if batch.failure is not None:
            raise batch.failure
        return batch.results

    # -- the feed's thread -----------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._start:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="engine-feed",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        engine = self.llm.llm_engine
        while True:
            item = self._inbox.get()  # idle: nothing in the engine, wait for work
            with self.lock:
                started = time.monotonic()
                self._take(item)
                while self._waiting:
                    while True:  # every batch handed in meanwhile joins the running one
                        try:
                            self._take(self._inbox.get_nowait())
                        except queue.Empty:
                            break
                    if not self._waiting:
                        break
                    try:
                        with FORWARD:  # one forward pass at a time in the process
                            outputs = engine.step()
                    except Exception as error:
                        self._step_failed(error)
                        continue
                    for output in outputs:
                        if output.finished:
                            self._deliver(output)
                ended = time.monotonic()
                self.busy_seconds += ended - started
                self.busy_periods.append((started, ended))

    def _take(self, item: _Batch | tuple[str, list[str]]) -> None:
        """One inbox item into the engine. Whatever goes wrong here is told to the caller
        it concerns: the feed's thread never dies with a caller left waiting."""
        if isinstance(item, tuple):  # ("abort", request ids)
            ids = [request_id for request_id in item[1] if request_id in self._waiting]
            for request_id in ids:
                del self._waiting[request_id]
            if ids:
                try:
                    self.llm.llm_engine.abort_request(ids, internal=False)
                except Exception as error:  # its caller is gone already; the next step tells
                    logger.error("aborting %d requests failed: %s", len(ids),
                                 exception_summary(error))
            return
        try:
            self._add(item)
        except Exception as error:
            logger.error("adding a batch of %d requests failed: %s", len(item.prompts),
                         exception_summary(error))
            for request_id in item.request_ids:
                self._waiting.pop(request_id, None)
            item.failure = error
            item.done.set()

    def _add(self, batch: _Batch) -> None:
        engine = self.llm.llm_engine
        for position, (prompt, params) in enumerate(zip(batch.prompts, batch.params,
                                                        strict=True)):
            request_id = f"feed-{next(self._ids)}"
            _final_only(params)
            try:
                engine.add_request(request_id, prompt, params)
            except Exception as error:  # refused as it is added: this row alone
                batch.results[position] = error
                batch.left -= 1
                continue
            self._waiting[request_id] = (batch, position)
            batch.request_ids.append(request_id)
        if batch.left == 0:
            batch.done.set()
        callers = len({id(waiting) for waiting, _ in self._waiting.values()})
        self.peak_callers = max(self.peak_callers, callers)

    def _deliver(self, output: Any) -> None:
        entry = self._waiting.pop(output.request_id, None)
        if entry is None:  # aborted by its caller meanwhile
            return
        batch, position = entry
        batch.results[position] = output
        batch.left -= 1
        if batch.left == 0:
            batch.done.set()

    # -- a failed step ---------------------------------------------------------------------

    def _step_failed(self, error: Exception) -> None:
        """The step failed: the requests it held run again apart, in halves, until the one
        at fault is alone (RequestFailed in its slot); a dead engine fails every caller."""
        if _dead(error):
            logger.error("the engine is dead; failing %d requests", len(self._waiting))
            self._fail_all(error)
            return
        held = self._take_back()
        # Without the message: it may quote a row (anex.logsafe).
        logger.warning("engine step failed with %d requests in it; running them again "
                       "apart to find the one at fault: %s", len(held),
                       exception_summary(error))
        groups = _halves(held) if len(held) > 1 else [held]
        alone: list[tuple[_Held, Exception]] = []
        answered = 0
        while groups:
            group = groups.pop(0)
            failure, left = self._run_apart(group)
            answered += len(group) - len(left)
            if failure is None:
                continue
            if _dead(failure):
                logger.error("the engine died while running a failed step's requests again")
                self._fail_held(left + [item for item, _ in alone]
                                + [item for rest in groups for item in rest], failure)
                return
            if len(left) == 1:
                alone.append((left[0], failure))
            elif left:
                groups[:0] = _halves(left)
        if len(alone) > 1 and answered == 0:
            # Every request fails alone: the engine, or every row? A request of nobody's
            # tells (a job of poisoned rows alone in the engine must not pass for a broken
            # engine: that opened every worker's breaker on the model, for every tenant).
            probe = self._probe()
            if probe is not None:
                logger.error("every request fails alone, and so does the feed's own: the "
                             "engine is failing, not a row (%s)", type(probe).__name__)
                failure = probe if _dead(probe) else EngineFailing(type(probe).__name__)
                self._fail_held([item for item, _ in alone], failure)
                return
        for item, failure in alone:
            logger.error("a request failed the engine's step alone: its row fails (%s)",
                         type(failure).__name__)
            self._settle(item, RequestFailed(f"{type(failure).__name__}: {failure}"))

    def _probe(self) -> Exception | None:
        """The engine's answer to a request of nobody's, alone in it: None when it answers,
        else what it failed with."""
        request_id = f"feed-probe-{next(self._ids)}"
        engine = self.llm.llm_engine
        try:
            prompt, params = _probe_request()
            engine.add_request(request_id, prompt, params)
            for _ in range(_PROBE_STEPS):
                with FORWARD:
                    outputs = engine.step()
                if any(output.request_id == request_id and output.finished
                       for output in outputs):
                    return None
            raise EngineFailing(f"the engine did not answer one token in {_PROBE_STEPS} "
                                "steps")
        except Exception as error:
            self._abort([request_id])
            return error

    def _take_back(self) -> list[_Held]:
        """Every request in the engine, out of it (aborted), as it was handed in."""
        held = [_Held(batch, position) for batch, position in self._waiting.values()]
        ids = list(self._waiting)
        self._waiting.clear()
        for item in held:
            item.batch.request_ids[:] = [i for i in item.batch.request_ids if i not in ids]
        self._abort(ids)
        return held

    def _run_apart(self, group: list[_Held]) -> tuple[Exception | None, list[_Held]]:
        """The group's requests alone in the engine until they finish: (None, []) when
        they all did, else the step's failure and those that had not finished (taken
        back out of the engine)."""
        for item in group:
            self._add_one(item.batch, item.position)
        try:
            while self._waiting:
                with FORWARD:
                    outputs = self.llm.llm_engine.step()
                for output in outputs:
                    if output.finished:
                        self._deliver(output)
        except Exception as error:
            return error, self._take_back()
        return None, []

    def _add_one(self, batch: _Batch, position: int) -> None:
        request_id = f"feed-{next(self._ids)}"
        try:
            self.llm.llm_engine.add_request(request_id, batch.prompts[position],
                                            batch.params[position])
        except Exception as error:  # refused as it is added: this row alone
            self._settle(_Held(batch, position), error)
            return
        self._waiting[request_id] = (batch, position)
        batch.request_ids.append(request_id)

    def _settle(self, item: _Held, result: Any) -> None:
        item.batch.results[item.position] = result
        item.batch.left -= 1
        if item.batch.left == 0:
            item.batch.done.set()

    def _fail_held(self, held: list[_Held], error: Exception) -> None:
        """Every caller with a request among `held` fails with `error` (its chunk's)."""
        batches = {id(item.batch): item.batch for item in held}
        for batch in batches.values():
            batch.failure = error
            batch.done.set()

    def _abort(self, ids: list[str]) -> None:
        if not ids:
            return
        try:
            self.llm.llm_engine.abort_request(ids, internal=False)
        except Exception as error:  # the engine is already broken; its callers are told
            logger.error("aborting %d requests failed: %s", len(ids), exception_summary(error))

    def _fail_all(self, error: Exception) -> None:
        batches = {id(batch): batch for batch, _ in self._waiting.values()}
        ids = list(self._waiting)
        self._waiting.clear()
        try:
            self.llm.llm_engine.abort_request(ids, internal=False)
        except Exception as aborting:  # the engine is already broken; its callers are told
            logger.error("aborting after a failed step: %s", exception_summary(aborting))
        for batch in batches.values():
            batch.failure = error
            batch.done.set()


def _final_only(params: Any) -> None:
    """vLLM hands back a request's output once, when it has finished."""
    from vllm.sampling_params import RequestOutputKind

    params.output_kind = RequestOutputKind.FINAL_ONLY


def _probe_request() -> tuple[Any, Any]:
    """The feed's own request: one token in (id 0, in every vocabulary), one out."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, detokenize=False)
    _final_only(params)
    return {"prompt_token_ids": [0]}, params


def _dead(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ == _DEAD:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _halves(items: list[_Held]) -> list[list[_Held]]:
    middle = (len(items) + 1) // 2
    return [part for part in (items[:middle], items[middle:]) if part]
