"""engine_for(model_id): the process's engine for a served model id.

Which checkpoint serves which id is deployment configuration (ANEX_CHECKPOINTS); what kind
of engine, and its limits, come from the catalog (STYLE.md rule 9): the model's task kind
(inference.kinds) builds it. Engines are built once per process and kept (runtime.py shares
one vLLM engine between ids on one checkpoint).
"""

from __future__ import annotations

import threading

from django.conf import settings

from inference.catalog import model_get
from inference.engines.chat import ChatEngine
from inference.engines.decisions import DecisionEngine
from inference.engines.embeddings import EmbeddingEngine
from inference.kinds import kind_for
from inference.warmth import engine_used

Engine = ChatEngine | EmbeddingEngine | DecisionEngine


class EngineNotConfigured(LookupError):
    """The model id is not in the catalog, or this deployment serves it from no checkpoint."""


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def engine_for(model_id: str) -> Engine:
    with _lock:
        engine = _engines.get(model_id)
        if engine is None:
            engine = _engines[model_id] = _build(model_id)
    # What estimates read for their start-up part (inference/warmth.py).
    engine_used(model_id=model_id, load_seconds=engine.load_seconds)
    return engine


def _build(model_id: str) -> Engine:
    model = model_get(model_id)
    if model is None:
        raise EngineNotConfigured(f"model '{model_id}' is not in the catalog")
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
    return kind_for(model).engine_build(model, checkpoint)
