"""est_processing_seconds' start-up part comes from what the workers measured: nothing but a
dispatch when an engine is warm, the measured load when none is, the cold figure before
anything was measured, and never a failure when Redis is away."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pytest_django import Settings

from anex.redis import redis_client
from inference.warmth import (
    COLD_START_SECONDS,
    WARM_FOR_SECONDS,
    WARM_START_SECONDS,
    engine_used,
    startup_seconds,
)


@pytest.fixture
def model_id() -> Iterator[str]:
    """A model id of this test's own, so marks left by other tests never count."""
    model_id = f"test-model-{uuid.uuid4().hex[:8]}"
    client = redis_client()  # the real one, even where a test points settings elsewhere
    yield model_id
    client.delete(f"anex:engine:{model_id}:warm", f"anex:engine:{model_id}:load_seconds")


def test_before_any_measurement_the_cold_figure_of_the_task_counts(model_id: str) -> None:
    assert startup_seconds(model_id=model_id, task="chat") == COLD_START_SECONDS["chat"]
    assert startup_seconds(model_id=model_id, task="embed") == COLD_START_SECONDS["embed"]


def test_a_warm_engine_starts_at_once(model_id: str) -> None:
    engine_used(model_id=model_id, load_seconds=24.6)
    assert startup_seconds(model_id=model_id, task="chat") == WARM_START_SECONDS
    ttl = redis_client().ttl(f"anex:engine:{model_id}:warm")
    assert 0 < ttl <= WARM_FOR_SECONDS


def test_once_no_engine_is_warm_the_measured_load_counts(model_id: str) -> None:
    # given a worker that loaded the engine in 24.6 s and has since gone away
    engine_used(model_id=model_id, load_seconds=24.6)
    redis_client().delete(f"anex:engine:{model_id}:warm")
    # then a job waits for a load like the one measured, not the cold figure
    assert startup_seconds(model_id=model_id, task="chat") == WARM_START_SECONDS + 25


def test_without_redis_the_estimate_falls_back_and_nothing_fails(
        model_id: str, settings: Settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    engine_used(model_id=model_id, load_seconds=3.0)
    assert startup_seconds(model_id=model_id, task="decide") == COLD_START_SECONDS["decide"]
