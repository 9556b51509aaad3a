"""Pricing: one function turns a model and its usage into a charge.

The estimate (est_cost_cents) and the final charge both come from `price`, so they can
never disagree about a rate; a realtime request's exact cost comes from the same
`usage_cost_usd`, at the model's realtime rates. The rules
(docs/dev/decisions/2026-12-01-credits-and-billing.md): 1 credit is 1 US cent; a job's charge is its
exact cost rounded up to a whole credit, at least 1 credit when it did any work, and at least the
model's minimum job price; a job that did no work is not charged.

A job's urgency tier (its `priority`: flex, standard, priority) scales its exact cost by the
tier's catalog multiplier (inference/catalog.toml [tiers]) before that rounding; the minimum
job price is not multiplied (docs/dev/decisions/2026-12-06-urgency-tiers.md). `price` and
`job_cost_usd` are the only places it is applied, so the estimate, the hold (the estimate),
the hold check while running and the final charge apply it alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

from inference.catalog import CatalogModel, catalog_tiers

MILLION = Decimal(1_000_000)
CENTS_PER_USD = Decimal(100)
SECONDS_PER_MINUTE = Decimal(60)


# Usage fields that say how the work was done, not what it bills: `price` never reads them.
REPORTED = frozenset({"cached_input_tokens", "merged_rows"})


@dataclass(frozen=True)
class Usage:
    """What a job (or an estimate of it) consumes.

    input_tokens    text input tokens; on an embedding model, those of text-only rows
    media_tokens    tokens that images, audio and video frames encode to (chat models)
    output_tokens   generated tokens, thinking included
    media_row_tokens
                    embedding models: all input tokens (text included) of rows carrying
                    any image or video, billed at the model's media-row rate
    images, clips   counts, for the flat per-item charges (clips: audio and video)
    media_seconds   the audio and video duration billed by the per-minute surcharge

    Reported, never priced (REPORTED; decisions/2026-12-06-identical-rows-and-cached-tokens):
    cached_input_tokens
                    the part of chat rows' billed input the engine did not compute (its
                    prefix cache, or the row was a copy of an identical row): the sum of
                    the rows' usage.prompt_tokens_details.cached_tokens, billed at the
                    input rate as any input token
    merged_rows     rows answered by an identical row's run (computed once per chunk),
                    each billed as if it ran
    """

    input_tokens: int = 0
    media_tokens: int = 0
    output_tokens: int = 0
    media_row_tokens: int = 0
    images: int = 0
    clips: int = 0
    media_seconds: Decimal = Decimal(0)
    cached_input_tokens: int = 0
    merged_rows: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                        for f in fields(self)})

    @property
    def is_empty(self) -> bool:
        """Nothing billed: what is only reported never makes a charge of its own."""
        return not any(getattr(self, f.name) for f in fields(self) if f.name not in REPORTED)

    @property
    def all_input_tokens(self) -> int:
        """Every input token, text and media, whatever rate each bills at: a job's
        est_input_tok, a check's count, an OpenAI batch's usage.input_tokens."""
        return self.input_tokens + self.media_tokens + self.media_row_tokens


@dataclass(frozen=True)
class Price:
    exact_usd: Decimal
    cents: int


def usage_cost_usd(model: CatalogModel, usage: Usage, *, realtime: bool = False) -> Decimal:
    """The exact cost in dollars, before any rounding, floor or minimum; `realtime` at the
    model's realtime rates (ModelPrice.realtime_rates), which the realtime API meters
    unrounded and settles into the ledger in whole credits."""
    rates = model.price.realtime_rates(model.id) if realtime else model.price
    per_token = (
        usage.input_tokens * rates.input_per_mtok
        + usage.media_tokens * rates.media_input_rate
        + usage.output_tokens * rates.output_per_mtok
        + usage.media_row_tokens * rates.media_row_rate
    ) / MILLION
    per_item = usage.images * rates.per_image + usage.clips * rates.per_clip
    # Pro rata by the second (multiplied before dividing, to keep the most precision).
    per_minute = usage.media_seconds * rates.per_media_minute / SECONDS_PER_MINUTE
    return per_token + per_item + per_minute


STANDARD = "standard"


def tier_multiplier(priority: str) -> Decimal:
    """The price multiplier of an urgency tier (a job's `priority`)."""
    return catalog_tiers()[priority].multiplier


def job_cost_usd(model: CatalogModel, usage: Usage, priority: str = STANDARD) -> Decimal:
    """A job's exact cost in dollars at its tier: usage_cost_usd times the tier's
    multiplier, before any rounding, floor or minimum."""
    return usage_cost_usd(model, usage) * tier_multiplier(priority)


def minimum_job_cents(model: CatalogModel) -> int:
    return math.ceil(model.price.minimum_job * CENTS_PER_USD)


def price(model: CatalogModel, usage: Usage, priority: str = STANDARD) -> Price:
    """A job's charge (or estimate) at its urgency tier: the exact cost times the tier's
    multiplier, rounded up to a whole credit, at least 1 credit and at least the model's
    minimum job price (not multiplied); 0 for no work."""
    exact = job_cost_usd(model, usage, priority)
    if usage.is_empty:
        return Price(exact_usd=exact, cents=0)
    rounded = math.ceil(exact * CENTS_PER_USD)
    return Price(exact_usd=exact, cents=max(rounded, 1, minimum_job_cents(model)))


def clip_seconds_billed(model: CatalogModel, modality: str, *,
                        declared: Decimal | None = None,
                        measured: Decimal | None = None) -> Decimal:
    """The duration a clip is checked and billed at (the reference's duration_seconds):
    the declared length as stated; else the length read from the clip or estimated from
    its bytes; else, for a clip that cannot be sized, the model's full duration ceiling."""
    if declared is not None:
        return declared
    if measured is not None:
        return measured
    ceiling = model.clip_ceiling_seconds(modality)
    if ceiling is None:
        raise ValueError(f"{model.id} has no {modality} duration ceiling")
    return Decimal(ceiling)


def usd(amount: Decimal | None) -> str:
    """A price as the docs write it: "$0.05", "$1.20"; "-" when there is none."""
    if amount is None:
        return "-"
    text = format(amount.normalize(), "f")
    whole, _, fraction = text.partition(".")
    return f"${whole}.{fraction.ljust(2, '0')}"


def usd_per_million(amount: Decimal) -> str:
    """A per-item price as the docs write it, per million items."""
    return usd(amount * MILLION) if amount else "-"


def usage_json(usage: Usage) -> dict[str, Any]:
    """A Usage as a JSON object (Decimal seconds as a string, never a float)."""
    return {k: str(v) if isinstance(v, Decimal) else v
            for k, v in dataclasses.asdict(usage).items()}


# Chunk usage written before embedding rows with media were billed at one media-row rate
# split those tokens by images and video; a chunk stored then still settles.
USAGE_RENAMED = {"image_row_tokens": "media_row_tokens", "video_row_tokens": "media_row_tokens"}


def usage_from_json(raw: dict[str, Any]) -> Usage:
    """A Usage from its JSON object; a key it lacks (stored before the field existed, as
    cached_input_tokens and merged_rows) reads as 0."""
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        name = USAGE_RENAMED.get(key, key)
        amount = Decimal(value) if name == "media_seconds" else value
        fields[name] = fields.get(name, 0) + amount
    return Usage(**fields)
