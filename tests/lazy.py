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
        return getattr(importlib.import_module(self.__name__), attribute)


def lazy_module(name: str) -> Any:
    """The module `name`, imported on its first attribute read (`name.thing`)."""
    return LazyModule(name)
