"""Caps on the file transfers the web tier streams itself (issue 40 M2;
docs/dev/decisions/2026-12-06-slow-clients-and-the-web-tier.md).

An upload of up to the input cap (2 GiB) or a file's content streamed back holds a web
thread for as long as the client takes to send or read it; a few slow clients of one
organization could hold every thread of every process. Each such transfer takes a place
first, or is refused before a byte is read or sent:
- one of this process's ANEX_WEB_TRANSFERS_PER_PROCESS places (below its threads, so the
  batch API, the console and /healthz keep threads of their own): 503, the server is at
  capacity;
- one of its organization's ANEX_ORG_TRANSFERS_IN_FLIGHT places of the same direction,
  counted fleet-wide in Redis: 429, the organization has that many transfers running.
Both with Retry-After. The organization's places are members of a sorted set scored by when
they lapse (TRANSFER_LAPSE_SECONDS): a thread of each process pushes on the lapse of every
place it holds every REFRESH_EVERY_SECONDS, however long a transfer takes, so a process
that dies frees its places within that long; when Redis cannot be reached the
organization's count is skipped (as the upload rate limit does) and the process's cap
still holds.

The caller holds its places for a synchronous read (`with transfer_held(...)`), or hands
them to the response that streams (TransferStream, TransferFile): given back when the
response is closed, however it ended.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from typing import Literal

import redis
from django.conf import settings

from anex.errors import RateLimited, Unavailable
from anex.redis import redis_client

logger = logging.getLogger(__name__)

Direction = Literal["upload", "download"]
UPLOAD: Direction = "upload"
DOWNLOAD: Direction = "download"
RETRY_AFTER_SECONDS = 5
# An organization's place lapses this long after its process last pushed it on (a dead
# process's), which a live one does every REFRESH_EVERY_SECONDS.
TRANSFER_LAPSE_SECONDS = 120
REFRESH_EVERY_SECONDS = 20

_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_in_process = 0
_in_process_lock = threading.Lock()
# This process's places held in Redis, pushed on by the keeper thread (started at the first).
_held: set[TransferPlaces] = set()
_keeper: threading.Thread | None = None


def organization_full_detail(direction: Direction, limit: int) -> str:
    return (f"Too many {direction}s at once: this organization already has {limit} "
            f"{direction}s in progress, the most it may. Wait the seconds in the "
            "Retry-After header, then retry.")


PROCESS_FULL_DETAIL = ("This server is streaming as many file transfers as it may at once, "
                       "so nothing was done. Retry after the seconds in the Retry-After "
                       "header.")


def _key(direction: Direction, organization_id: object) -> str:
    return f"anex:transfers:{direction}:{organization_id}"


class TransferPlaces:
    """A transfer's places: one of the process's, one of the organization's (its token in
    Redis, None when Redis could not be asked). release() is idempotent."""

    def __init__(self, direction: Direction, organization_id: object, token: str | None) -> None:
        self.key = _key(direction, organization_id)
        self.token = token
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        global _in_process
        with self._lock:
            if self._released:
                return
            self._released = True
        with _in_process_lock:
            _in_process -= 1
            _held.discard(self)
        if self.token is not None:
            try:
                redis_client().zrem(self.key, self.token)
            except redis.RedisError as exc:
                logger.warning("could not give back a transfer place: %s", exc)


def transfer_places_take(*, direction: Direction, organization_id: object) -> TransferPlaces:
    """One of this process's transfer places and one of the organization's for `direction`:
    Unavailable (503) when the process has none free, RateLimited (429) when the
    organization has ANEX_ORG_TRANSFERS_IN_FLIGHT of this direction running. The caller
    gives them back (release) when the transfer ends."""
    global _in_process
    with _in_process_lock:
        if _in_process >= settings.ANEX_WEB_TRANSFERS_PER_PROCESS:
            raise Unavailable(PROCESS_FULL_DETAIL, retry_after=RETRY_AFTER_SECONDS)
        _in_process += 1
    limit = settings.ANEX_ORG_TRANSFERS_IN_FLIGHT
    token = uuid.uuid4().hex
    held: str | None = token
    now = time.time()
    try:
        taken = redis_client().eval(_TAKE, 1, _key(direction, organization_id), now,
                                    now + TRANSFER_LAPSE_SECONDS, limit, token,
                                    TRANSFER_LAPSE_SECONDS * 2)
    except redis.RedisError as exc:
        logger.warning("transfer limiter unavailable, %s allowed: %s", direction, exc)
        taken, held = 1, None
    except BaseException:
        with _in_process_lock:
            _in_process -= 1
        raise
    if not int(taken):
        with _in_process_lock:
            _in_process -= 1
        raise RateLimited(organization_full_detail(direction, limit),
                          retry_after=RETRY_AFTER_SECONDS, code="concurrency_limit_exceeded")
    places = TransferPlaces(direction, organization_id, held)
    if held is not None:
        _keep(places)
    return places


def _keep(places: TransferPlaces) -> None:
    """Have this process's keeper push `places`' lapse on until it is released."""
    global _keeper
    with _in_process_lock:
        _held.add(places)
        if _keeper is None or not _keeper.is_alive():
            _keeper = threading.Thread(target=_keeper_run, daemon=True, name="transfer-places")
            _keeper.start()


def _keeper_run() -> None:
    while True:
        time.sleep(REFRESH_EVERY_SECONDS)
        places_refresh()


def places_refresh() -> None:
    """Push on the lapse of every organization place this process holds (the keeper's
    round; XX: a place given back meanwhile is not made again)."""
    with _in_process_lock:
        held = [places for places in _held if places.token is not None]
    if not held:
        return
    lapse = time.time() + TRANSFER_LAPSE_SECONDS
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            for places in held:
                pipe.zadd(places.key, {str(places.token): lapse}, xx=True)
            pipe.execute()
    except redis.RedisError as exc:  # they lapse on their own; the process's cap holds
        logger.warning("could not push on the transfer places' lapse: %s", exc)


@contextmanager
def transfer_held(*, direction: Direction, organization_id: object) -> Iterator[TransferPlaces]:
    """transfer_places_take for the block (a transfer read or written within it)."""
    places = transfer_places_take(direction=direction, organization_id=organization_id)
    try:
        yield places
    finally:
        places.release()


class TransferStream:
    """A streamed response's chunks, holding the transfer's places until the response is
    closed (Django closes an iterator that has close(), however the response ended: read
    to its end, cut off, or never started)."""

    def __init__(self, chunks: Iterator[bytes], places: TransferPlaces) -> None:
        self._chunks = chunks
        self._places = places

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            # Its last byte handed on (or its read failed): the places are free now, not
            # when the server gets round to close() - a WSGI client that reads a response
            # to its end and never closes it (Schemathesis' in-process calls) holds none.
            self._places.release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            self._places.release()

    def __del__(self) -> None:
        # A response dropped without being closed (a test client's never read) gives its
        # places back all the same.
        self._places.release()


class TransferFile(io.FileIO):
    """A file opened for a FileResponse, holding the transfer's places until it is closed
    (the response closes it when it is done, sendfile or not)."""

    def __init__(self, path: str | PathLike[str], places: TransferPlaces) -> None:
        self._places = places
        try:
            super().__init__(path, "rb")
        except BaseException:
            places.release()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._places.release()


def transfers_in_process() -> int:
    """This process's transfers in progress (for tests)."""
    return _in_process
