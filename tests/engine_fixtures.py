"""Session fixtures for the engine tests: the local checkpoints built with the management
command's own function, and each real vLLM engine loaded once per test session (an engine
takes seconds to start; a chunk, milliseconds).

The checkpoints go to the run directory's checkpoints/ (ANEX_RUN_DIR: .run/test under `make
test`; git-ignored), not to a temporary one: training tiny-qwen3 takes about a minute, so
it happens once per recipe, not once per session. The build is idempotent by its stamp,
moved into place whole and serialised by a lock, so concurrent sessions share it. A fresh
clone (CI) trains it once.

A test module takes them in as a plugin, so that every module shares one instance of each:

    pytest_plugins = ["tests.engine_fixtures"]

(A fixture imported by name instead is a separate definition in each module that imports
it. That still works and stays cheap: the build goes to one fixed directory and is
idempotent, and vLLM engines are cached per checkpoint by the process, as a worker's are.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.catalog import CatalogModel, model_get
from inference.checkpoints import checkpoints_build, checkpoints_dest_default
from inference.engines import ChatEngine, DecisionEngine, EmbeddingEngine
from inference.engines.media import MediaLimits
from inference.kinds.embed import EmbedKind


def catalog_model(model_id: str) -> CatalogModel:
    model = model_get(model_id)
    assert model is not None, model_id
    return model


@pytest.fixture(scope="session")
def checkpoint_dirs() -> dict[str, Path]:
    return checkpoints_build(dest=checkpoints_dest_default())


@pytest.fixture(scope="session")
def chat_engine(checkpoint_dirs: dict[str, Path]) -> ChatEngine:
    model = catalog_model("tiny-qwen3")
    return ChatEngine(model_id=model.id, checkpoint=checkpoint_dirs["tiny-qwen3"],
                      context_tokens=model.context_tokens, reasoning=model.reasoning)


@pytest.fixture(scope="session")
def embedding_engine(checkpoint_dirs: dict[str, Path]) -> EmbeddingEngine:
    model = catalog_model("all-minilm-l6-v2")
    return EmbeddingEngine(model_id=model.id, checkpoint=checkpoint_dirs["minilm"],
                           context_tokens=model.context_tokens,
                           dimensions_native=model.dimensions_native,
                           dimensions_min=model.dimensions_min)


@pytest.fixture(scope="session")
def decision_engine(checkpoint_dirs: dict[str, Path]) -> DecisionEngine:
    # The embedded default: laya's routes both read tiny-qwen3 (the chat engine's engine).
    model = catalog_model("laya")
    assert model.option_budget_tokens is not None
    return DecisionEngine(model_id=model.id, checkpoint=checkpoint_dirs["tiny-qwen3"],
                          context_tokens=model.context_tokens,
                          option_budget_tokens=model.option_budget_tokens,
                          max_questions=model.max_questions)


def media_chat_engine(model_id: str, checkpoint_dirs: dict[str, Path]) -> ChatEngine:
    """A local media model's chat engine, built as its task kind builds it."""
    model = catalog_model(model_id)
    return ChatEngine(model_id=model.id, checkpoint=checkpoint_dirs[model_id],
                      context_tokens=model.context_tokens, reasoning=model.reasoning,
                      media=MediaLimits.of(model),
                      media_context_tokens=model.media_context_tokens)


@pytest.fixture(scope="session")
def vl_engine(checkpoint_dirs: dict[str, Path]) -> ChatEngine:
    """tiny-vl: pictures, and a clip's frames as pictures (inference/checkpoints_media.py)."""
    return media_chat_engine("tiny-vl", checkpoint_dirs)


@pytest.fixture(scope="session")
def audio_engine(checkpoint_dirs: dict[str, Path]) -> ChatEngine:
    """tiny-audio: sound (inference/checkpoints_media.py)."""
    return media_chat_engine("tiny-audio", checkpoint_dirs)


@pytest.fixture(scope="session")
def vl_embedding_engine(checkpoint_dirs: dict[str, Path]) -> EmbeddingEngine:
    # Built as a worker builds it (the kind's engine_build: the catalog's media caps).
    model = catalog_model("tiny-vl-embedding")
    return EmbedKind().engine_build(model, checkpoint_dirs["tiny-vl-embedding"])
