"""How a worker's claimed work fails unexpectedly (readthedocs' `on_failure`): the service
raises ClaimedWorkFailed, and its actor (jobs/tasks.py) hands the work out again through
its lease (jobs.services.recovery.lease_retry) rather than leaving it claimed until the
lease runs out. A failure the service expects (a row that does not fit, an input that
changed) is the service's own outcome, never this."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

logger = logging.getLogger(__name__)


class ClaimedWorkFailed(Exception):
    """`what` ("estimate", "sample") of job `job_id` failed after it was claimed; the
    cause is the exception chained to it."""

    def __init__(self, what: str, *, job_id: uuid.UUID) -> None:
        super().__init__(f"{what} of job {job_id} failed")
        self.what = what
        self.job_id = job_id


@contextmanager
def claimed_work(what: str, *, job_id: uuid.UUID) -> Iterator[None]:
    """Anything the block raises becomes ClaimedWorkFailed for this work."""
    try:
        yield
    except ClaimedWorkFailed:
        raise
    except Exception as error:
        raise ClaimedWorkFailed(what, job_id=job_id) from error


# --- what a chunk's failure was: its class decides what it costs the chunk ---------------


class FailureClass(StrEnum):
    """Why a chunk's run failed (docs/dev/decisions/2026-12-02-failure-classes-and-the-breaker.md).

    infrastructure  storage, the database or the broker did not answer: the chunk waits,
                    backing off with jitter, and keeps its attempt
    engine          the worker's engine is dead or could not be built: not the chunk's
                    fault either; it goes back for another worker, and the breaker counts it
    unexpected      anything else (the chunk's own rows, a bug): one of its attempts spent
    """

    INFRASTRUCTURE = "infrastructure"
    ENGINE = "engine"
    UNEXPECTED = "unexpected"


# vLLM's own names for an engine that stopped (vllm.v1.engine.exceptions), and the feed's
# (inference/engines/feed.py EngineFailing), read by name so that this module does not
# import vLLM.
_ENGINE_ERRORS = frozenset({"EngineDeadError", "EngineGenerateError", "EngineNotConfigured",
                            "EngineBuildFailed", "EngineFailing"})


def failure_class(error: BaseException) -> FailureClass:
    """The class of a chunk's failure, from the exception and what caused it."""
    from botocore.exceptions import BotoCoreError, ClientError
    from django.db import DatabaseError
    from redis import RedisError

    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ in _ENGINE_ERRORS:
            return FailureClass.ENGINE
        if isinstance(seen, DatabaseError | RedisError | BotoCoreError | ConnectionError
                      | TimeoutError):
            return FailureClass.INFRASTRUCTURE
        if isinstance(seen, ClientError):
            status = seen.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = seen.response.get("Error", {}).get("Code", "")
            if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                return FailureClass.INFRASTRUCTURE
        seen = seen.__cause__ or seen.__context__
    return FailureClass.UNEXPECTED


def backoff_ms(failures: int, *, base_ms: int, cap_ms: int) -> int:
    """The wait before the `failures`-th retry: doubling from base_ms up to cap_ms, with
    full jitter on its upper half, so a fleet retrying one outage does not come back at
    once."""
    ceiling = min(cap_ms, base_ms * 2 ** max(failures - 1, 0))
    return ceiling // 2 + random.randint(0, ceiling // 2)  # noqa: S311 - not a secret


# Work an open breaker hands back (a chunk, a sample) is offered again after about this long.
BREAKER_RESEND_MS = 10_000


class Breaker:
    """One per model in a worker process: after `threshold` engine failures in a row it
    opens, and the worker takes none of that model's chunks for `cooldown` seconds (their
    messages go back to the queue, for another worker, with no attempt spent); then one
    chunk is let through, and a success closes it. Its state is logged when it changes."""

    def __init__(self, model: str, *, threshold: int = 3, cooldown: float = 60.0) -> None:
        self.model = model
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self.opened_at: float | None = None
        self.lock = threading.Lock()

    def allows(self) -> bool:
        """Whether a chunk may be taken now (a half-open breaker lets one through)."""
        with self.lock:
            if self.opened_at is None:
                return True
            if time.monotonic() - self.opened_at >= self.cooldown:
                self.opened_at = time.monotonic()  # the next try waits a cooldown again
                return True
            return False

    def failed(self) -> None:
        with self.lock:
            self.failures += 1
            if self.failures >= self.threshold:
                if self.opened_at is None:
                    logger.error("the %s engine failed %s times in a row: this worker takes "
                                 "none of its chunks for %.0f s", self.model, self.failures,
                                 self.cooldown)
                self.opened_at = time.monotonic()

    def succeeded(self) -> None:
        with self.lock:
            if self.opened_at is not None:
                logger.warning("the %s engine answers again: taking its chunks", self.model)
            self.failures = 0
            self.opened_at = None

    @property
    def open(self) -> bool:
        return self.opened_at is not None

    @property
    def answering(self) -> bool:
        """Whether the engine has failed no run since its last success (or its start): a
        run that then ends in the engine's failure may have brought it down itself."""
        return self.failures == 0


_BREAKERS: dict[str, Breaker] = {}
_BREAKERS_LOCK = threading.Lock()


def breaker_for(model: str) -> Breaker:
    with _BREAKERS_LOCK:
        if model not in _BREAKERS:
            _BREAKERS[model] = Breaker(model)
        return _BREAKERS[model]


def breakers_open() -> list[str]:
    """The models whose breaker is open in this process (for readiness and the logs)."""
    with _BREAKERS_LOCK:
        return sorted(model for model, breaker in _BREAKERS.items() if breaker.open)


def worker_engine_state() -> dict[str, object]:
    """This worker process's engines as readiness reads them: `ready` while no breaker is
    open, `open` the models whose work it hands back (its engine for them keeps failing),
    `failing` each model's engine failures in a row (0: its last run succeeded)."""
    with _BREAKERS_LOCK:
        breakers = list(_BREAKERS.values())
    failing = {breaker.model: breaker.failures for breaker in breakers}
    opened = sorted(breaker.model for breaker in breakers if breaker.open)
    return {"ready": not opened, "open": opened, "failing": failing}


def breakers_reset() -> None:
    """Every breaker closed (a test's process starts each test with none)."""
    with _BREAKERS_LOCK:
        _BREAKERS.clear()


# --- recent failures by class, for the admin's operations page -----------------------------
#
# One Redis hash an hour (class -> count), kept a little over a day: counted where a chunk's
# failure is classed (jobs.services.running), read by failures_by_class. A hint, like the
# engine measurements: Redis not answering loses a count, never the chunk's handling.

FAILURE_HOURS_KEPT = 25


def _failures_key(hour: int) -> str:
    return f"anex:failures:{hour}"


def failure_note(failure: FailureClass, *, now: float | None = None) -> None:
    """Count one chunk failure of this class in the current hour."""
    from redis import RedisError

    from anex.redis import redis_client

    key = _failures_key(int((time.time() if now is None else now) // 3600))
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.hincrby(key, failure.value, 1)
            pipe.expire(key, FAILURE_HOURS_KEPT * 3600)
            pipe.execute()
    except RedisError as exc:
        logger.warning("chunk failure not counted: %s", type(exc).__name__)


def failures_by_class(*, hours: int = 24, now: float | None = None) -> dict[str, int] | None:
    """Chunk failures in the last `hours` whole hours (this one included), by class, every
    class named; None when Redis does not answer."""
    from redis import RedisError

    from anex.redis import redis_client

    current = int((time.time() if now is None else now) // 3600)
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            for hour in range(current - hours + 1, current + 1):
                pipe.hgetall(_failures_key(hour))
            counted = pipe.execute()
    except RedisError:
        return None
    totals = {failure.value: 0 for failure in FailureClass}
    for bucket in counted:
        for name, count in bucket.items():
            name = name.decode() if isinstance(name, bytes) else str(name)
            if name in totals:
                totals[name] += int(count)
    return totals
