"""A job's usage, summed over its chunks in the database: what its hold is checked against
before each chunk and what it is charged (what each row bills is
inference.kinds.metering.RowMeter's)."""

from __future__ import annotations

import dataclasses

from django.db.models import BigIntegerField, DecimalField, QuerySet, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from inference.pricing import USAGE_RENAMED, Usage, usage_from_json
from jobs.models import Chunk


def usage_sum(chunks: QuerySet[Chunk]) -> Usage:
    """These chunks' usage added up in the database (the hold is checked before every
    chunk, so the chunks are never all read into Python)."""
    totals = chunks.aggregate(**{
        name: Sum(Cast(KeyTextTransform(name, "usage"),
                       DecimalField(max_digits=30, decimal_places=9)
                       if name == "media_seconds" else BigIntegerField()))
        for name in [f.name for f in dataclasses.fields(Usage)] + list(USAGE_RENAMED)})
    return usage_from_json({name: value for name, value in totals.items()
                            if value is not None})
