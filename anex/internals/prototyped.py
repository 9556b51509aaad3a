"""An answer serializer whose fields are built once per process (anex/internals: it keeps a
DRF serializer instance's built fields and calls to_representation on them from many
threads, which DRF neither documents nor promises)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar


class Prototyped:
    """An answer serializer whose fields are built once per process: `answer(instance)` is
    `cls(instance).data` (the same dict) from one prototype instance's fields, where each
    new serializer builds them again (a ModelSerializer's from the model's fields: about a
    quarter of a job read's CPU, on a poll clients send in a loop; bench/RESULTS.md, "Realtime
    web tier CPU"). Only for a serializer whose
    answer reads nothing but the instance: no context, no request. The prototype's fields
    are built before any thread shares it, and reading an answer writes nothing to them."""

    _prototype: ClassVar[Any] = None
    _prototype_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def answer(cls, instance: Any) -> dict[str, Any]:
        prototype: Any = cls.__dict__.get("_prototype")
        if prototype is None:
            with Prototyped._prototype_lock:
                prototype = cls.__dict__.get("_prototype")
                if prototype is None:
                    prototype = cls()
                    prototype.fields  # noqa: B018  (built now, while no other thread has it)
                    cls._prototype = prototype
        return dict(prototype.to_representation(instance))
