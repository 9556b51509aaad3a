"""Task kinds: what a row of each catalog task (chat, embed, decide) means, from its checks
and price inputs to its engine request and result body (base.py has the interface).

    kind = kind_for(model)                 # the catalog model's kind
    cost = kind.row_cost(body, job=context, row=ref)
    served = kind.serve(job, rows, meter)

This registry is the only place the catalog's task string is read: everything else asks
the kind.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from inference.catalog import model_get
from inference.engines.registry import Engine, EngineNotConfigured
from inference.kinds.base import (
    GENERATION_FIELDS,
    ParquetReading,
    RequestMalformed,
    RequestRefused,
    ServedRow,
    TaskKind,
)
from inference.kinds.engines import engine_cached

if TYPE_CHECKING:
    from inference.catalog import CatalogModel

AnyKind = TaskKind[Any, Any, Any]


@cache
def kinds_all() -> tuple[AnyKind, ...]:
    """Every kind, in the order the docs list them."""
    # Imported on first use, not with this package: a kind's row checks come from
    # jobs.validation, whose file readers import this package for kind_for.
    from inference.kinds.chat import ChatKind
    from inference.kinds.decide import DecideKind
    from inference.kinds.embed import EmbedKind

    return (ChatKind(), EmbedKind(), DecideKind())


@cache
def _by_task() -> dict[str, AnyKind]:
    return {kind.task: kind for kind in kinds_all()}


def kind_named(task: str) -> AnyKind:
    """The kind of a catalog task string, as a job stores it (Job.task_type)."""
    return _by_task()[task]


def kind_for(model: CatalogModel) -> AnyKind:
    """The kind of a catalog model's rows."""
    return kind_named(model.task)


def engine_for(model_id: str) -> Engine:
    """The process's engine for a served model id, whatever its kind (a kind's own
    `engine` is typed to its engine); EngineNotConfigured when it is not served here."""
    model = model_get(model_id)
    if model is None:
        raise EngineNotConfigured(f"model '{model_id}' is not in the catalog")
    return engine_cached(model_id, kind_for(model))


__all__ = [
    "GENERATION_FIELDS",
    "AnyKind",
    "ParquetReading",
    "RequestMalformed",
    "RequestRefused",
    "ServedRow",
    "TaskKind",
    "engine_for",
    "kind_for",
    "kind_named",
    "kinds_all",
]
