"""A heavy package a few tests use, imported when one of them first reaches into it rather
than when its module is collected: every xdist worker collects every test module, so a
top-level `import openai` (about 2 s of CPU) was paid by each of them."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)

    def __getattr__(self, attribute: str) -> Any:
        # pytest's collection probes every module-level name for private attributes (a
        # mock's `_mock_name`, when it looks for fixtures): answered without the import,
        # which it would otherwise make in every worker. The tests read public names only.
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)


def lazy_module(name: str) -> Any:
    """The module `name`, imported on its first attribute read (`name.thing`)."""
    return LazyModule(name)
