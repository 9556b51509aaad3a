"""Two engines of different checkpoints in one process (inference/engines/forward.py):
a GPU worker serving a chat model and an embedding model runs a chat batch and an
embedding chunk at once, and both answer as they do alone.

Before one forward pass at a time per process, the first embedding run beside a chat
step failed ("Forward context is not set": vLLM's forward context is a process global).
"""

from __future__ import annotations

import threading

import pytest

from inference.engines import ChatEngine, ChatOutcome, ChatRow, ChatSettings, EmbeddingEngine
from inference.engines.types import EmbedRow

pytest_plugins = ["tests.engine_fixtures"]

pytestmark = pytest.mark.engine

OFF = {"enable_thinking": False}


def vectors_of(engine: EmbeddingEngine, rows: list[EmbedRow]) -> list[list[float]]:
    vectors = [outcome.vector for outcome in engine.embed(rows)]
    assert all(vector is not None for vector in vectors), vectors
    return [vector for vector in vectors if vector is not None]


def test_a_chat_batch_and_embedding_runs_at_once_answer_as_alone(
        chat_engine: ChatEngine, embedding_engine: EmbeddingEngine) -> None:
    # given a chat batch and an embedding chunk, each answered alone
    settings = ChatSettings(max_tokens=48)
    chat_rows = [ChatRow(messages=[{"role": "user", "content": f"Tell me about ships {i}."}],
                         chat_template_kwargs=OFF) for i in range(96)]
    embed_rows = [EmbedRow(text=f"a search query about ships {i}") for i in range(64)]
    chat_alone = chat_engine.generate(chat_rows, settings)
    embed_alone = vectors_of(embedding_engine, embed_rows)

    # when the embedding chunk runs again and again while the chat batch generates
    chatted: list[list[ChatOutcome]] = []
    failures: list[BaseException] = []
    generating = threading.Event()
    chat_done = threading.Event()

    def chat() -> None:
        generating.set()
        try:
            chatted.append(chat_engine.generate(chat_rows, settings))
        except BaseException as error:  # reported below, not lost in the thread
            failures.append(error)
        finally:
            chat_done.set()

    thread = threading.Thread(target=chat)
    thread.start()
    generating.wait()
    embedded: list[list[list[float]]] = []
    beside = 0  # embedding runs that finished while the chat batch was still generating
    while not chat_done.is_set():
        embedded.append(vectors_of(embedding_engine, embed_rows))
        beside += not chat_done.is_set()
    thread.join(timeout=300)

    # then both answered, each as alone, and the embedding did not wait for the chat to end
    assert not failures, failures
    assert chatted == [chat_alone]
    assert beside >= 1, "no embedding run finished while the chat batch was generating"
    worst = max(abs(value - alone) for vectors in embedded
                for vector, vector_alone in zip(vectors, embed_alone, strict=True)
                for value, alone in zip(vector, vector_alone, strict=True))
    assert worst <= 1e-6
