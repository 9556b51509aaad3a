"""Races made deterministic: run a step right before or right after a named function, instead
of timing threads with sleeps (the idea of saleor's tests/race_condition.py, RunBefore and
RunAfter). The competing step then lands exactly in the window a race needs, every run.

    with run_after("jobs.services.inputs._advertised_size", arrived.wait, every=True):
        ...  # every request waits, past its probe, until all have got there

The step gets the call's arguments. By default it runs on the first call only, so a step
that calls the function itself (a second request, say) runs it plainly; every=True runs it
on each call, in whichever thread made it.
"""

from __future__ import annotations

import functools
import pkgutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from unittest import mock


@contextmanager
def _around(target: str, step: Callable[..., object], *, after: bool,
            every: bool) -> Iterator[None]:
    path, _, name = target.rpartition(".")
    owner = pkgutil.resolve_name(path)
    function = getattr(owner, name)
    lock = threading.Lock()
    stepped = False

    def first() -> bool:
        nonlocal stepped
        with lock:
            was, stepped = stepped, True
        return every or not was

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not first():
            return function(*args, **kwargs)
        if not after:
            step(*args, **kwargs)
        result = function(*args, **kwargs)
        if after:
            step(*args, **kwargs)
        return result

    with mock.patch.object(owner, name, wrapper):
        yield


def run_before(target: str, step: Callable[..., object], *,
               every: bool = False) -> AbstractContextManager[None]:
    """While in the block, `step(*args, **kwargs)` runs right before `target` is called."""
    return _around(target, step, after=False, every=every)


def run_after(target: str, step: Callable[..., object], *,
              every: bool = False) -> AbstractContextManager[None]:
    """While in the block, `step(*args, **kwargs)` runs right after `target` returns."""
    return _around(target, step, after=True, every=every)
