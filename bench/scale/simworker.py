"""Entry module of a SIMULATED GPU worker (scale harness only, never part of the product):

    dramatiq bench.scale.simworker --queues run.world.tiny-qwen3 sample.world.tiny-qwen3

The product's real worker (anex.worker: Django, every app's actors, the run queues), with
one change: the chat kind builds the simulated engine of bench/scale/simengine.py instead of
a vLLM engine, so a chunk goes through the product's chunk_run, its feed, its storage and
its database exactly as on a GPU box, while the engine step only sleeps.

The product's feed imports vllm.sampling_params.RequestOutputKind to tag each request; a
simulated worker never loads vLLM (four of them would import torch four times on two
cores), so a stand-in module with that one name is installed when vLLM is not loaded.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

from bench.scale.simengine import SimulatedChatEngine


def _vllm_stand_in() -> None:
    """The one vLLM name the product's feed reads, for the simulation only."""
    if "vllm" in sys.modules:
        return

    class RequestOutputKind(enum.Enum):  # what vllm.sampling_params names
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    package = types.ModuleType("vllm")
    package.__doc__ = "stand-in for the scale harness's simulated engine (bench/scale)"
    package.__path__ = []
    params = types.ModuleType("vllm.sampling_params")
    params.RequestOutputKind = RequestOutputKind  # type: ignore[attr-defined]
    package.sampling_params = params  # type: ignore[attr-defined]
    sys.modules["vllm"] = package
    sys.modules["vllm.sampling_params"] = params


def _install() -> None:
    from inference.kinds.chat import ChatKind

    def engine_build(self: ChatKind, model: Any, checkpoint: Any) -> Any:
        return SimulatedChatEngine(model_id=model.id, reasoning=model.reasoning)

    ChatKind.engine_build = engine_build  # type: ignore[assignment,method-assign]


_vllm_stand_in()

import os  # noqa: E402

import django  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
django.setup()
_install()
print(f"[scale] SIMULATED GPU worker {os.environ.get('ANEX_SCALE_WORKER', '?')} "
      f"(pid {os.getpid()}): chat engines are simulated (bench/scale/simengine.py)",
      flush=True)

import anex.worker  # noqa: E402,F401  the product's worker: its actors and run queues
