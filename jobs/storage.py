"""Object storage, one per region (docs/dev/decisions/2026-12-01-inputs-and-results.md;
docs/dev/decisions/2026-12-01-data-residency.md).

Two backends with one contract:
- "s3": django-storages' S3Storage (boto3): presigned POST upload targets whose policy
  enforces the key, the expiry and the size cap; presigned GET links.
- "local", the embedded default: files under ANEX_STORAGE_ROOT/<region>/, an upload
  form endpoint that checks a signed, expiring policy the same way, and signed, expiring
  download links (jobs/storage_views.py).

Objects are addressed by key; `uri` is the s3:// form the API shows (input_s3_uri).

An input is frozen when it becomes ready: `fingerprint` names the exact bytes that were
checked (S3: the object's VersionId, else its ETag; local: its SHA-256, size and mtime),
and every later read passes it as `pin`, so a file swapped under the same key (a replayed
upload form) is refused with StorageChanged instead of being read
(docs/dev/decisions/2026-12-01-inputs-and-results.md).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlencode, urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from django.conf import settings
from django.core import signing
from django.utils import timezone
from storages.backends.s3 import S3Storage

from anex.regions import Region, region_origin

UPLOAD_SALT = "anex.storage.upload"
DOWNLOAD_SALT = "anex.storage.download"
# Bounded memory while streaming into S3: 8 MiB parts, at most two in flight.
_TRANSFER = TransferConfig(multipart_threshold=8 * 1024 * 1024,
                           multipart_chunksize=8 * 1024 * 1024, max_concurrency=2)


@dataclass(frozen=True)
class UploadTarget:
    url: str
    fields: dict[str, str]
    expires_at: datetime


class StorageTooLarge(Exception):
    """A stream passed the size cap while being written; nothing was kept."""


class StorageChanged(Exception):
    """The object is no longer the one its pin names: it was replaced or removed."""


class StorageExists(Exception):
    """A write-once key already holds an object; nothing was written."""


class RegionStorage(ABC):
    region: Region
    bucket: str

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @abstractmethod
    def upload_target(self, *, key: str, max_bytes: int, expires_in: int) -> UploadTarget: ...

    def upload_origin(self) -> str:
        """The scheme://host[:port] a browser sends this region's uploads to (the console's
        Content-Security-Policy lets the New job page's script reach it): read off a
        target, so it is whatever the backend answers."""
        parts = urlsplit(self.upload_target(key="origin", max_bytes=1, expires_in=60).url)
        return f"{parts.scheme}://{parts.netloc}"

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def read_head(self, key: str, length: int) -> bytes:
        """The object's first bytes, without reading the rest."""

    @abstractmethod
    def fingerprint(self, key: str) -> tuple[int, str]:
        """The object's size and a pin naming exactly these bytes, for open/read_range."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int, *, pin: str = "") -> bytes:
        """Bytes [start, end) of the object; with a pin, of that object or StorageChanged."""

    def range_reader(self, key: str, *, pin: str = "") -> Callable[[int, int], bytes]:
        """A function reading bytes [start, end) of one object as read_range does (pinned
        the same), safe to call from other threads (S3: this thread's client, which boto3
        shares across threads): a grouped chunk's rows are read a few ranges at once."""
        return lambda start, end: self.read_range(key, start, end, pin=pin)

    @abstractmethod
    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        """Store the chunks as the object; returns its size. Over max_bytes raises
        StorageTooLarge and keeps nothing."""

    @abstractmethod
    def open(self, key: str, *, pin: str = "") -> IO[bytes]:
        """The object as a buffered binary file (iterating it yields lines). With a pin:
        that object, or StorageChanged (at the latest when the read reaches its end)."""

    @abstractmethod
    def open_at(self, key: str, start: int) -> IO[bytes]:
        """The object from byte `start` on, as open() reads it (unpinned): a finished
        result's page read from its nearest line mark (jobs.services.pages)."""

    def verify(self, key: str, *, pin: str) -> None:
        """StorageChanged unless the object is still the pinned one. S3 answers this for a
        one-byte pinned read (the server compares the version or ETag)."""
        self.read_range(key, 0, 1, pin=pin)

    @abstractmethod
    def whole_reader(self) -> Callable[[str], bytes]:
        """A function reading an object whole, safe to call from other threads (S3: this
        thread's client, which boto3 shares across threads)."""

    def read_each(self, keys: Iterable[str], *, ahead: int) -> Iterator[bytes]:
        """Each object whole, in the order of `keys`, read `ahead` at a time on threads of
        its own: at most `ahead` objects are being read or held, the one handed out
        included (the next read starts when the caller comes back for more), so memory is
        `ahead` objects whatever the number of keys."""
        read = self.whole_reader()
        keys = iter(keys)
        pending: deque[Future[bytes]] = deque()
        with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="read-ahead") as pool:
            try:
                for key in keys:
                    pending.append(pool.submit(read, key))
                    if len(pending) == ahead:
                        break
                while pending:
                    data = pending.popleft().result()
                    yield data
                    del data  # handed out and done with: its place goes to the next read
                    following = next(keys, None)
                    if following is not None:
                        pending.append(pool.submit(read, following))
            finally:  # a caller that stops early (or raises) leaves nothing running
                for future in pending:
                    future.cancel()

    @abstractmethod
    def download_url(self, key: str, *, expires_in: int, filename: str) -> str: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; an object already gone is fine."""


def _capped(chunks: Iterable[bytes], max_bytes: int) -> Iterator[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise StorageTooLarge(f"over the {max_bytes}-byte cap")
        yield chunk


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of chunks, so boto3 can stream it in parts."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


class S3RegionStorage(RegionStorage):
    """`public_endpoint_url`: where customers reach the storage (its signed links name it,
    ANEX_S3_PUBLIC_ENDPOINT_URL: MinIO behind the deployment's https proxy), when that is not
    the endpoint the services use (http://minio:9000 inside compose). A link is signed for
    the host it names, and signing contacts nothing, so the services keep their own."""

    def __init__(self, region: Region, bucket: str, *, endpoint_url: str | None,
                 region_name: str | None, public_endpoint_url: str | None = None) -> None:
        self.region = region
        self.bucket = bucket
        self.region_name = region_name
        self.public_endpoint_url = public_endpoint_url
        self.storage = S3Storage(bucket_name=bucket, endpoint_url=endpoint_url,
                                 region_name=region_name, file_overwrite=True,
                                 transfer_config=_TRANSFER, default_acl=None)

    @property
    def _client(self) -> Any:
        return self.storage.connection.meta.client

    @property
    def _signer(self) -> Any:
        """The client signed links are made with: the services' own, or one naming the
        public endpoint with the same credentials and configuration."""
        if self.public_endpoint_url is None:
            return self._client
        return _public_client(self.public_endpoint_url, self.region_name,
                              self._client.meta.config)

    def upload_target(self, *, key: str, max_bytes: int, expires_in: int) -> UploadTarget:
        post = self._signer.generate_presigned_post(
            Bucket=self.bucket, Key=key,
            Conditions=[{"key": key}, ["content-length-range", 1, max_bytes]],
            ExpiresIn=expires_in,
        )
        return UploadTarget(url=post["url"], fields=dict(post["fields"]),
                            expires_at=timezone.now() + timedelta(seconds=expires_in))

    def exists(self, key: str) -> bool:
        return bool(self.storage.exists(key))

    def size(self, key: str) -> int:
        return int(self.storage.size(key))

    def read_head(self, key: str, length: int) -> bytes:
        reply = self._client.get_object(Bucket=self.bucket, Key=key,
                                        Range=f"bytes=0-{length - 1}")
        return bytes(reply["Body"].read())

    def fingerprint(self, key: str) -> tuple[int, str]:
        head = self._client.head_object(Bucket=self.bucket, Key=key)
        version = head.get("VersionId")
        # A versioned bucket keeps every upload: reading the checked version is exact
        # whatever lands later. Unversioned, the ETag changes with the content.
        pin = f"version:{version}" if version and version != "null" else f"etag:{head['ETag']}"
        return int(head["ContentLength"]), pin

    def _get(self, key: str, pin: str, *, client: Any = None, **extra: str) -> Any:
        kind, _, value = pin.partition(":")
        if kind == "version":
            extra["VersionId"] = value
        elif kind == "etag":
            extra["IfMatch"] = value
        elif pin:
            raise ValueError(f"not an S3 pin: {pin!r}")
        try:
            return (client or self._client).get_object(Bucket=self.bucket, Key=key, **extra)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if pin and code in ("PreconditionFailed", "412", "NoSuchVersion", "NoSuchKey",
                                "InvalidArgument"):
                raise StorageChanged(f"{key} is not the object that was checked") from None
            raise

    def read_range(self, key: str, start: int, end: int, *, pin: str = "") -> bytes:
        if end <= start:
            return b""
        reply = self._get(key, pin, Range=f"bytes={start}-{end - 1}")
        return bytes(reply["Body"].read())

    def range_reader(self, key: str, *, pin: str = "") -> Callable[[int, int], bytes]:
        client = self._client  # django-storages' is per thread; a boto3 client is shared

        def read(start: int, end: int) -> bytes:
            if end <= start:
                return b""
            reply = self._get(key, pin, client=client, Range=f"bytes={start}-{end - 1}")
            return bytes(reply["Body"].read())
        return read

    def whole_reader(self) -> Callable[[str], bytes]:
        client = self._client  # django-storages' is per thread; a boto3 client is shared

        def read(key: str) -> bytes:
            return bytes(client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        return read

    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        counted = _Counter(_capped(chunks, max_bytes))
        reader = io.BufferedReader(_ChunkReader(iter(counted)), buffer_size=1024 * 1024)
        # boto3 aborts the multipart upload when the stream raises: nothing is kept.
        self._client.upload_fileobj(reader, self.bucket, key, Config=_TRANSFER)
        return counted.total

    def open(self, key: str, *, pin: str = "") -> IO[bytes]:
        # Iterating botocore's StreamingBody yields 1 KiB chunks, not lines: buffered, it
        # reads like a local file (lines with their endings, read(n), a context manager).
        return io.BufferedReader(_RawReader(self._get(key, pin)["Body"]),
                                 buffer_size=1024 * 1024)

    def open_at(self, key: str, start: int) -> IO[bytes]:
        extra = {"Range": f"bytes={start}-"} if start else {}
        return io.BufferedReader(_RawReader(self._get(key, "", **extra)["Body"]),
                                 buffer_size=1024 * 1024)

    def download_url(self, key: str, *, expires_in: int, filename: str) -> str:
        return str(self._signer.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": key,
                    "ResponseContentDisposition": f'attachment; filename="{filename}"',
                    "ResponseContentType": content_type_of(key)},
            ExpiresIn=expires_in,
        ))

    def delete(self, key: str) -> None:
        self.storage.delete(key)


class _RawReader(io.RawIOBase):
    """A raw binary file over anything with read(n) and close() (botocore's StreamingBody,
    a local file); io.BufferedReader over it reads like a local file."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def readable(self) -> bool:
        return True

    def _read(self, size: int) -> bytes:
        return bytes(self._source.read(size))

    def readinto(self, target: Any) -> int:
        data = self._read(len(target))
        target[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()


class _VerifiedReader(_RawReader):
    """A local file read whole against its pin: the SHA-256 of what was read is compared
    with the pinned one when the read reaches the end (a partial read proves nothing and
    is not checked; whoever needs the proof reads to the end)."""

    def __init__(self, handle: IO[bytes], key: str, digest: str) -> None:
        super().__init__(handle)
        self._key = key
        self._digest = digest
        self._hash = hashlib.sha256()

    def _read(self, size: int) -> bytes:
        data = super()._read(size)
        if not data and self._hash.hexdigest() != self._digest:
            raise StorageChanged(f"{self._key} is not the object that was checked")
        self._hash.update(data)
        return data


class _Counter:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.total += len(chunk)
            yield chunk


class LocalRegionStorage(RegionStorage):
    def __init__(self, region: Region, root: Path) -> None:
        self.region = region
        self.bucket = f"anex-local-{region.value}"
        self.root = root / region.value

    def path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError("key escapes the storage root")
        return path

    def upload_target(self, *, key: str, max_bytes: int, expires_in: int) -> UploadTarget:
        expires_at = timezone.now() + timedelta(seconds=expires_in)
        # Bound to this region's storage: another region's upload endpoint refuses it.
        policy = signing.dumps(
            {"key": key, "max_bytes": max_bytes, "expires": int(expires_at.timestamp()),
             "region": self.region.value},
            salt=UPLOAD_SALT,
        )
        url = f"{region_origin(self.region)}/storage/{self.region.value}/upload"
        return UploadTarget(url=url, fields={"key": key, "policy": policy},
                            expires_at=expires_at)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        return self.path(key).stat().st_size

    def read_head(self, key: str, length: int) -> bytes:
        with self.path(key).open("rb") as handle:
            return handle.read(length)

    def fingerprint(self, key: str) -> tuple[int, str]:
        digest = hashlib.sha256()
        with self.path(key).open("rb") as handle:
            stat = os.fstat(handle.fileno())
            while block := handle.read(1024 * 1024):
                digest.update(block)
        return stat.st_size, f"sha256:{digest.hexdigest()}:{stat.st_size}:{stat.st_mtime_ns}"

    def _open_pinned(self, key: str, pin: str) -> tuple[IO[bytes], str]:
        """The file, checked against the pin's size and mtime (a whole-file check cannot
        be made on a range; the digest is returned for reads that go to the end)."""
        try:
            handle = self.path(key).open("rb")
        except FileNotFoundError:
            if pin:
                raise StorageChanged(f"{key} is gone") from None
            raise
        if not pin:
            return handle, ""
        kind, digest, size, mtime = [*pin.split(":"), "", "", ""][:4]
        stat = os.fstat(handle.fileno())
        if kind != "sha256" or (str(stat.st_size), str(stat.st_mtime_ns)) != (size, mtime):
            handle.close()
            raise StorageChanged(f"{key} is not the object that was checked")
        return handle, digest

    def read_range(self, key: str, start: int, end: int, *, pin: str = "") -> bytes:
        handle, _digest = self._open_pinned(key, pin)
        with handle:
            handle.seek(start)
            return handle.read(max(0, end - start))

    @staticmethod
    def _write_partial(path: Path, chunks: Iterable[bytes], max_bytes: int) -> tuple[Path, int]:
        """The chunks in a temporary file beside `path`, and their size; nothing is left
        behind when writing fails."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        total = 0
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in _capped(chunks, max_bytes):
                    handle.write(chunk)
                    total += len(chunk)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return Path(temporary), total

    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        path = self.path(key)
        temporary, total = self._write_partial(path, chunks, max_bytes)
        try:
            os.replace(temporary, path)  # the object appears whole or not at all
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return total

    def write_once(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        """write_stream for a key that may be written once (an upload target): a second
        write, even a concurrent one, raises StorageExists and changes nothing."""
        path = self.path(key)
        if path.exists():
            raise StorageExists(key)
        temporary, total = self._write_partial(path, chunks, max_bytes)
        try:
            os.link(temporary, path)  # atomic, and fails when the key is taken
        except FileExistsError:
            raise StorageExists(key) from None
        finally:
            temporary.unlink(missing_ok=True)
        return total

    def open(self, key: str, *, pin: str = "") -> IO[bytes]:
        handle, digest = self._open_pinned(key, pin)
        if not pin:
            return handle
        return io.BufferedReader(_VerifiedReader(handle, key, digest), buffer_size=1024 * 1024)

    def open_at(self, key: str, start: int) -> IO[bytes]:
        handle = self.path(key).open("rb")
        handle.seek(start)
        return handle

    def whole_reader(self) -> Callable[[str], bytes]:
        return lambda key: self.path(key).read_bytes()

    def verify(self, key: str, *, pin: str) -> None:
        # A local file is proven only by hashing it whole.
        with self.open(key, pin=pin) as stream:
            while stream.read(1024 * 1024):
                pass

    def download_url(self, key: str, *, expires_in: int, filename: str) -> str:
        expires = int((timezone.now() + timedelta(seconds=expires_in)).timestamp())
        token = signing.dumps({"key": key, "expires": expires, "filename": filename},
                              salt=DOWNLOAD_SALT)
        return (f"{region_origin(self.region)}/storage/{self.region.value}/download/"
                f"{quote(key)}?{urlencode({'token': token})}")

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)


# What a download names itself as, by the object's kind (its key's ending): JSONL's media
# type and parquet's registered one, as S3 answers for the objects anex writes.
CONTENT_TYPES = {".jsonl": "application/jsonl", ".parquet": "application/vnd.apache.parquet"}


def content_type_of(key: str) -> str:
    """The Content-Type a download of the object at `key` is answered with."""
    suffix = key[key.rfind("."):] if "." in key.rsplit("/", 1)[-1] else ""
    return CONTENT_TYPES.get(suffix, "application/octet-stream")


def key_organization(key: str) -> str:
    """The organization an object belongs to: every key is `<kind>/<organization id>/…`
    (inputs/, results/; jobs.services)."""
    return key.split("/", 2)[1] if key.count("/") >= 2 else ""


def storage_for(region: Region | str) -> RegionStorage:
    region = Region(region)
    if settings.ANEX_STORAGE_BACKEND == "s3":
        return _s3(region, settings.ANEX_S3_BUCKETS[region.value], settings.ANEX_S3_ENDPOINT_URL,
                   settings.ANEX_S3_REGIONS.get(region.value),
                   settings.ANEX_S3_PUBLIC_ENDPOINT_URL)
    return _local(region, Path(settings.ANEX_STORAGE_ROOT))


# One client per configuration (settings can change under tests).
@cache
def _s3(region: Region, bucket: str, endpoint_url: str | None, region_name: str | None,
        public_endpoint_url: str | None) -> S3RegionStorage:
    return S3RegionStorage(region, bucket, endpoint_url=endpoint_url, region_name=region_name,
                           public_endpoint_url=public_endpoint_url)


@cache
def _public_client(endpoint_url: str, region_name: str | None, config: Any) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url,
                                          region_name=region_name, config=config)


@cache
def _local(region: Region, root: Path) -> LocalRegionStorage:
    return LocalRegionStorage(region, root)
