"""One forward pass at a time in a process, whichever engine runs it
(docs/dev/decisions/2026-12-02-two-engines-in-one-process.md).

vLLM keeps the running forward pass's context, and the config of the engine being built, in
process-wide globals. Two engines of different checkpoints stepping at once in one
process's threads (a GPU worker serving a chat model and an embedding model, an engine
server given two `--model`s) see each other's: the second to finish its step resets the
first's context, whose attention layers then fail ("Forward context is not set", a KeyError
in get_attention_context), or the heap is corrupted and the process dies.

So every engine step, pooling run and engine build holds FORWARD. It is the innermost lock:
taken after an engine's own lock (runtime.Loaded.lock), never held while waiting for
another. The feed takes it for each step, not for a whole drain, so a chat batch and an
embedding chunk on two engines take turns step by step rather than one waiting for the
other's engine to empty.
"""

from __future__ import annotations

import threading

FORWARD = threading.Lock()
