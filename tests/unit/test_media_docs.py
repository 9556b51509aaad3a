"""docs/media.md's table of which models take which media, held to the catalog (the one
file every model fact lives in): a rate changed there and not here fails this."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from inference.catalog import CatalogModel, catalog, local_models

PAGE = Path(__file__).resolve().parents[2] / "docs" / "media.md"


def table(heading: str = "## Which models take which media") -> dict[str, list[str]]:
    """The model table under `heading`: each row's cells by its model id."""
    rows: dict[str, list[str]] = {}
    text = PAGE.read_text()
    section = text[text.index(heading):]
    table_lines = section[section.index("\n|"):section.index("\n\n", section.index("\n|"))]
    for line in table_lines.strip().splitlines()[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def number(value: int | Decimal | None) -> str:
    return "-" if value is None else f"{value:,}"


def duration(seconds: int) -> str:
    return f"{seconds // 60} minutes" if seconds % 60 == 0 and seconds >= 120 else f"{seconds} s"


def longest(model: CatalogModel) -> str:
    media = model.media
    audio, video = media.audio_max_seconds, media.video_max_seconds
    if audio is not None and audio == video:
        return duration(audio)
    clips = [f"audio {duration(audio)}"] if audio is not None else []
    if video is not None:
        clips.append(f"video {duration(video)}")
    elif "video" in model.modalities:
        budget = model.media_context_tokens or model.context_tokens
        clips.append(f"video: what fits {budget:,} tokens")
    return ", ".join(clips)


def expected(model: CatalogModel) -> list[str]:
    media = model.media
    rate = "-" if "video" not in model.modalities else (
        f"{media.video_fps_default}, up to {media.video_fps_max}" if media.video_fps_max
        else f"{media.video_fps_default}, fixed")
    return [", ".join(m for m in model.modalities if m != "text"), number(media.image_tokens),
            number(media.audio_tokens_per_second), number(media.video_frame_tokens), rate,
            longest(model)]


def test_the_media_table_is_the_catalogs() -> None:
    models = {model.id: model for model in catalog().values()
              if set(model.modalities) - {"text"}}
    rows = table()
    assert set(rows) == set(models)
    for model_id, model in models.items():
        assert rows[model_id] == expected(model), model_id


def test_the_local_media_models_table_is_the_catalogs() -> None:
    models = {model.id: model for model in local_models().values()
              if set(model.modalities) - {"text"}}
    rows = table("## Trying it locally")
    assert set(rows) == set(models)
    for model_id, model in models.items():
        assert rows[model_id] == expected(model), model_id
