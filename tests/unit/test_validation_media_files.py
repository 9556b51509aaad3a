"""Real (tiny) media files built byte by byte, and the checker's readers run on them: the
sniffer, the ISO BMFF and EBML duration parsers, and mutagen for the audio headers. The
other validation tests import these builders."""

from __future__ import annotations

import base64
import struct
import zlib
from decimal import Decimal

import pytest

from inference.rows.durations import ClipHeader, clip_header_read, clip_seconds_estimated
from inference.rows.formats import (
    format_from_extension,
    format_from_media_type,
    same_container,
    sniff,
)

# ISO BMFF (MP4 / MOV / M4A) -------------------------------------------------------------


def box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def mp4_bytes(seconds: float, *, brand: bytes = b"isom", fps: int | None = None,
              mdat: int = 0, version: int = 0) -> bytes:
    """ftyp + moov(mvhd [+ one video trak sampled at fps]) [+ mdat of filler]."""
    timescale = 1000
    duration = round(seconds * timescale)
    if version == 1:
        mvhd = struct.pack(">B3xQQIQ", 1, 0, 0, timescale, duration)
    else:
        mvhd = struct.pack(">B3xIIII", 0, 0, 0, timescale, duration)
    mvhd += struct.pack(">IH10x36x24xI", 0x00010000, 0x0100, 2)
    moov = box(b"mvhd", mvhd)
    if fps is not None:
        track_scale = 90_000
        frames = round(seconds * fps)
        mdhd = struct.pack(">B3xIIIIHH", 0, 0, 0, track_scale, round(seconds * track_scale),
                           0x55C4, 0)
        hdlr = struct.pack(">B3xI4s12x", 0, 0, b"vide") + b"video\x00"
        stts = struct.pack(">B3xIII", 0, 1, frames, track_scale // fps)
        stbl = box(b"stbl", box(b"stts", stts))
        mdia = box(b"mdia", box(b"mdhd", mdhd) + box(b"hdlr", hdlr)
                   + box(b"minf", stbl))
        moov += box(b"trak", mdia)
    ftyp = box(b"ftyp", brand + struct.pack(">I", 0x200) + brand + b"mp41")
    return ftyp + box(b"moov", moov) + (box(b"mdat", bytes(mdat)) if mdat else b"")


def fragmented_mp4_bytes(seconds: int) -> bytes:
    """A fragmented MP4: mvhd says 0, moov/mvex/mehd carries the whole length."""
    mvhd = struct.pack(">B3xIIII", 0, 0, 0, 1000, 0) + bytes(80)
    mehd = struct.pack(">B3xI", 0, seconds * 1000)
    moov = box(b"mvhd", mvhd) + box(b"mvex", box(b"mehd", mehd))
    return box(b"ftyp", b"iso5\x00\x00\x02\x00") + box(b"moov", moov)


def largesize_mp4_bytes(seconds: int) -> bytes:
    """The moov written with a 64-bit size field (size 1, then the real size)."""
    moov_body = box(b"mvhd", struct.pack(">B3xIIII", 0, 0, 0, 600, seconds * 600)
                    + bytes(80))
    moov = struct.pack(">I4sQ", 1, b"moov", 16 + len(moov_body)) + moov_body
    return box(b"ftyp", b"isom\x00\x00\x02\x00") + moov


# EBML (WebM / Matroska) -------------------------------------------------------------------


def element(element_id: int, payload: bytes) -> bytes:
    raw_id = element_id.to_bytes((element_id.bit_length() + 7) // 8, "big")
    return raw_id + b"\x01" + len(payload).to_bytes(7, "big") + payload


def webm_bytes(seconds: float, *, doc_type: str = "webm", fps: int | None = None) -> bytes:
    header = element(0x1A45DFA3, element(0x4282, doc_type.encode()))
    info = element(0x1549A966, element(0x2AD7B1, (1_000_000).to_bytes(3, "big"))
                   + element(0x4489, struct.pack(">d", seconds * 1000)))
    segment = info
    if fps is not None:
        entry = element(0xAE, element(0x83, b"\x01")
                        + element(0x23E383, (10**9 // fps).to_bytes(4, "big")))
        segment += element(0x1654AE6B, entry)
    segment += element(0x1F43B675, b"\x00" * 16)  # a cluster: media data follows
    return header + element(0x18538067, segment)


# Audio and images --------------------------------------------------------------------------


def wav_bytes(seconds: float, *, rate: int = 8000) -> bytes:
    """8-bit mono PCM: `rate` bytes a second."""
    data = bytes(round(seconds * rate))
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt \
        + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def flac_bytes(seconds: float, *, rate: int = 16000) -> bytes:
    samples = round(seconds * rate)
    # STREAMINFO: block sizes, frame sizes, then rate(20) channels-1(3) bits-1(5) samples(36).
    packed = (rate << 44) | (0 << 41) | (15 << 36) | samples
    info = struct.pack(">HH3s3s", 4096, 4096, b"\x00\x00\x00", b"\x00\x00\x00") \
        + packed.to_bytes(8, "big") + bytes(16)
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


def png_bytes() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data \
            + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) \
        + chunk(b"IEND", b"")


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + bytes(32)
MP3_FRAME = b"\xff\xfb\x90\x64" + bytes(413)  # MPEG-1 Layer III, 128 kbit/s, 44.1 kHz
ADTS = b"\xff\xf1\x50\x80"  # the start of an ADTS (AAC) frame header
AVI = b"RIFF\x00\x00\x00\x00AVI LIST"
WMA = b"\x30\x26\xb2\x75\x8e\x66\xcf\x11\xa6\xd9\x00\xaa\x00\x62\xce\x6c"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64(data)}"


# The readers -------------------------------------------------------------------------------


@pytest.mark.parametrize("data,expected", [
    (png_bytes(), "png"), (JPEG, "jpeg"), (b"GIF89a" + bytes(8), "gif"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "webp"), (b"BM" + bytes(20), "bmp"),
    (b"II*\x00" + bytes(8), "tiff"), (wav_bytes(0.1), "wav"), (AVI, "avi"),
    (b"FORM\x00\x00\x00\x00AIFF", "aiff"), (flac_bytes(1), "flac"),
    (b"OggS" + bytes(24) + b"OpusHead", "opus"), (b"OggS" + bytes(24) + b"\x01vorbis", "ogg"),
    (MP3_FRAME, "mp3"), (b"ID3\x03\x00\x00\x00\x00\x00\x00" + MP3_FRAME, "mp3"),
    (ADTS + bytes(8), "aac"), (mp4_bytes(1), "mp4"), (mp4_bytes(1, brand=b"qt  "), "mov"),
    (mp4_bytes(1, brand=b"M4A "), "m4a"), (webm_bytes(1), "webm"),
    (box(b"ftyp", b"heic"), "heic"), (box(b"ftyp", b"avif"), "avif"),
    (box(b"ftyp", b"3gp5"), "3gp"), (box(b"moov", b""), "mov"),
    (b"ID3\x03\x00\x00\x00\x7f\x7f\x7f", "mp3"),  # a tag longer than the bytes seen
    (webm_bytes(1, doc_type="matroska"), "mkv"), (WMA, "asf"), (b"hello world", None),
])
def test_first_bytes_name_the_format(data: bytes, expected: str | None) -> None:
    assert sniff(data) == expected


@pytest.mark.parametrize("url,expected", [
    ("https://e.com/a/clip.MP4?sig=x.y", "mp4"), ("https://e.com/photo.jpg#top", "jpeg"),
    ("https://e.com/song.wma", "wma"), ("https://e.com/v1.2/clip", None),
    ("https://e.com/watch.php", None), ("https://e.com/a.tif", "tiff"),
])
def test_a_url_extension_counts_only_when_it_names_a_media_format(
        url: str, expected: str | None) -> None:
    assert format_from_extension(url) == expected


def test_media_types_drop_parameters_and_keep_unknown_names() -> None:
    assert format_from_media_type("Audio/MPEG; charset=binary") == "mp3"
    assert format_from_media_type("image/x-unknown") == "image/x-unknown"


def test_sibling_containers_do_not_contradict_each_other() -> None:
    assert same_container("m4a", "mp4") and same_container("mkv", "webm")
    assert not same_container("wav", "avi")


@pytest.mark.parametrize("data,container,seconds,fps", [
    (mp4_bytes(45), "mp4", "45", None),
    (mp4_bytes(12.5, version=1), "mp4", "12.5", None),
    (mp4_bytes(45, brand=b"qt  ", fps=12), "mov", "45", "12"),
    (mp4_bytes(3, brand=b"M4A "), "m4a", "3", None),
    (webm_bytes(45.25, fps=25), "webm", "45.25", "25"),
    (webm_bytes(7, doc_type="matroska"), "mkv", "7", None),
    (wav_bytes(2.5), "wav", "2.5", None),
    (flac_bytes(4), "flac", "4", None),
    (fragmented_mp4_bytes(30), "mp4", "30", None),
    (largesize_mp4_bytes(9), "mp4", "9", None),
])
def test_clip_headers_are_read_exactly(data: bytes, container: str, seconds: str,
                                       fps: str | None) -> None:
    header = clip_header_read(data, container)
    assert header == ClipHeader(Decimal(seconds), Decimal(fps) if fps else None)


@pytest.mark.parametrize("data,container", [
    (AVI + bytes(100), "avi"),                   # the reference: AVI is estimated
    (ADTS + bytes(100), "aac"),
    (mp4_bytes(45)[:40], "mp4"),                 # truncated before the moov
    (mp4_bytes(0), "mp4"),                       # a fragmented file's empty mvhd
    (b"\x1a\x45\xdf\xa3\x00garbage", "webm"),
    (b"RIFF" + bytes(40), "wav"),
])
def test_unreadable_headers_give_no_length(data: bytes, container: str) -> None:
    assert clip_header_read(data, container) is None


def test_an_estimate_from_bytes_rounds_up_to_the_millisecond() -> None:
    assert clip_seconds_estimated(93_001, Decimal(24)) == Decimal("31.001")
