"""Media bytes decoded by the product (issue 41), bounded, into what an engine takes
(inference.engines.media): pictures with Pillow, sound to the model's rate (PCM WAV with the
standard library, every other container with PyAV), video frames with OpenCV's FFmpeg.

Every decoder here reads a customer's bytes, so each is bounded before it allocates: a
picture's pixels are judged from its header before it is decoded (a decompression bomb
declares its size), a clip is read no further than the seconds it was billed for, and a
video no further than the frames it was billed for. Frames are shrunk to FRAME_MAX_PIXELS:
past that no model's per-frame budget reads more detail, and 780 full-HD frames (a
qwen3.8-27b row at 20 fps) would take 4.8 GB. A failure raises Undecodable, whose message
says what was wrong in words a customer can act on; a decoder's own exception from hostile
bytes is one too (never a chunk's failure). The libraries are imported on first use: the
web tier imports the kinds, and never decodes.
"""

from __future__ import annotations

import io
import math
import warnings
import wave
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

from inference.engines.media import DecodedAudio, DecodedImage, DecodedVideo
from inference.rows.formats import SUPPORTED

if TYPE_CHECKING:
    import cv2
    import numpy as np
    from PIL import Image

# Pillow's names for the reference's image formats ("Supported formats"): only these
# decoders are offered the bytes, so a file in any other format Pillow reads (EPS, which
# runs Ghostscript; ICNS; PSD) is refused, whatever it claims to be.
PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP",
                  "tiff": "TIFF"}
# The most pixels a picture may declare: 8,000 x 5,000, 120 MB decoded. A larger header is
# refused before one pixel is decoded.
MAX_IMAGE_PIXELS = 40_000_000
# A sampled video frame is shrunk to at most this many pixels (1,280 x 720 is kept whole).
FRAME_MAX_PIXELS = 1_048_576
# A clip's own frame rate is read from its container; a container claiming more than this
# is not believed when the frames to read are bounded.
MAX_SOURCE_FPS = 240
_EPSILON = 1e-6
# The resampler's filter: zero crossings of the sinc on each side, and output samples
# computed at once.
RESAMPLE_ZEROS = 16
RESAMPLE_BLOCK = 8192
_PCM = 1  # a WAV's integer PCM format tag


class Undecodable(Exception):
    """The bytes are not media of the part's modality that this product decodes; the
    message is safe to show the customer (it names no byte of the file)."""


class DecoderMissing(Exception):
    """This worker lacks the library a container needs (PyAV): the deployment's fault,
    never the row's."""


def image_decode(data: bytes) -> DecodedImage:
    """One picture as RGB at its own size; the first frame of an animated GIF or WebP."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns past its own limit and refuses past twice it: both are ours here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(data), formats=list(PILLOW_FORMATS.values()))
            width, height = picture.size
            if width * height > MAX_IMAGE_PIXELS:
                raise Undecodable(
                    f"the image is {width:,} x {height:,} pixels, over the "
                    f"{MAX_IMAGE_PIXELS:,}-pixel limit; send a smaller picture")
            picture.seek(0)
            picture.load()
            return DecodedImage(_rgb(picture))
    except Undecodable:
        raise
    except UnidentifiedImageError:
        raise Undecodable(f"the bytes are not an image in a supported format "
                          f"({', '.join(SUPPORTED['image'])})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise Undecodable(f"the image declares more than {MAX_IMAGE_PIXELS:,} pixels") \
            from None
    except Exception:  # a damaged or hostile file, in whatever way the decoder noticed
        raise Undecodable("the image is damaged or truncated and could not be decoded") \
            from None


def _rgb(picture: Image.Image) -> Image.Image:
    """RGB, transparency laid on white (a model reads no alpha, and a transparent pixel's
    hidden colour is often black)."""
    from PIL import Image

    if picture.mode == "RGB":
        return picture
    if picture.mode in ("RGBA", "LA", "PA") or "transparency" in picture.info:
        rgba = picture.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return picture.convert("RGB")


# -- audio ---------------------------------------------------------------------------------

def audio_decode(data: bytes, *, rate: int, max_seconds: float) -> DecodedAudio:
    """The clip's sound, mono float32 in [-1, 1] at `rate` Hz, at most `max_seconds` of it
    (the length it was billed at: a longer clip is cut there)."""
    try:
        if data[:4] == b"RIFF" and data[8:12] == b"WAVE" and _wav_format(data) == _PCM:
            try:
                samples, native = _wav(data, max_seconds)
            except (wave.Error, EOFError):
                raise Undecodable("the WAV file is damaged and could not be decoded") \
                    from None
            return DecodedAudio(_resampled(samples, native, rate), rate)
        # Any other container, or a WAV of floats or extensible PCM, which the standard
        # library does not read.
        return DecodedAudio(_pyav_audio(data, rate, max_seconds), rate)
    except (Undecodable, DecoderMissing):
        raise
    except Exception:
        raise Undecodable("the audio is damaged or not in a supported format and could "
                          "not be decoded") from None


def _wav_format(data: bytes) -> int | None:
    """The format tag of a WAV's fmt chunk (1: integer PCM), or None without one."""
    position = 12
    while position + 8 <= len(data):
        kind, size = data[position:position + 4], int.from_bytes(data[position + 4:position + 8],
                                                                 "little")
        if kind == b"fmt ":
            return int.from_bytes(data[position + 8:position + 10], "little") \
                if size >= 2 and position + 10 <= len(data) else None
        position += 8 + size + (size & 1)  # chunks are padded to an even length
    return None


def _wav(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    import numpy as np

    with wave.open(io.BytesIO(data), "rb") as clip:
        channels, width, native = clip.getnchannels(), clip.getsampwidth(), clip.getframerate()
        if not channels or not native or width not in (1, 2, 3, 4):
            raise Undecodable("the WAV file's header describes no sound we can read")
        frames = clip.readframes(min(clip.getnframes(), math.ceil(max_seconds * native)))
    raw = np.frombuffer(frames[:len(frames) // (width * channels) * width * channels],
                        dtype=np.uint8)
    if width == 1:  # 8-bit WAV is unsigned
        values = raw.astype(np.float32) / 128.0 - 1.0
    elif width == 3:  # 24-bit: widened to 32 with the sign in the top byte
        triples = raw.reshape(-1, 3).astype(np.int32)
        joined = triples[:, 0] << 8 | triples[:, 1] << 16 | triples[:, 2] << 24
        values = joined.astype(np.float32) / 2.0**31
    else:
        values = np.frombuffer(raw.tobytes(), dtype=f"<i{width}").astype(np.float32) \
            / float(2 ** (8 * width - 1))
    return values.reshape(-1, channels).mean(axis=1, dtype=np.float32), native


def _resampled(samples: np.ndarray, native: int, rate: int) -> np.ndarray:
    """To the model's rate, band-limited: each output sample a Hann-windowed sinc over the
    input around it, cut off below the lower rate's Nyquist frequency (a plain
    interpolation folds the highs a downsampling drops into what the model hears). The
    rates' ratio is a fraction up/down, so an output sample falls at one of `up` offsets
    between two input samples: one filter per offset, made once (polyphase), and the clip
    worked through in blocks of a few MB."""
    import numpy as np

    if native == rate or not len(samples):
        return np.ascontiguousarray(samples, dtype=np.float32)
    ratio = Fraction(rate, native)
    up, down = ratio.numerator, ratio.denominator
    cutoff = min(1.0, rate / native)  # of the input's Nyquist frequency
    width = math.ceil(RESAMPLE_ZEROS / cutoff)  # input samples on each side
    offsets = np.arange(-width + 1, width + 1)
    distance = offsets[None, :] - (np.arange(up) / up)[:, None]
    bank = (cutoff * np.sinc(cutoff * distance)
            * (0.5 + 0.5 * np.cos(np.pi * np.clip(distance / width, -1.0, 1.0)))
            ).astype(np.float32)
    source = np.pad(samples.astype(np.float32), (width, width + 1))
    count = len(samples) * up // down
    out = np.empty(count, dtype=np.float32)
    for start in range(0, count, RESAMPLE_BLOCK):
        position = np.arange(start, min(start + RESAMPLE_BLOCK, count)) * down
        base, phase = np.divmod(position, up)
        window = source[base[:, None] + (offsets + width)[None, :]]
        out[start:start + len(position)] = np.einsum("ij,ij->i", window, bank[phase])
    return np.clip(out, -1.0, 1.0)


def _pyav_audio(data: bytes, rate: int, max_seconds: float) -> np.ndarray:
    """Every audio container but PCM WAV: PyAV decodes and resamples to mono `rate`."""
    try:
        import av
    except ImportError:
        raise DecoderMissing("PyAV (av) is not installed on this worker") from None
    import numpy as np

    wanted = math.ceil(max_seconds * rate)
    pieces: list[np.ndarray] = []
    held = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise Undecodable("the file holds no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    piece = out.to_ndarray().reshape(-1)
                    pieces.append(piece)
                    held += len(piece)
                if held >= wanted:
                    break
            else:
                for out in resampler.resample(None):  # what the resampler still holds
                    pieces.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError:
        raise Undecodable("the audio is damaged or not in a supported format and could "
                          "not be decoded") from None
    if not pieces:
        raise Undecodable("the audio holds no sound")
    return np.clip(np.concatenate(pieces)[:wanted], -1.0, 1.0).astype(np.float32)


# -- video ---------------------------------------------------------------------------------

def video_decode(data: bytes, *, fps: float, max_seconds: float,
                 max_frames: int) -> DecodedVideo:
    """Frames sampled at `fps` from the start, as the reference bills them: one at each
    k / fps for k = 0 .. ceil(seconds x fps), the last at the clip's end, where seconds is
    the clip's length up to `max_seconds` (what it was billed at); never more than
    `max_frames`, and never a frame twice (a clip shot slower than `fps` gives its own)."""
    try:
        return _opencv_video(data, fps, max_seconds, max_frames)
    except Undecodable:
        raise
    except Exception:
        raise Undecodable("the video is damaged or not in a supported format and could "
                          "not be decoded") from None


def _opencv_video(data: bytes, fps: float, max_seconds: float,
                  max_frames: int) -> DecodedVideo:
    import cv2

    # Read from memory (OpenCV 4.11's stream source: any object with read and seek; its
    # stub names a class the binding does not require), never from a file of ours. The
    # binding keeps no reference to the stream: held here until the capture is released.
    stream = io.BytesIO(data)
    capture = cv2.VideoCapture(cast(Any, stream), cv2.CAP_FFMPEG, [])
    try:
        if not capture.isOpened():
            raise Undecodable("the video is damaged or not in a supported format and could "
                              "not be decoded")
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width * height > MAX_IMAGE_PIXELS:
            raise Undecodable(f"the video's frames are {width:,} x {height:,} pixels, over "
                              f"the {MAX_IMAGE_PIXELS:,}-pixel limit")
        native = capture.get(cv2.CAP_PROP_FPS)
        if 0 < native < fps:
            fps = native  # sampling finds no frames a clip was not shot with
        frames: list[Image.Image] = []
        taken = last = -1  # the source frames last sampled and last read within the bound
        last_time = 0.0
        step = 1.0 / fps
        due = 0.0  # the next sample's time
        # Bounds the frames read, not only those kept: a container may hold frames at any
        # rate, and each one read is decoded.
        most_read = math.ceil(max_seconds * MAX_SOURCE_FPS) + 2
        while len(frames) < max_frames and last + 1 < most_read and capture.grab():
            at = max(capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0, 0.0)
            if at > max_seconds + _EPSILON:
                break
            last, last_time = last + 1, at
            if at + _EPSILON >= due:
                frames.append(_frame(capture))
                taken = last
                while due <= at + _EPSILON:
                    due += step
        # The reference's last sample falls at or past the clip's end: its last frame.
        end = min(last_time, max_seconds)
        wanted = min(math.ceil(end * fps - _EPSILON) + 1, max_frames)
        if last > taken >= 0 and len(frames) < wanted:
            capture.set(cv2.CAP_PROP_POS_FRAMES, last)
            if capture.grab():
                frames.append(_frame(capture))
        if not frames:
            raise Undecodable("the video holds no frame that could be decoded")
        return DecodedVideo(frames=tuple(frames), fps=fps, seconds=end)
    finally:
        capture.release()
        stream.close()


def _frame(capture: cv2.VideoCapture) -> Image.Image:
    import cv2
    from PIL import Image

    ok, bgr = capture.retrieve()
    if not ok:
        raise Undecodable("a frame of the video could not be decoded")
    picture = Image.fromarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    pixels = picture.width * picture.height
    if pixels > FRAME_MAX_PIXELS:
        scale = math.sqrt(FRAME_MAX_PIXELS / pixels)
        picture = picture.resize((max(1, int(picture.width * scale)),
                                  max(1, int(picture.height * scale))), Image.Resampling.BILINEAR)
    return picture


def decoded_bytes(value: DecodedImage | DecodedAudio | DecodedVideo) -> int:
    """The memory a decoded value holds, near enough to bound a chunk's by."""
    if isinstance(value, DecodedImage):
        return _picture_bytes(value.image)
    if isinstance(value, DecodedAudio):
        return int(value.samples.nbytes)
    return sum(_picture_bytes(frame) for frame in value.frames)


def _picture_bytes(picture: Image.Image) -> int:
    return picture.width * picture.height * len(picture.getbands())
