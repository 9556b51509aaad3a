"""What the workers have measured about their engines, for `est_processing_seconds`.

A job's processing time is a start-up plus its tokens at the engine's rate. The start-up is
what it takes a worker to have the model's engine loaded: nothing when a worker already has
it warm, the load time a worker measured when none has, and a conservative figure for a
cold fleet only while nothing has been measured yet.

Each worker records, per served model id, the seconds its engine took to load and that it
holds it warm; every use renews that mark for WARM_FOR, so an engine whose worker stopped
stops counting as warm soon after. All of it is a hint kept in Redis: when Redis does not
answer, an estimate falls back to the fixed figures and nothing fails.
"""

from __future__ import annotations

import logging

import redis

from anex.redis import redis_client

logger = logging.getLogger(__name__)

WARM_FOR_SECONDS = 15 * 60
# A warm engine takes the job's first chunk as soon as it is queued.
WARM_START_SECONDS = 1
# Before any worker has measured a load: a cold GPU worker loading production weights.
COLD_START_SECONDS = {"chat": 180, "embed": 60, "decide": 30}
# A measured load time is kept this long after the last use that reported it.
MEASURED_FOR_SECONDS = 30 * 24 * 3600


def _key(model_id: str, what: str) -> str:
    return f"anex:engine:{model_id}:{what}"


def engine_used(*, model_id: str, load_seconds: float) -> None:
    """A worker holds this model's engine warm (called on every use; cheap)."""
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.set(_key(model_id, "warm"), "1", ex=WARM_FOR_SECONDS)
            pipe.set(_key(model_id, "load_seconds"), f"{load_seconds:.3f}",
                     ex=MEASURED_FOR_SECONDS)
            pipe.execute()
    except redis.RedisError as exc:
        logger.warning("could not record the warm engine of %s: %s", model_id, exc)


def startup_seconds(*, model_id: str, task: str) -> int:
    """The start-up part of a job's processing time on this model, in whole seconds."""
    try:
        warm, measured = redis_client().mget(_key(model_id, "warm"),
                                             _key(model_id, "load_seconds"))
    except redis.RedisError as exc:
        logger.warning("no engine measurements for %s: %s", model_id, exc)
        warm = measured = None
    if warm is not None:
        return WARM_START_SECONDS
    if measured is not None:
        try:
            return WARM_START_SECONDS + round(float(measured))
        except ValueError:
            pass
    return COLD_START_SECONDS.get(task, max(COLD_START_SECONDS.values()))
