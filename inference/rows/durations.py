"""How long an inline clip runs, read offline from its own header (the reference's
duration_seconds rules), or estimated from its size when the header says nothing.

MP4/MOV/M4A (ISO BMFF: moov/mvhd) and WebM/MKV (EBML: Segment/Info Duration and
TimecodeScale) are read here by two small parsers that never decode media; they also give
a video track's own frame rate, since a clip is sampled no faster than it was shot. WAV,
AIFF, FLAC, Ogg/Opus and MP3 headers are read by mutagen (pure Python). AVI and ADTS AAC are
not read: they, and any header that fails to parse, are sized from their bytes at the
catalog's floor bitrate, so the estimate runs long rather than short.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from mutagen import File as MutagenFile
from mutagen.aiff import AIFF
from mutagen.flac import FLAC
from mutagen.mp3 import MP3
from mutagen.oggflac import OggFLAC
from mutagen.oggopus import OggOpus
from mutagen.oggspeex import OggSpeex
from mutagen.oggvorbis import OggVorbis
from mutagen.wave import WAVE

MILLISECOND = Decimal("0.001")
_MUTAGEN = {"wav": [WAVE], "aiff": [AIFF], "flac": [FLAC], "mp3": [MP3],
            "ogg": [OggVorbis, OggOpus, OggFLAC, OggSpeex], "opus": [OggOpus]}


@dataclass(frozen=True)
class ClipHeader:
    seconds: Decimal
    fps: Decimal | None = None  # the video track's own frame rate, where the header has it


def seconds_of(value: float | Decimal) -> Decimal:
    """A length in whole milliseconds, rounded up: never shorter than the clip."""
    return Decimal(str(value)).quantize(MILLISECOND, rounding=ROUND_CEILING)


def clip_header_read(data: bytes, container: str) -> ClipHeader | None:
    """The length the clip's container states, or None where it states none we can read.
    `container` is what the bytes were sniffed as."""
    try:
        if container in ("mp4", "m4a", "mov"):
            return _bmff(data)
        if container in ("webm", "mkv"):
            return _ebml(data)
        readers = _MUTAGEN.get(container)
        if readers is None:
            return None
        found = MutagenFile(io.BytesIO(data), options=readers)
        # Not `if found`: a file object with no tags is falsy.
        length = getattr(found.info, "length", 0) if found is not None else 0
        return ClipHeader(seconds_of(length)) if _positive(length) else None
    except Exception:  # hostile or damaged bytes: the clip is sized from its bytes instead
        return None


def _positive(value: object) -> bool:
    """A length a header may state: a finite number above 0 (a float header field can hold
    NaN or infinity, which no comparison or price can use)."""
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def clip_seconds_estimated(size: int, kbps: Decimal) -> Decimal:
    """A clip's length from its byte size at a floor bitrate."""
    return (Decimal(size * 8) / (kbps * 1000)).quantize(MILLISECOND, rounding=ROUND_CEILING)


# ISO BMFF (MP4, MOV, M4A) ----------------------------------------------------------------

def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of each box in data[start:end]; stops at the first
    box that runs past the end (a truncated file)."""
    pos = start
    while pos + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if size == 1:
            if pos + 16 > end:
                return
            size = struct.unpack_from(">Q", data, pos + 8)[0]
            header = 16
        elif size == 0:
            size = end - pos
        if size < header or pos + size > end:
            return
        yield kind, pos + header, pos + size
        pos += size


def _child(data: bytes, start: int, end: int, path: tuple[bytes, ...]) -> tuple[int, int] | None:
    for kind, body, stop in _boxes(data, start, end):
        if kind == path[0]:
            return (body, stop) if len(path) == 1 else _child(data, body, stop, path[1:])
    return None


def _timescale_duration(data: bytes, body: int) -> tuple[int, int]:
    """mvhd, mdhd and mehd share this layout: version 1 has 64-bit times."""
    if data[body] == 1:
        return struct.unpack_from(">IQ", data, body + 20)
    return struct.unpack_from(">II", data, body + 12)


def _bmff(data: bytes) -> ClipHeader | None:
    moov = _child(data, 0, len(data), (b"moov",))
    if moov is None:
        return None
    mvhd = _child(data, *moov, (b"mvhd",))
    if mvhd is None:
        return None
    timescale, duration = _timescale_duration(data, mvhd[0])
    if duration in (0, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
        # A fragmented file leaves mvhd empty; mehd carries the whole length, if anything.
        mehd = _child(data, *moov, (b"mvex", b"mehd"))
        if mehd is None:
            return None
        body = mehd[0]
        duration = struct.unpack_from(">Q" if data[body] == 1 else ">I", data, body + 4)[0]
    if not timescale or not duration:
        return None
    return ClipHeader(seconds_of(Decimal(duration) / timescale), _bmff_video_fps(data, moov))


def _bmff_video_fps(data: bytes, moov: tuple[int, int]) -> Decimal | None:
    for kind, body, stop in _boxes(data, *moov):
        if kind != b"trak":
            continue
        hdlr = _child(data, body, stop, (b"mdia", b"hdlr"))
        if hdlr is None or data[hdlr[0] + 8:hdlr[0] + 12] != b"vide":
            continue
        mdhd = _child(data, body, stop, (b"mdia", b"mdhd"))
        stts = _child(data, body, stop, (b"mdia", b"minf", b"stbl", b"stts"))
        if mdhd is None or stts is None:
            return None
        timescale, duration = _timescale_duration(data, mdhd[0])
        (entries,) = struct.unpack_from(">I", data, stts[0] + 4)
        samples = sum(struct.unpack_from(">I", data, stts[0] + 8 + 8 * i)[0]
                      for i in range(min(entries, (stts[1] - stts[0] - 8) // 8)))
        if not (timescale and duration and samples):
            return None
        return Decimal(samples * timescale) / Decimal(duration)
    return None


# EBML (WebM, Matroska) ---------------------------------------------------------------------

_SEGMENT, _INFO, _TRACKS, _CLUSTER = 0x18538067, 0x1549A966, 0x1654AE6B, 0x1F43B675
_TIMECODE_SCALE, _DURATION = 0x2AD7B1, 0x4489
_TRACK_ENTRY, _TRACK_TYPE, _DEFAULT_DURATION = 0xAE, 0x83, 0x23E383
_UNKNOWN = -1


def _vint(data: bytes, pos: int, *, marker: bool) -> tuple[int, int]:
    """A variable-length integer at pos: (value, length). IDs keep their marker bit; sizes
    drop it, and an all-ones size means "unknown" (a live stream)."""
    first = data[pos]
    if first == 0:
        raise ValueError("no EBML length marker")
    length = 9 - first.bit_length()
    if len(data) < pos + length:
        raise ValueError("truncated EBML number")
    value = int.from_bytes(data[pos:pos + length], "big")
    if marker:
        return value, length
    value &= (1 << (7 * length)) - 1
    return (_UNKNOWN if value == (1 << (7 * length)) - 1 else value), length


def _elements(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(id, payload start, payload end) of each element in data[start:end]."""
    pos = start
    while pos < end:
        element, id_length = _vint(data, pos, marker=True)
        size, size_length = _vint(data, pos + id_length, marker=False)
        body = pos + id_length + size_length
        stop = end if size == _UNKNOWN else min(body + size, end)
        yield element, body, stop
        if size == _UNKNOWN:
            return
        pos = stop


def _uint(data: bytes, start: int, end: int) -> int:
    return int.from_bytes(data[start:end], "big")


def _ebml(data: bytes) -> ClipHeader | None:
    scale, duration, fps = 1_000_000, None, None
    for element, body, stop in _elements(data, 0, len(data)):
        if element != _SEGMENT:
            continue
        for child, start, end in _elements(data, body, stop):
            if child == _INFO:
                for item, s, e in _elements(data, start, end):
                    if item == _TIMECODE_SCALE:
                        scale = _uint(data, s, e)
                    elif item == _DURATION and e - s in (4, 8):
                        duration = struct.unpack(">f" if e - s == 4 else ">d", data[s:e])[0]
            elif child == _TRACKS:
                fps = _ebml_video_fps(data, start, end)
            elif child == _CLUSTER:
                break  # media data: Info and Tracks come before it
        break
    if not _positive(duration) or not scale:
        return None
    return ClipHeader(seconds_of(Decimal(repr(duration)) * scale / Decimal(10**9)), fps)


def _ebml_video_fps(data: bytes, start: int, end: int) -> Decimal | None:
    for element, body, stop in _elements(data, start, end):
        if element != _TRACK_ENTRY:
            continue
        kind, per_frame_ns = None, None
        for item, s, e in _elements(data, body, stop):
            if item == _TRACK_TYPE:
                kind = _uint(data, s, e)
            elif item == _DEFAULT_DURATION:
                per_frame_ns = _uint(data, s, e)
        if kind == 1:  # video
            return Decimal(10**9) / per_frame_ns if per_frame_ns else None
    return None
