"""Content parts: their types, the model's encoders, formats, inline size caps, clip
durations, video frames, and the tokens each part costs (the reference's "The input file",
"Supported formats" and duration_seconds sections)."""

from __future__ import annotations

import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from inference.pricing import clip_seconds_billed
from inference.rows.core import JobContext, RowRef, listing
from inference.rows.durations import (
    ClipHeader,
    clip_header_read,
    clip_seconds_estimated,
)
from inference.rows.formats import (
    SUPPORTED,
    UNTYPED,
    format_from_extension,
    format_from_media_type,
    format_from_name,
    format_in,
    same_container,
    sniff,
)

PART_TYPES = ("text", "image_url", "input_audio", "audio_url", "video_url")
MODALITY_OF = {"image_url": "image", "input_audio": "audio", "audio_url": "audio",
               "video_url": "video"}
_PART_FOR = {"image": "an image_url", "audio": "an audio_url", "video": "a video_url"}
# The reference's wording: "an embedded <image|audio file|video file> exceeds the size limit".
_EMBEDDED = {"image": "image", "audio": "audio file", "video": "video file"}
_SNIFF_BYTES = 64 * 1024  # enough to see past an ID3 tag with a small cover image
_URL_IN_MESSAGE = 200


@dataclass(frozen=True, slots=True)
class Media:
    """One media part, resolved: its modality, the tokens it encodes to, and for a clip the
    seconds it is checked and billed at."""

    modality: str
    tokens: int
    seconds: Decimal | None = None
    estimated: bool = False  # sized from its bytes or assumed at the ceiling


@dataclass(slots=True)
class Parts:
    texts: list[str]
    media: list[Media]


def parts_check(parts: list[object], *, job: JobContext, row: RowRef, where: str,
                types: tuple[str, ...] = PART_TYPES,
                refused: Mapping[str, str] | None = None) -> Parts:
    """A list of content parts: each a known type, text as a string, media resolved.
    `refused` maps a known type to the message that turns it away here (audio on an
    embedding model)."""
    found = Parts([], [])
    for position, part in enumerate(parts):
        if not isinstance(part, dict):
            raise row.reject(f"{where}[{position}] must be a content part object with a type")
        kind = part.get("type")
        if refused and isinstance(kind, str) and kind in refused:
            raise row.reject(refused[kind])
        if kind not in types:
            raise row.reject(f"unsupported content part type '{kind}': supported types are "
                             f"{', '.join(types)}")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise row.reject(f"{where}[{position}].text must be a string")
            found.texts.append(text)
        else:
            found.media.append(media_part(str(kind), part, job=job, row=row))
    return found


def media_part(kind: str, part: dict[str, object], *, job: JobContext, row: RowRef) -> Media:
    modality = MODALITY_OF[kind]
    model = job.model
    if modality not in model.modalities:
        raise row.reject(no_encoder(job, modality))
    body = part.get(kind)
    if not isinstance(body, dict):
        raise row.reject(f"a content part of type {kind} carries its media in an object "
                         f"under '{kind}'")
    declared_seconds = _declared_seconds(body, kind, row) if modality != "image" else None
    inline, declared, declared_by = _source(kind, modality, body, job=job, row=row)

    header: ClipHeader | None = None
    size: int | None = None
    container = declared
    if inline is not None:
        size = _decoded_size(inline)
        cap = job.limits.inline_max_bytes(modality)
        if size > cap:
            raise row.reject(f"an embedded {_EMBEDDED[modality]} exceeds the size limit "
                             f"(max {job.limits.inline_max_mb[modality]} MB)")
        data = _decode(inline, kind, row)
        size = len(data)
        sniffed = sniff(data[:_SNIFF_BYTES])
        if sniffed == "asf":  # the one container behind both .wma and .wmv
            sniffed = "wma" if modality == "audio" else "wmv"
        if declared is None:
            if sniffed is None:
                raise row.reject(
                    f"the inline {modality} in {kind} is not in a format we recognise: "
                    f"supported {modality} formats are {', '.join(SUPPORTED[modality])}"
                )
            _allowed(sniffed, modality, kind, row)
            container = sniffed
        elif sniffed is not None:
            if not same_container(declared, sniffed):
                raise row.reject(f"the inline {modality} in {kind} is {sniffed}, but "
                                 f"{declared_by} says {declared}")
            container = sniffed
        if modality != "image" and declared_seconds is None and container is not None:
            header = clip_header_read(data, container)

    if modality == "image":
        return Media("image", int(_rate(model.media.image_tokens, model.id, "image_tokens")))
    return _clip(modality, declared_seconds, header, size, container, job=job, row=row)


def no_encoder(job: JobContext, modality: str) -> str:
    model = job.model
    return (f"model '{model.id}' has no encoder for {modality} input (it takes "
            f"{listing(model.modalities)}); choose a model that takes {modality}")


def _source(kind: str, modality: str, body: dict[str, object], *, job: JobContext,
            row: RowRef) -> tuple[str | None, str | None, str]:
    """(inline base64 or None, the declared format or None, what declared it), in the
    reference's order: the format field, a data: media type, the URL's extension, and for
    an extensionless audio or video URL the host's Content-Type."""
    if kind == "input_audio":
        data, name = body.get("data"), body.get("format")
        if not isinstance(data, str) or not data:
            raise row.reject("input_audio.data must carry the audio's bytes as base64")
        if data[:5].lower() == "data:":
            raise row.reject("input_audio.data is bare base64 without a data: prefix (or "
                             "send the data: URI as an audio_url)")
        if not isinstance(name, str) or not name.strip():
            raise row.reject("input_audio.format is required: one of "
                             f"{', '.join(SUPPORTED['audio'])}")
        declared = format_from_name(name) or name.strip().lower()
        _allowed(declared, modality, kind, row)
        return data, format_in(modality, declared), "input_audio.format"

    url = body.get("url")
    if not isinstance(url, str) or not url:
        raise row.reject(f"{kind}.url must be an https:// URL or a data: URI")
    if url[:5].lower() == "data:":
        media_type, payload = _data_uri(url, kind, row)
        if not media_type or media_type.split(";")[0].strip().lower() == UNTYPED:
            return payload, None, ""
        declared = format_from_media_type(media_type)
        _allowed(declared, modality, kind, row)
        return payload, format_in(modality, declared), f"its data: media type '{media_type}'"
    if url[:8].lower() != "https://":
        scheme = url.split(":", 1)[0] if ":" in url else url[:20]
        raise row.reject(f"{kind}.url must be an https:// URL or a data: URI, not "
                         f"'{scheme}:...' (media is fetched over HTTPS only)")
    extension = format_from_extension(url)
    if extension is not None:
        _allowed(extension, modality, kind, row)
        return None, format_in(modality, extension), "its file extension"
    if modality == "image":
        return None, None, ""  # images are never probed: passed to the model as they are
    asked, answer = job.content_type(url)
    if not asked or answer is None:
        return None, None, ""  # best effort: a clip we could not ask about is admitted
    probed = format_from_media_type(answer)
    if probed == UNTYPED or format_in(modality, probed) not in SUPPORTED[modality]:
        shown = url if len(url) <= _URL_IN_MESSAGE else url[:_URL_IN_MESSAGE] + "..."
        raise row.reject(
            f"the host of {shown} answers Content-Type '{answer}', which is not a supported "
            f"{modality} format ({', '.join(SUPPORTED[modality])}). Put a file extension on "
            "the URL, serve the object with its real content type, or send the bytes inline."
        )
    return None, format_in(modality, probed), "the host's Content-Type"


def _allowed(name: str, modality: str, kind: str, row: RowRef) -> None:
    name = format_in(modality, name)
    if name in SUPPORTED[modality]:
        return
    for other, names in SUPPORTED.items():
        if name in names:
            raise row.reject(f"{kind} carries {other} ({name}); send {other} as "
                             f"{_PART_FOR[other]} part")
    raise row.reject(f"{modality} format '{name}' is not supported: supported {modality} "
                     f"formats are {', '.join(SUPPORTED[modality])}")


def _declared_seconds(body: dict[str, object], kind: str, row: RowRef) -> Decimal | None:
    value = body.get("duration_seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise row.reject(f"{kind}.duration_seconds must be a positive number of seconds")
    return Decimal(str(value))


def _data_uri(url: str, kind: str, row: RowRef) -> tuple[str, str]:
    header, comma, payload = url[5:].partition(",")
    params = header.split(";")
    if not comma or "base64" not in (p.strip().lower() for p in params[1:]):
        raise row.reject(f"{kind}.url is a data: URI without base64 data "
                         "(data:<media type>;base64,<data>)")
    return params[0].strip(), payload


def _decoded_size(payload: str) -> int:
    """The bytes a base64 payload decodes to, known before decoding it."""
    return len(payload) * 3 // 4 - payload[-2:].count("=")


def _decode(payload: str, kind: str, row: RowRef) -> bytes:
    try:
        return binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        raise row.reject(f"the inline data in {kind} is not valid base64") from None


def _rate(value: int | Decimal | None, model_id: str, name: str) -> int | Decimal:
    if value is None:
        raise LookupError(f"catalog: {model_id} takes this media but has no {name}")
    return value


def seconds_text(seconds: Decimal, *, whole: bool = False) -> str:
    """45 -> '45', 45.25 -> '45.3' (rounded up: never shorter than the clip)."""
    step = Decimal(1) if whole else Decimal("0.1")
    shown = seconds.quantize(step, rounding=ROUND_CEILING).normalize()
    return format(shown, "f")


def row_context(job: JobContext, modalities: set[str]) -> int:
    """A row's input budget: rows carrying images or video on a model with a media context
    (qwen3.8-27b) take that, every other row the model's context."""
    model = job.model
    if model.media_context_tokens and modalities & {"image", "video"}:
        return model.media_context_tokens
    return model.context_tokens


def _longest_video(frame_budget: int, fps: Decimal) -> Decimal:
    """The longest clip whose frames fit: frames = ceil(seconds x fps) + 1 <= budget."""
    return Decimal(max(frame_budget - 1, 1)) / fps


def _clip(modality: str, declared: Decimal | None, header: ClipHeader | None,
          size: int | None, container: str | None, *, job: JobContext,
          row: RowRef) -> Media:
    model = job.model
    cap = model.clip_ceiling_seconds(modality)
    fps: Decimal | None = None
    if modality == "video":
        frame_tokens = int(_rate(model.media.video_frame_tokens, model.id,
                                 "video_frame_tokens"))
        frame_budget = row_context(job, {"video"}) // frame_tokens
        fps, wording = job.video_fps, job.video_fps_wording
        if header is not None and header.fps is not None and header.fps < fps:
            fps, wording = header.fps, "clip's own"  # sampling finds no frames not shot
        longest = _longest_video(frame_budget, fps)
    else:
        frame_budget = 0
        per_second = Decimal(_rate(model.media.audio_tokens_per_second, model.id,
                                   "audio_tokens_per_second"))
        longest = Decimal(row_context(job, {"audio"})) / per_second

    estimated = False
    if declared is not None or header is not None:
        seconds = clip_seconds_billed(model, modality, declared=declared,
                                      measured=header.seconds if header else None)
    elif size is not None and container is not None:
        kbps = job.limits.estimate_kbps.get(container) \
            or min(job.limits.estimate_kbps.values())
        seconds, estimated = clip_seconds_estimated(size, kbps), True
    else:
        # Unsizable (hosted, undeclared): the model's ceiling, the worst case that still
        # fits a row; for video that is also bounded by what fits at the sampling rate.
        seconds = clip_seconds_billed(model, modality) if cap is not None else longest
        if modality == "video":
            seconds = min(seconds, longest)
        return _costed(modality, seconds, fps, job, True)

    if cap is not None and seconds > cap:
        if estimated:
            raise row.reject(
                f"{modality} duration estimated at {seconds_text(seconds, whole=True)}s from "
                f"its size exceeds the {cap}s maximum for model '{model.id}'. Declare "
                f"duration_seconds if the clip is shorter, or shorten or split this "
                f"{modality} input."
            )
        raise row.reject(f"{modality} duration {seconds_text(seconds)}s exceeds the {cap}s "
                         f"maximum for model '{model.id}'. Shorten or split this {modality} "
                         "input.")
    if fps is not None and _frames(seconds, fps) > frame_budget:
        length = f"{seconds_text(seconds, whole=estimated)} s"
        if estimated:
            length += " (estimated from its size)"
        advice = "Shorten the clip or lower video_fps." if job.takes_video_fps \
            else "Shorten the clip."
        raise row.reject(
            f"video is {length}; at the {wording} {_fps_text(fps)} fps the "
            f"longest clip {model.id} takes is "
            f"{longest.to_integral_value(rounding=ROUND_FLOOR)} s. {advice}"
        )
    return _costed(modality, seconds, fps, job, estimated)


def _fps_text(fps: Decimal) -> str:
    return format(fps.quantize(Decimal("0.01"), rounding=ROUND_FLOOR).normalize(), "f")


def _frames(seconds: Decimal, fps: Decimal) -> int:
    """The reference: ceil(seconds x rate) + 1 frames, and a clip holds at least 2."""
    return max(2, math.ceil(seconds * fps) + 1)


def _costed(modality: str, seconds: Decimal, fps: Decimal | None, job: JobContext,
            estimated: bool) -> Media:
    media = job.model.media
    if fps is not None:
        tokens = _frames(seconds, fps) * int(media.video_frame_tokens or 0)
    else:
        tokens = math.ceil(seconds * Decimal(media.audio_tokens_per_second or 0))
    return Media(modality, tokens, seconds, estimated)
