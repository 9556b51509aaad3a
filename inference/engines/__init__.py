"""The inference engines: what a worker runs a chunk of rows through
(docs/dev/decisions/2026-12-01-inference.md).

    engine = kind.engine(job.model)          # inference.kinds: built once per process
    outcomes = engine.generate(rows, settings)   # ChatEngine: list[ChatRow] -> ChatOutcome
    outcomes = engine.embed(rows)                # EmbeddingEngine: EmbedRow -> EmbedOutcome
    outcomes = engine.decide(rows)               # DecisionEngine: DecisionRow -> outcome

One outcome per row, in row order; a row the model refuses carries its RowError and never
fails the chunk. The job pipeline and the realtime API reach an engine through its model's
task kind (inference.kinds: `kind.engine(model_id)`, typed to that kind's engine), which
also builds it (`kind.engine_build`, called by inference/kinds/engines.py). Only
plain dataclasses cross this boundary: no vLLM type. vLLM itself is imported when the
first engine is built, so importing this package stays cheap.
"""

from inference.engines.chat import ChatEngine
from inference.engines.decisions import DecisionEngine
from inference.engines.embeddings import EmbeddingEngine
from inference.engines.registry import Engine, EngineNotConfigured
from inference.engines.types import (
    ChatOutcome,
    ChatRow,
    ChatSettings,
    DecisionOutcome,
    DecisionRow,
    EmbedOutcome,
    EmbedRow,
    RowError,
)

__all__ = [
    "ChatEngine",
    "ChatOutcome",
    "ChatRow",
    "ChatSettings",
    "DecisionEngine",
    "DecisionOutcome",
    "DecisionRow",
    "EmbedOutcome",
    "EmbedRow",
    "EmbeddingEngine",
    "Engine",
    "EngineNotConfigured",
    "RowError",
]
