"""What an engine is, to the code that holds one: any of the three engines, and the error
for a model id this deployment does not serve. The process's cache of built engines is the
task kinds' (inference/kinds/engines.py): a kind builds its own model's engine."""

from __future__ import annotations

from inference.engines.chat import ChatEngine
from inference.engines.decisions import DecisionEngine
from inference.engines.embeddings import EmbeddingEngine

Engine = ChatEngine | EmbeddingEngine | DecisionEngine


class EngineNotConfigured(LookupError):
    """The model id is not in the catalog, or this deployment serves it from no checkpoint."""
