"""Every read the realtime API makes: the operator's switch, and which models this
deployment serves to a key (docs/dev/style.md rule 2: the key's scopes are applied here, once)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings

from console.models import ApiKey
from inference.catalog import CatalogModel, catalog_all
from inference.checkpoints import STAMP
from realtime.constants import SWITCH_ID
from realtime.models import RealtimeSwitch

# The switch is read by every realtime request; each process reads it at most this often,
# so an operator's freeze reaches every web process within a second, one query a second.
FROZEN_READ_EVERY_SECONDS = 1.0
_frozen_read: tuple[float, bool] | None = None  # (when, frozen), replaced whole: thread-safe


def realtime_frozen() -> bool:
    global _frozen_read
    now = time.monotonic()
    read = _frozen_read
    if read is None or now - read[0] >= FROZEN_READ_EVERY_SECONDS:
        read = _frozen_read = (now, RealtimeSwitch.objects.filter(pk=SWITCH_ID,
                                                                  frozen=True).exists())
    return read[1]


def realtime_frozen_forget() -> None:
    """Read the switch afresh on the next request (this process has just changed it)."""
    global _frozen_read
    _frozen_read = None


def realtime_engine_urls(model: CatalogModel) -> tuple[str, ...]:
    """The engine servers answering this model in realtime (each request goes to the next
    in turn), or none when it is not served in realtime: it has no realtime rate in the
    catalog, or no engine in this deployment."""
    if model.price.realtime_input_per_mtok is None:
        return ()
    urls: str | tuple[str, ...] = settings.ANEX_REALTIME_ENGINES.get(model.id, ())
    return (urls,) if isinstance(urls, str) else tuple(urls)


@cache
def _built_here(checkpoint: Path) -> bool:
    return (checkpoint / STAMP).is_file()


def local_stand_in(model: CatalogModel) -> bool:
    """A model answered by a small checkpoint built on this machine rather than its
    published weights: the embedded default's own ids, and a public id (laya) that it
    serves from one of them."""
    if model.local:
        return True
    checkpoint = settings.ANEX_CHECKPOINTS.get(model.id)
    return checkpoint is not None and _built_here(Path(checkpoint).resolve())


@dataclass(frozen=True)
class ListedModel:
    model: CatalogModel
    realtime: bool
    local: bool


def realtime_models(*, key: ApiKey) -> list[ListedModel]:
    """Every model this deployment serves (a checkpoint for its workers, or a realtime
    engine), in catalog order, that the key may use: a model outside the key's scopes is
    neither listed nor accepted (docs/dev/decisions/2026-12-01-adopted-from-the-peer-api.md)."""
    served = set(settings.ANEX_CHECKPOINTS) | set(settings.ANEX_REALTIME_ENGINES)
    return [ListedModel(model=model, realtime=bool(realtime_engine_urls(model)),
                        local=local_stand_in(model))
            for model_id, model in catalog_all().items()
            if model_id in served and key.allows(model_id)]
