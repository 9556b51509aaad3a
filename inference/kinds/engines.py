"""The process's engines, one per served model id, each built by its model's task kind.

Which checkpoint serves which id is deployment configuration (ANEX_CHECKPOINTS); what kind
of engine, and its limits, come from the catalog (docs/dev/style.md rule 9): the model's task kind
builds it (TaskKind.engine_build). Engines are built once per process and kept
(inference/engines/runtime.py shares one vLLM engine between ids on one checkpoint).

Callers ask a kind (`kind.engine(model_id)`, typed) or the registry
(`inference.kinds.engine_for(model_id)`); both come here with the kind that builds it, so
this module needs no kind of its own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from django.conf import settings

from inference.catalog import CatalogModel, model_get
from inference.engines.registry import Engine, EngineNotConfigured
from inference.warmth import engine_used


class EngineBuilder(Protocol):
    """What builds a model's engine: its task kind (inference.kinds.base.TaskKind)."""

    @property
    def task(self) -> str: ...
    @property
    def runner_noun(self) -> str: ...

    def engine_build(self, model: CatalogModel, checkpoint: Path) -> Engine: ...


class EngineBuildFailed(RuntimeError):
    """The model's engine could not be built in this process: the worker's fault, not a
    row's (jobs.failures reads it as an engine failure)."""


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def engine_cached(model_id: str, kind: EngineBuilder) -> Engine:
    """The engine serving model_id, built by `kind` the first time; EngineNotConfigured
    when the id is not in the catalog, is of another kind, or has no checkpoint here."""
    model = model_get(model_id)
    if model is None:
        raise EngineNotConfigured(f"model '{model_id}' is not in the catalog")
    if model.task != kind.task:
        raise EngineNotConfigured(f"model '{model_id}' is not served by {kind.runner_noun}")
    with _lock:
        engine = _engines.get(model_id)
        if engine is None:
            checkpoint = _checkpoint(model_id)
            try:
                engine = kind.engine_build(model, checkpoint)
            except Exception as error:  # out of GPU memory, a bad checkpoint, a driver
                raise EngineBuildFailed(f"the engine for '{model_id}' could not be "
                                        f"built: {type(error).__name__}") from error
            _engines[model_id] = engine
    # What estimates read for their start-up part (inference/warmth.py).
    engine_used(model_id=model_id, load_seconds=engine.load_seconds)
    return engine


def _checkpoint(model_id: str) -> Path:
    checkpoint = settings.ANEX_CHECKPOINTS.get(model_id)
    if checkpoint is None:
        served = ", ".join(sorted(settings.ANEX_CHECKPOINTS)) or "none"
        raise EngineNotConfigured(
            f"model '{model_id}' has no checkpoint in this deployment: ANEX_CHECKPOINTS "
            f"must map it to a directory (\"{model_id}=/path/to/checkpoint\"); it serves "
            f"{served}. `manage.py build_checkpoints` builds the local ones.")
    if not checkpoint.is_dir():
        raise EngineNotConfigured(f"model '{model_id}': checkpoint {checkpoint} is not a "
                                  "directory")
    return Path(checkpoint)
