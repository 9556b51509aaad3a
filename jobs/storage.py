"""Object storage, one per region (docs/decisions.md, "Inputs and results"; "Data residency").

Two backends with one contract:
- "s3": django-storages' S3Storage (boto3): presigned POST upload targets whose policy
  enforces the key, the expiry and the size cap; presigned GET links.
- "local", the embedded default: files under ANEX_STORAGE_ROOT/<region>/, an upload
  form endpoint that checks a signed, expiring policy the same way, and signed, expiring
  download links (jobs/storage_views.py).

Objects are addressed by key; `uri` is the s3:// form the API shows (input_s3_uri).
"""

from __future__ import annotations

import io
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlencode

from boto3.s3.transfer import TransferConfig
from django.conf import settings
from django.core import signing
from django.utils import timezone
from storages.backends.s3 import S3Storage

from anex.regions import region_origin
from console.constants import Region

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


class RegionStorage(ABC):
    region: Region
    bucket: str

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @abstractmethod
    def upload_target(self, *, key: str, max_bytes: int, expires_in: int) -> UploadTarget: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def read_head(self, key: str, length: int) -> bytes:
        """The object's first bytes, without reading the rest."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object."""

    @abstractmethod
    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        """Store the chunks as the object; returns its size. Over max_bytes raises
        StorageTooLarge and keeps nothing."""

    @abstractmethod
    def open(self, key: str) -> IO[bytes]: ...

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
    def __init__(self, region: Region, bucket: str, *, endpoint_url: str | None,
                 region_name: str | None) -> None:
        self.region = region
        self.bucket = bucket
        self.storage = S3Storage(bucket_name=bucket, endpoint_url=endpoint_url,
                                 region_name=region_name, file_overwrite=True,
                                 transfer_config=_TRANSFER, default_acl=None)

    @property
    def _client(self) -> Any:
        return self.storage.connection.meta.client

    def upload_target(self, *, key: str, max_bytes: int, expires_in: int) -> UploadTarget:
        post = self._client.generate_presigned_post(
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

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        reply = self._client.get_object(Bucket=self.bucket, Key=key,
                                        Range=f"bytes={start}-{end - 1}")
        return bytes(reply["Body"].read())

    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        counted = _Counter(_capped(chunks, max_bytes))
        reader = io.BufferedReader(_ChunkReader(iter(counted)), buffer_size=1024 * 1024)
        # boto3 aborts the multipart upload when the stream raises: nothing is kept.
        self._client.upload_fileobj(reader, self.bucket, key, Config=_TRANSFER)
        return counted.total

    def open(self, key: str) -> IO[bytes]:
        return self._client.get_object(Bucket=self.bucket, Key=key)["Body"]  # type: ignore[no-any-return]

    def download_url(self, key: str, *, expires_in: int, filename: str) -> str:
        return str(self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": key,
                    "ResponseContentDisposition": f'attachment; filename="{filename}"'},
            ExpiresIn=expires_in,
        ))

    def delete(self, key: str) -> None:
        self.storage.delete(key)


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
        policy = signing.dumps(
            {"key": key, "max_bytes": max_bytes, "expires": int(expires_at.timestamp())},
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

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self.path(key).open("rb") as handle:
            handle.seek(start)
            return handle.read(max(0, end - start))

    def write_stream(self, key: str, chunks: Iterable[bytes], *, max_bytes: int) -> int:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        total = 0
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in _capped(chunks, max_bytes):
                    handle.write(chunk)
                    total += len(chunk)
            os.replace(temporary, path)  # the object appears whole or not at all
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return total

    def open(self, key: str) -> IO[bytes]:
        return self.path(key).open("rb")

    def download_url(self, key: str, *, expires_in: int, filename: str) -> str:
        expires = int((timezone.now() + timedelta(seconds=expires_in)).timestamp())
        token = signing.dumps({"key": key, "expires": expires, "filename": filename},
                              salt=DOWNLOAD_SALT)
        return (f"{region_origin(self.region)}/storage/{self.region.value}/download/"
                f"{quote(key)}?{urlencode({'token': token})}")

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)


def storage_for(region: Region | str) -> RegionStorage:
    region = Region(region)
    if settings.ANEX_STORAGE_BACKEND == "s3":
        return _s3(region, settings.ANEX_S3_BUCKETS[region.value], settings.ANEX_S3_ENDPOINT_URL,
                   settings.ANEX_S3_REGIONS.get(region.value))
    return _local(region, Path(settings.ANEX_STORAGE_ROOT))


# One client per configuration (settings can change under tests).
@cache
def _s3(region: Region, bucket: str, endpoint_url: str | None,
        region_name: str | None) -> S3RegionStorage:
    return S3RegionStorage(region, bucket, endpoint_url=endpoint_url, region_name=region_name)


@cache
def _local(region: Region, root: Path) -> LocalRegionStorage:
    return LocalRegionStorage(region, root)
