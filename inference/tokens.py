"""Exact token counts with each model's own tokenizer (the checkpoint's tokenizer.json).

Which checkpoint serves a model id is deployment configuration (ANEX_CHECKPOINTS). A model
with no configured checkpoint cannot be counted, so a job on it cannot be priced
automatically: the estimator fails it with the reference's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

from django.conf import settings
from tokenizers import Tokenizer

TokenCounter = Callable[[str], int]


@cache
def _tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def token_counter(model_id: str) -> TokenCounter | None:
    checkpoint = settings.ANEX_CHECKPOINTS.get(model_id)
    if checkpoint is None:
        return None
    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        return None
    tokenizer = _tokenizer(path)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
