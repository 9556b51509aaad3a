"""Session fixtures for the engine tests: the local checkpoints built once into a temporary
directory with the management command's own function, and each real vLLM engine loaded
once per test session (an engine takes seconds to start; a chunk, milliseconds).

A test module takes them in as a plugin, so that every module shares one instance of each:

    pytest_plugins = ["tests.engine_fixtures"]

(A fixture imported by name instead is a separate definition in each module that imports
it. That still works and stays cheap: the build goes to one fixed directory of the session
and is idempotent, and vLLM engines are cached per checkpoint by the process, as a worker's
are.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.catalog import CatalogModel, model_get
from inference.checkpoints import checkpoints_build
from inference.engines import ChatEngine, DecisionEngine, EmbeddingEngine


def catalog_model(model_id: str) -> CatalogModel:
    model = model_get(model_id)
    assert model is not None, model_id
    return model


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return checkpoints_build(dest=tmp_path_factory.getbasetemp() / "checkpoints")


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
