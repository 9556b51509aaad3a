"""The model catalog, loaded once from catalog.toml and checked as it loads."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Any

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
TASKS = ("chat", "embed", "decide")
MODALITIES = ("text", "image", "audio", "video")
ZERO = Decimal(0)
MEGABYTE = 1024 * 1024  # the catalog's MB, for the inline media caps


class CatalogError(ValueError):
    pass


@dataclass(frozen=True)
class ModelPrice:
    input_per_mtok: Decimal = ZERO
    media_input_per_mtok: Decimal | None = None  # None: media tokens at the input rate
    output_per_mtok: Decimal = ZERO
    media_row_per_mtok: Decimal | None = None  # None: such rows at the input rate
    per_image: Decimal = ZERO
    per_clip: Decimal = ZERO
    per_media_minute: Decimal = ZERO
    minimum_job: Decimal = ZERO
    realtime_input_per_mtok: Decimal | None = None

    # The rates in force, an unset one falling back to the plain input rate.
    @property
    def media_input_rate(self) -> Decimal:
        return self.input_per_mtok if self.media_input_per_mtok is None \
            else self.media_input_per_mtok

    @property
    def media_row_rate(self) -> Decimal:
        return self.input_per_mtok if self.media_row_per_mtok is None \
            else self.media_row_per_mtok

    def realtime_rates(self, model_id: str) -> ModelPrice:
        """The rates a realtime request is priced at: input tokens at the realtime rate
        (realtime requests are text only), nothing else, no minimum."""
        if self.realtime_input_per_mtok is None:
            raise ValueError(f"{model_id} has no realtime rate")
        return ModelPrice(input_per_mtok=self.realtime_input_per_mtok)


@dataclass(frozen=True)
class ModelMedia:
    image_tokens: int | None = None
    audio_tokens_per_second: Decimal | None = None
    audio_max_seconds: int | None = None
    video_frame_tokens: int | None = None
    video_fps_default: int | None = None
    video_fps_max: int | None = None  # None: the job cannot set video_fps
    video_max_seconds: int | None = None
    # The rate an audio clip is decoded to for the model's encoder (Hz). Every audio model
    # in the catalog reads 16 kHz (Whisper-style log-mel features); one that reads another
    # says so.
    audio_sample_rate: int = 16_000


@dataclass(frozen=True)
class CatalogModel:
    id: str
    task: str
    modalities: tuple[str, ...]
    context_tokens: int
    weights: str
    price: ModelPrice
    media: ModelMedia = field(default_factory=ModelMedia)
    media_context_tokens: int | None = None
    max_output_tokens: int | None = None
    reasoning: bool = False
    effort_levels: tuple[str, ...] = ()
    default_effort: str | None = None
    dimensions_native: int | None = None
    dimensions_min: int | None = None
    max_questions: int | None = None
    max_state_chars: int | None = None
    option_budget_tokens: int | None = None
    local: bool = False  # the embedded default's own checkpoint, not a reference id

    @property
    def media_modalities(self) -> tuple[str, ...]:
        """What the model takes beside text: image, audio, video (the catalog's order)."""
        return tuple(modality for modality in self.modalities if modality != "text")

    def clip_ceiling_seconds(self, modality: str) -> int | None:
        """The longest clip of this modality the model takes: also what a clip whose
        length cannot be worked out is assumed to run (the reference's duration_seconds)."""
        if modality == "audio":
            return self.media.audio_max_seconds
        if modality == "video":
            return self.media.video_max_seconds
        raise CatalogError(f"{modality} has no duration")


def _decimal(model_id: str, name: str, value: Any) -> Decimal:
    if not isinstance(value, str):
        raise CatalogError(f"{model_id}: {name} must be a decimal string, not {value!r}")
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise CatalogError(f"{model_id}: {name}={value!r} is not a decimal") from None
    if number < 0:
        raise CatalogError(f"{model_id}: {name} must not be negative")
    return number


def _section(model_id: str, cls: type, raw: dict[str, Any], decimals: set[str]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise CatalogError(f"{model_id}: unknown {cls.__name__} fields {sorted(unknown)}")
    values = {k: _decimal(model_id, k, v) if k in decimals else v for k, v in raw.items()}
    return cls(**values)


def _model(model_id: str, raw: dict[str, Any]) -> CatalogModel:
    raw = dict(raw)
    price = _section(model_id, ModelPrice, raw.pop("price", {}),
                     {f.name for f in fields(ModelPrice)})
    media = _section(model_id, ModelMedia, raw.pop("media", {}), {"audio_tokens_per_second"})
    known = {f.name for f in fields(CatalogModel)} - {"id", "price", "media"}
    unknown = set(raw) - known
    if unknown:
        raise CatalogError(f"{model_id}: unknown fields {sorted(unknown)}")
    if raw.get("task") not in TASKS:
        raise CatalogError(f"{model_id}: task must be one of {TASKS}")
    modalities = tuple(raw.pop("modalities", ()))
    if "text" not in modalities or not set(modalities) <= set(MODALITIES):
        raise CatalogError(f"{model_id}: modalities must include text, within {MODALITIES}")
    effort_levels = tuple(raw.pop("effort_levels", ()))
    return CatalogModel(id=model_id, price=price, media=media, modalities=modalities,
                        effort_levels=effort_levels, **raw)


@dataclass(frozen=True)
class CatalogLimits:
    """The catalog's [limits]: what holds on every model rather than per model."""

    inline_max_mb: dict[str, int]  # by modality: image, audio, video
    estimate_kbps: dict[str, Decimal]  # by format: the floor bitrate an unread clip is sized at

    def inline_max_bytes(self, modality: str) -> int:
        return self.inline_max_mb[modality] * MEGABYTE


def _limits(raw: dict[str, Any]) -> CatalogLimits:
    unknown = set(raw) - {f.name for f in fields(CatalogLimits)}
    if unknown:
        raise CatalogError(f"limits: unknown fields {sorted(unknown)}")
    caps = raw.get("inline_max_mb", {})
    media = set(MODALITIES) - {"text"}
    if set(caps) != media or not all(isinstance(v, int) and v > 0 for v in caps.values()):
        raise CatalogError(f"limits.inline_max_mb must give a positive size for each of "
                           f"{sorted(media)}")
    kbps = {name: _decimal("limits", f"estimate_kbps.{name}", value)
            for name, value in raw.get("estimate_kbps", {}).items()}
    if not all(kbps.values()):
        raise CatalogError("limits.estimate_kbps must be above 0")
    return CatalogLimits(inline_max_mb=dict(caps), estimate_kbps=kbps)


def catalog_limits_load(path: Path = CATALOG_PATH) -> CatalogLimits:
    with path.open("rb") as handle:
        return _limits(tomllib.load(handle).get("limits", {}))


@cache
def catalog_limits() -> CatalogLimits:
    return catalog_limits_load()


@dataclass(frozen=True)
class CatalogTier:
    """An urgency tier's catalog entry (the catalog's [tiers]; a job's `priority`)."""

    name: str
    multiplier: Decimal  # scales the job's exact cost before rounding (inference.pricing)
    completion_hours: int  # the completion window, from approval


TIER_NAMES = ("flex", "standard", "priority")


def _tiers(raw: dict[str, Any]) -> dict[str, CatalogTier]:
    if set(raw) != set(TIER_NAMES):
        raise CatalogError(f"tiers must be exactly {list(TIER_NAMES)}")
    tiers: dict[str, CatalogTier] = {}
    for name in TIER_NAMES:
        entry = dict(raw[name])
        unknown = set(entry) - {"multiplier", "completion_hours"}
        if unknown:
            raise CatalogError(f"tiers.{name}: unknown fields {sorted(unknown)}")
        multiplier = _decimal(f"tiers.{name}", "multiplier", entry.get("multiplier"))
        hours = entry.get("completion_hours")
        if not multiplier or not isinstance(hours, int) or hours <= 0:
            raise CatalogError(f"tiers.{name}: multiplier and completion_hours must be "
                               "above 0")
        tiers[name] = CatalogTier(name=name, multiplier=multiplier, completion_hours=hours)
    if tiers["standard"].multiplier != 1:
        raise CatalogError("tiers.standard: the multiplier is 1 (the reference's prices)")
    return tiers


def catalog_tiers_load(path: Path = CATALOG_PATH) -> dict[str, CatalogTier]:
    with path.open("rb") as handle:
        return _tiers(tomllib.load(handle).get("tiers", {}))


@cache
def catalog_tiers() -> dict[str, CatalogTier]:
    """The urgency tiers by name: flex, standard, priority."""
    return catalog_tiers_load()


def catalog_load(path: Path = CATALOG_PATH) -> dict[str, CatalogModel]:
    """Every model in the file, the local ones included."""
    with path.open("rb") as handle:
        document = tomllib.load(handle)
    return {model_id: _model(model_id, raw) for model_id, raw in document["models"].items()}


@cache
def catalog_all() -> dict[str, CatalogModel]:
    return catalog_load()


@cache
def catalog() -> dict[str, CatalogModel]:
    """The public models: the reference's ids, which pricing and the docs list."""
    return {model_id: m for model_id, m in catalog_all().items() if not m.local}


@cache
def local_models() -> dict[str, CatalogModel]:
    """The embedded default's own models (`local = true`), served from local checkpoints."""
    return {model_id: m for model_id, m in catalog_all().items() if m.local}


def model_get(model_id: str) -> CatalogModel | None:
    return catalog_all().get(model_id)
