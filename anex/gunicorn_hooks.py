"""The web role's gunicorn hooks (anex.roles: `--config python:anex.gunicorn_hooks`).

Once a worker has loaded the application, and before its first request, it loads what its
requests would otherwise load on the way (the URLconf with every view module; the
tokenizer and chat template of each local checkpoint, which realtime counts with, and
transformers with them), collects the garbage, and moves what is left out of the
collector's reach (gc.freeze): some 205,000 objects that live as long as the process.
Without that, each full collection walked them all with every thread of the process
stopped, 140-470 ms under load, about every five seconds, and a job read that met one
waited it out (docs/decisions.md, "The web process's heap"). What requests make later is
collected as before.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

logger = logging.getLogger(__name__)


def heap_freeze() -> None:
    from django.conf import settings
    from django.urls import get_resolver

    from inference.tokens import token_counter

    get_resolver().url_patterns  # noqa: B018  (imports every view module)
    for model_id in settings.ANEX_CHECKPOINTS:
        try:
            token_counter(model_id)
        except Exception as exc:  # the first request that counts with it says so again
            logger.warning("the tokenizer of %s could not be loaded: %s", model_id,
                           type(exc).__name__)
    gc.collect()
    gc.freeze()
    logger.info("web worker ready: %d objects frozen", gc.get_freeze_count())


def post_worker_init(worker: Any) -> None:
    heap_freeze()
