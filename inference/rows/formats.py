"""Media formats: the reference's allowlist, the names a format goes by (a format field, a
data: media type, a file extension, a Content-Type) and recognising one from its first bytes.

Formats are named canonically: jpeg not jpg, tiff not tif, aiff not aif. A name we know but
do not take (wma, heic, flv...) is kept as is, so the refusal can name it.
"""

from __future__ import annotations

import struct

# The reference's "Supported formats". These are containers: the codec inside is checked
# at serving time, not here.
SUPPORTED: dict[str, tuple[str, ...]] = {
    "image": ("png", "jpeg", "webp", "gif", "bmp", "tiff"),
    "audio": ("wav", "mp3", "m4a", "aac", "ogg", "opus", "flac", "aiff"),
    "video": ("mp4", "webm", "mov", "mkv", "avi"),
}

# Containers that hold the same bytes under different names: an inline clip sniffed as one
# member of a family does not contradict a declared sibling (an .m4a is an MP4 file).
_FAMILY = {"mp4": "bmff", "m4a": "bmff", "mov": "bmff", "webm": "ebml", "mkv": "ebml",
           "ogg": "ogg", "opus": "ogg"}

# File extensions and input_audio.format values. Anything not listed here, supported or
# not, is "no file extension" (a URL like /v1.2/clip or /watch.php says nothing).
_NAMES = {
    "png": "png", "jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "webp": "webp", "gif": "gif",
    "bmp": "bmp", "tif": "tiff", "tiff": "tiff",
    "wav": "wav", "wave": "wav", "mp3": "mp3", "m4a": "m4a", "aac": "aac", "ogg": "ogg",
    "oga": "ogg", "opus": "opus", "flac": "flac", "aif": "aiff", "aiff": "aiff",
    "aifc": "aiff",
    "mp4": "mp4", "m4v": "mp4", "webm": "webm", "mov": "mov", "qt": "mov", "mkv": "mkv",
    "avi": "avi",
    # Known, and off the allowlist.
    "wma": "wma", "wmv": "wmv", "asf": "asf", "flv": "flv", "f4v": "f4v", "heic": "heic",
    "heif": "heif", "avif": "avif", "svg": "svg", "ico": "ico", "psd": "psd", "jxl": "jxl",
    "jp2": "jp2", "mpg": "mpeg", "mpeg": "mpeg", "3gp": "3gp", "3g2": "3g2", "ts": "ts",
    "m2ts": "m2ts", "mts": "m2ts", "vob": "vob", "ogv": "ogv", "mka": "mka", "weba": "weba",
    "amr": "amr", "ape": "ape", "ac3": "ac3", "dts": "dts", "caf": "caf", "mid": "midi",
    "midi": "midi", "ra": "ra", "rm": "rm",
}

# data: media types and Content-Type answers. An unknown type is refused by its own name.
_MEDIA_TYPES = {
    "image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/pjpeg": "jpeg",
    "image/webp": "webp", "image/gif": "gif", "image/bmp": "bmp", "image/x-bmp": "bmp",
    "image/x-ms-bmp": "bmp", "image/tiff": "tiff",
    "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/mpeg3": "mp3", "audio/x-mpeg-3": "mp3",
    "audio/mp4": "m4a", "audio/x-m4a": "m4a", "audio/m4a": "m4a", "audio/aac": "aac",
    "audio/x-aac": "aac", "audio/aacp": "aac", "audio/ogg": "ogg", "audio/vorbis": "ogg",
    "audio/opus": "opus", "audio/flac": "flac", "audio/x-flac": "flac", "audio/aiff": "aiff",
    "audio/x-aiff": "aiff",
    "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov",
    "video/x-matroska": "mkv", "video/matroska": "mkv", "video/x-msvideo": "avi",
    "video/avi": "avi", "video/msvideo": "avi",
    "audio/x-ms-wma": "wma", "video/x-ms-wmv": "wmv", "video/x-ms-asf": "asf",
    "video/x-flv": "flv", "image/heic": "heic", "image/heif": "heif", "image/avif": "avif",
    "image/svg+xml": "svg", "video/mpeg": "mpeg", "video/3gpp": "3gp", "audio/amr": "amr",
    "video/mp2t": "ts", "audio/webm": "weba",
}
UNTYPED = "application/octet-stream"


def format_in(modality: str, name: str) -> str:
    """A format as the modality sees it: an audio part in an MP4 container is an m4a."""
    if modality == "audio" and name == "mp4":
        return "m4a"
    return name


def format_from_name(name: str) -> str | None:
    """input_audio.format: a bare format name."""
    return _NAMES.get(name.strip().lower())


def format_from_extension(url: str) -> str | None:
    """The file extension on a URL's path (the query and fragment do not count), when it is
    one we know; None means the URL has no file extension to go by."""
    path = url.split("#", 1)[0].split("?", 1)[0]
    last = path.rsplit("/", 1)[-1]
    if "." not in last:
        return None
    return _NAMES.get(last.rsplit(".", 1)[-1].lower())


def format_from_media_type(media_type: str) -> str:
    """A data: media type or a Content-Type answer, parameters dropped. An unknown type is
    returned as itself, so the refusal names what was sent."""
    bare = media_type.split(";", 1)[0].strip().lower()
    return _MEDIA_TYPES.get(bare, bare)


def same_container(declared: str, sniffed: str) -> bool:
    return _FAMILY.get(declared, declared) == _FAMILY.get(sniffed, sniffed)


def sniff(head: bytes) -> str | None:
    """The format the first bytes of a file announce, or None when they announce nothing we
    recognise (which alone is not a contradiction)."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if head.startswith(b"RIFF") and len(head) >= 12:
        return {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}.get(head[8:12])
    if head.startswith(b"FORM") and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "opus" if head[28:36] == b"OpusHead" else "ogg"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm" if b"webm" in head[:64] else "mkv"
    if head.startswith(b"\x30\x26\xb2\x75\x8e\x66\xcf\x11"):
        return "asf"  # the WMA/WMV container
    if head[4:8] == b"ftyp":
        return _bmff_brand(head[8:12])
    if head[4:8] in (b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"):
        return "mov"  # a QuickTime file from before ftyp existed
    if head.startswith(b"BM") and head[6:10] == b"\x00\x00\x00\x00":
        return "bmp"  # "BM" alone is too common; the header's reserved bytes are zero
    return _mpeg_audio(head)


def _bmff_brand(brand: bytes) -> str:
    if brand == b"qt  ":
        return "mov"
    if brand in (b"M4A ", b"M4B ", b"M4P "):
        return "m4a"
    if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
        return "heic"
    if brand in (b"avif", b"avis"):
        return "avif"
    if brand.startswith(b"3g"):
        return "3gp"
    return "mp4"


def _mpeg_audio(head: bytes) -> str | None:
    start = 0
    if head.startswith(b"ID3") and len(head) >= 10:
        # An ID3v2 tag leads the stream; its size is four 7-bit bytes.
        size = 0
        for byte in struct.unpack_from("4B", head, 6):
            size = (size << 7) | (byte & 0x7F)
        start = 10 + size
        if len(head) < start + 2:
            return "mp3"  # the tag outgrew what we decoded: ID3 is an MP3 tag
    frame = head[start:start + 2]
    if len(frame) < 2 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:
        return None
    # ADTS (AAC) and MPEG audio share the sync word; ADTS has layer bits 00.
    return "aac" if frame[1] & 0x06 == 0 else "mp3"
