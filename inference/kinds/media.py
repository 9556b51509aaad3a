"""A chunk's media brought and decoded by the product before its rows reach the engine
(issue 41): vLLM never reads a customer's URL or bytes (inference.engines.media).

For each media part of a row (the kind says where they are: TaskKind.media_paths) the
bytes come from the row itself (a data: URI, input_audio's base64) or through the one
SSRF-safe fetcher (anex.net.fetch, for the job's organization), under the size cap the row
checks hold inline media to; then they are decoded (media_decode) no further than the row
was billed for: a clip's billed seconds, a video's billed frames at the job's rate. The
resolved part keeps the customer's keys and gains DECODED_KEY.

A part that cannot be brought or decoded fails its row alone: a download with the
reference's `media_fetch_error` (output-format.txt, "Media referenced by URL": error.code
the host's HTTP status), anything else with `invalid_request_error`, each naming the part
(`messages[0].content[1]`) in its message and param; the row is never billed (a failed row
bills nothing) and the other rows run. The reference caps a row at 4 images and 1 video
clip and refuses "the surplus ... at serving time": that is here too, with one audio clip.

Bounds. Downloads run on FETCHES_PER_CHUNK threads per chunk and FETCHES_PER_HOST per host
in the process (a worker runs several chunks at once), each under one deadline, retried
FETCH_ATTEMPTS times in all on what may pass (no reply, 408, 429, 5xx); a host that never
replied is not asked again in the chunk. The same URL in several rows is fetched once per
window. A chunk's rows reach the engine in windows of at most WINDOW_BYTES of decoded
media (a window holds one row at least), and a window's media are dropped once the engine
has answered its rows; a chunk of plain rows is one window, untouched.
"""

from __future__ import annotations

import binascii
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from anex.logsafe import exception_summary
from anex.net import FetchError, TooLarge, TooManyRedirects, UnsafeURL, fetch, url_mask
from inference.engines.media import DECODED_KEY, Decoded
from inference.engines.types import INVALID_REQUEST, RowError
from inference.kinds.media_decode import (
    DecoderMissing,
    Undecodable,
    audio_decode,
    decoded_bytes,
    image_decode,
    video_decode,
)
from inference.rows.core import (
    INLINE_ITEMS_PER_ROW,
    InputRejected,
    JobContext,
    JobOptions,
    RowKind,
    RowRef,
)
from inference.rows.media import MODALITY_OF, media_part
from inference.tokens import uncounted

if TYPE_CHECKING:
    from inference.catalog import CatalogModel
    from inference.kinds.base import InputRow, ServedJob
    from inference.rows.media import Media

logger = logging.getLogger(__name__)

FETCHES_PER_CHUNK = 8
FETCHES_PER_HOST = 4
FETCH_ATTEMPTS = 3
FETCH_RETRY_SECONDS = (0.5, 1.5)  # before the second and the third attempt, jittered
# One download, connect to last byte: a 50 MB clip at a modest 1 MB/s with room to spare.
FETCH_DEADLINE = 90.0
FETCH_REDIRECTS = 3  # object stores and CDNs answer a link with a redirect or two
# Answers that may not recur: a throttled, overloaded or restarting host.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
WINDOW_BYTES = 512 * 1024 * 1024
ROWS_AHEAD = 2 * FETCHES_PER_CHUNK  # rows whose media are being brought at once
MEDIA_FETCH_ERROR = "media_fetch_error"
INVALID_MEDIA = "invalid_media"
# A row's media part: where it sits in the body, ("messages", 0, "content", 1).
PartPath = tuple[str | int, ...]
_NOUN = {"image": "image", "audio": "audio clip", "video": "video clip"}


def media_context(job: ServedJob, model: CatalogModel | None,
                  kind: RowKind) -> JobContext | None:
    """The job as the row checks read it (`kind` the model's), to find each served part's
    billed length and tokens by the estimate's own rules (never refusing anew: no output
    cap, no text counted); None for a model that takes text only, whose rows carry no
    media."""
    if model is None or not set(model.modalities) - {"text"}:
        return None
    return JobContext(JobOptions(model=model.id, video_fps=job.video_fps), uncounted, None,
                      kind)


def part_where(path: PartPath) -> str:
    """("messages", 0, "content", 1) -> "messages[0].content[1]"."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


@dataclass
class Resolved:
    """One row as its engine request is built from: its body with every media part
    decoded, or the error that fails it alone."""

    body: dict[str, Any]
    error: RowError | None = None
    values: list[Decoded] = field(default_factory=list)


def media_windows(job: ServedJob, rows: Sequence[InputRow], *,
                  paths: Callable[[dict[str, Any]], list[PartPath]],
                  context: JobContext | None) -> Iterator[list[tuple[int, Resolved]]]:
    """The chunk's rows, resolved, in windows of at most WINDOW_BYTES of decoded media:
    (the row's position in `rows`, what it resolved to). Rows come in order."""
    if context is None:
        yield [(position, Resolved(row.body)) for position, row in enumerate(rows)]
        return
    chunk = _ChunkMedia(context, tenant=job.organization_id)
    try:
        yield from chunk.windows(rows, paths)
    finally:
        chunk.close()


# -- hosts ---------------------------------------------------------------------------------

class _HostSlots:
    """How many downloads each host has in this process, at most FETCHES_PER_HOST: the
    chunks a worker runs at once share a host's slots, so a job of one host's URLs meets it
    with a few connections, not one per row."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._changed = threading.Condition()

    @contextmanager
    def slot(self, host: str) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self._held.get(host, 0) < FETCHES_PER_HOST)
            self._held[host] = self._held.get(host, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                left = self._held[host] - 1
                if left:
                    self._held[host] = left
                else:
                    del self._held[host]
                self._changed.notify_all()


_HOSTS = _HostSlots()


@dataclass(frozen=True)
class _Failure:
    """Why a part failed, before it is put in the words of the part that met it."""

    type: str
    reason: str
    code: str | None = None
    status: int = 400

    def error(self, where: str, noun: str) -> RowError:
        return RowError(type=self.type, message=f"{where}: the {noun} {self.reason}",
                        code=self.code, param=where, status_code=self.status)


_Outcome = Decoded | _Failure


# -- a chunk -------------------------------------------------------------------------------

class _ChunkMedia:
    """One chunk's downloads and decodes: its threads, the window's memo of URLs already
    brought, the hosts that never replied."""

    def __init__(self, context: JobContext, *, tenant: Hashable) -> None:
        self.context = context
        self.tenant = tenant
        self.pool = ThreadPoolExecutor(max_workers=FETCHES_PER_CHUNK,
                                       thread_name_prefix="anex-media")
        self.memo: dict[tuple[str, str], Future[_Outcome]] = {}
        self.silent: dict[str, _Failure] = {}  # host -> its no-reply failure
        self.lock = threading.Lock()
        media = context.model.media
        self.rate = media.audio_sample_rate
        self.frame_tokens = media.video_frame_tokens or 1

    def close(self) -> None:
        # Downloads in flight end by their deadline; nothing waits for them.
        self.pool.shutdown(wait=False, cancel_futures=True)

    def windows(self, rows: Sequence[InputRow],
                paths: Callable[[dict[str, Any]], list[PartPath]]
                ) -> Iterator[list[tuple[int, Resolved]]]:
        ahead: deque[tuple[int, Callable[[], Resolved]]] = deque()
        upcoming = iter(enumerate(rows))
        window: list[tuple[int, Resolved]] = []
        held, counted = 0, set[int]()
        while True:
            while len(ahead) < ROWS_AHEAD:
                nxt = next(upcoming, None)
                if nxt is None:
                    break
                position, row = nxt
                ahead.append((position, self._row_started(row.body, paths(row.body))))
            if not ahead:
                break
            position, finish = ahead.popleft()
            resolved = finish()
            window.append((position, resolved))
            for value in resolved.values:
                if id(value) not in counted:  # one URL in several rows is held once
                    counted.add(id(value))
                    held += decoded_bytes(value)
            if held >= WINDOW_BYTES:
                yield window
                window, held, counted = [], 0, set()
                self.memo.clear()
        if window:
            yield window

    def _row_started(self, body: dict[str, Any],
                     paths: list[PartPath]) -> Callable[[], Resolved]:
        """The row's parts sent to be brought and decoded; what it returns waits for them."""
        if not paths:
            return lambda: Resolved(body)
        counts = dict.fromkeys(INLINE_ITEMS_PER_ROW, 0)
        started: list[tuple[PartPath, dict[str, Any], str, Future[_Outcome]]] = []
        for path in paths:
            part = _at(body, path)
            kind = str(part["type"])
            modality = MODALITY_OF[kind]
            where = part_where(path)
            counts[modality] += 1
            most = INLINE_ITEMS_PER_ROW[modality]
            if counts[modality] > most:
                # The reference: "at most 4 images and 1 video clip" a row, "the surplus is
                # refused at serving time". Refused before anything is brought.
                message = (f"{where}: a row takes at most {most} {_plural(modality, most)}; "
                           f"this is its {_ordinal(counts[modality])}. Send the others in "
                           "rows of their own.")
                surplus = _failed(body, RowError.invalid_request(message, code=INVALID_MEDIA,
                                                                 param=where))
                return lambda: surplus
            started.append((path, part, where, self._part_started(kind, part, where)))

        def finish() -> Resolved:
            resolved, values = body, []
            for path, part, where, future in started:
                outcome = future.result()
                if isinstance(outcome, _Failure):
                    return _failed(body, outcome.error(where, _NOUN[MODALITY_OF[part["type"]]]))
                values.append(outcome)
                resolved = _replaced(resolved, path, {**part, DECODED_KEY: outcome})
            return Resolved(resolved, values=values)

        return finish

    def _part_started(self, kind: str, part: dict[str, Any],
                      where: str) -> Future[_Outcome]:
        source = part.get(kind)
        if isinstance(source, dict) and str(source.get("url"))[:8].lower() == "https://":
            # A hosted part is decoded as its own fields say (its declared length); the
            # same URL and fields in another row of the window are that one's twin.
            key = (kind, repr(sorted(source.items())))
            with self.lock:
                future = self.memo.get(key)
                if future is None:
                    future = self.memo[key] = self.pool.submit(self._part, kind, part, where)
            return future
        return self.pool.submit(self._part, kind, part, where)

    def _part(self, kind: str, part: dict[str, Any], where: str) -> _Outcome:
        """One part brought and decoded; never raises (its failure is its row's)."""
        modality = MODALITY_OF[kind]
        try:
            media = media_part(kind, part, job=self.context, row=RowRef(where))
            data = self._bytes(kind, part[kind], modality)
            if isinstance(data, _Failure):
                return data
            return self._decoded(modality, data, media)
        except InputRejected as rejected:  # the estimate admitted it: cannot happen
            return _Failure(INVALID_REQUEST, f"cannot be served: {rejected.message}",
                            INVALID_MEDIA)
        except Undecodable as undecodable:
            return _Failure(INVALID_REQUEST, f"could not be decoded: {undecodable}",
                            INVALID_MEDIA)
        except DecoderMissing:
            logger.error("a %s part could not be decoded: this worker has no decoder for "
                         "it (PyAV)", modality)
            return _Failure("server_error", "could not be decoded: this worker has no "
                            "decoder for its format", "media_decoder_missing", 500)
        except Exception as error:  # a fault of ours: the row fails, not the chunk
            logger.error("a %s part failed unexpectedly: %s", modality,
                         exception_summary(error))
            return _Failure("server_error", "could not be prepared for the model",
                            "media_error", 500)

    def _decoded(self, modality: str, data: bytes, media: Media) -> Decoded:
        if modality == "image":
            return image_decode(data)
        seconds = float(media.seconds or Decimal(0))
        if modality == "audio":
            return audio_decode(data, rate=self.rate, max_seconds=seconds)
        return video_decode(data, fps=float(self.context.video_fps), max_seconds=seconds,
                            max_frames=max(media.tokens // self.frame_tokens, 1))

    def _bytes(self, kind: str, source: dict[str, Any], modality: str) -> bytes | _Failure:
        if kind == "input_audio":
            return binascii.a2b_base64(source["data"])
        url = str(source["url"])
        if url[:5].lower() == "data:":
            return binascii.a2b_base64(url.partition(",")[2])
        return self._download(url, modality)

    def _download(self, url: str, modality: str) -> bytes | _Failure:
        host = (urlsplit(url).hostname or "").lower()
        shown = url_mask(url)
        if host in self.silent:
            return self.silent[host]
        cap = self.context.limits.inline_max_bytes(modality)
        failure = _Failure(MEDIA_FETCH_ERROR, f"at {shown} could not be downloaded")
        for attempt in range(FETCH_ATTEMPTS):
            if attempt:
                time.sleep(FETCH_RETRY_SECONDS[attempt - 1] * random.uniform(0.5, 1.5))  # noqa: S311
            try:
                with _HOSTS.slot(host), fetch("GET", url, tenant=self.tenant, max_bytes=cap,
                                              deadline=FETCH_DEADLINE,
                                              max_redirects=FETCH_REDIRECTS) as response:
                    if response.status == 200:
                        return b"".join(response.iter_chunks())
                    status = response.status
            except TooLarge:
                mb = self.context.limits.inline_max_mb[modality]
                return _Failure(MEDIA_FETCH_ERROR, f"at {shown} is larger than the {mb} MB "
                                f"limit for {_plural(modality, 2)}")
            except (UnsafeURL, TooManyRedirects) as refused:  # asking again changes nothing
                return _Failure(MEDIA_FETCH_ERROR, f"at {shown} was not downloaded: "
                                f"{refused}")
            except FetchError as error:  # no reply, or cut off: may pass
                failure = _Failure(MEDIA_FETCH_ERROR,
                                   f"at {shown} could not be downloaded: {error}")
                continue
            failure = _Failure(MEDIA_FETCH_ERROR, f"at {shown} could not be downloaded: the "
                               f"host answered HTTP {status}", str(status))
            if status not in TRANSIENT_STATUSES:
                return failure
        if failure.code is None:
            # No reply after every attempt: the chunk's other parts on this host fail at
            # once rather than each waiting out the same deadlines.
            self.silent[host] = failure
        return failure


def _failed(body: dict[str, Any], error: RowError) -> Resolved:
    return Resolved(body, error=error)


def _at(body: dict[str, Any], path: PartPath) -> dict[str, Any]:
    value: Any = body
    for step in path:
        value = value[step]
    return value  # type: ignore[no-any-return]


def _replaced(body: Any, path: PartPath, value: Any) -> Any:
    """`body` with `value` at `path`: the containers along it copied, the rest shared, so
    the row as read (which the meter reads again) is never changed."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = list(body) if isinstance(body, list) else dict(body)
    copy[head] = _replaced(body[head], rest, value)  # type: ignore[index]
    return copy


def _plural(modality: str, count: int) -> str:
    noun = _NOUN[modality]
    return noun if count == 1 else f"{noun}s"


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(
        number % 10, "th")
    return f"{number}{suffix}"
