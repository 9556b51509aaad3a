"""A multipart/form-data upload read as a stream: the one reader of the two file uploads the
web tier takes itself, the local storage's form POST (jobs.storage_views, standing in for
S3's) and the OpenAI surface's POST /files (openai_api.uploads).

The fields before the file are read into memory, bounded by FORM_OVERHEAD_BYTES; the file
part is handed out as the chunks the client sends, never spooled to memory or disk, so a
2 GiB upload goes to storage a block at a time. Each caller answers a FormError in its own
words (S3's `InvalidArgument: …`, OpenAI's 400)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header

# What a form may carry besides its file: its fields (a storage form's key and policy, the
# OpenAI upload's purpose: a few hundred bytes) and the multipart framing. More than this
# before the file starts (or after it ends) is refused unread. The request body limit lets
# an upload's body be the input cap plus this (anex.api.bodylimit).
FORM_OVERHEAD_BYTES = 64 * 1024
_READ_BYTES = 1024 * 1024


class FormError(Exception):
    """The form cannot be read: its fields past their bound, framing that is not
    multipart's, or the request ended inside the file. The message is the client's to
    read."""


class Readable(Protocol):
    """A request body (Django's HttpRequest reads as one)."""

    def read(self, size: int = ..., /) -> bytes: ...

    def readline(self, size: int = ..., /) -> bytes: ...


def form_boundary(content_type: str) -> bytes | None:
    """The boundary a multipart Content-Type names; None when it names none."""
    _kind, options = parse_options_header(content_type)
    return options.get(b"boundary") or None


class StreamedForm:
    """A multipart form read from the request a block at a time: the fields before the
    file into memory (bounded), then the file part handed out as chunks, never spooled.
    With `fields_after_file`, the fields after the file are read too (read_rest, bounded
    alike); otherwise they are ignored, as S3's form POST ignores them."""

    def __init__(self, stream: Readable, boundary: bytes, *,
                 fields_after_file: bool = False) -> None:
        self._stream = stream
        self.fields: dict[str, str] = {}
        self.file_started = self._in_file = self._file_ended = self._ended = False
        self.file_name: str | None = None  # the file part's filename, as the client gave it
        self._fields_after_file = fields_after_file
        self._field = False  # the part being read is a field that is kept
        self._pending: list[bytes] = []
        self._read = 0
        self._read_at_file_end = 0
        self._header_field = self._header_value = self._disposition = b""
        self._value: list[bytes] = []
        self._name = ""
        self._parser = MultipartParser(boundary, callbacks={
            "on_part_begin": self._part_begin, "on_header_field": self._header_field_data,
            "on_header_value": self._header_value_data, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end, "on_end": self._end,
        })

    def _part_begin(self) -> None:
        self._disposition, self._value, self._name = b"", [], ""

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_field.strip().lower() == b"content-disposition":
            self._disposition = self._header_value.strip()
        self._header_field = self._header_value = b""

    def _headers_finished(self) -> None:
        _kind, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        # The first file part is the file; anything after it is ignored, as S3 does.
        self._in_file = not self.file_started and (self._name == "file"
                                                   or b"filename" in options)
        if self._in_file and b"filename" in options:
            self.file_name = options[b"filename"].decode("utf-8", "replace")
        # A second file is never kept, even as a field.
        self._field = not self._in_file and (not self.file_started or (
            self._fields_after_file and b"filename" not in options))
        self.file_started = self.file_started or self._in_file

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self._pending.append(bytes(data[start:end]))
        elif self._field:
            self._value.append(bytes(data[start:end]))

    def _part_end(self) -> None:
        if self._in_file:
            self._in_file, self._file_ended = False, True
            self._read_at_file_end = self._read
        elif self._name and self._field:
            self.fields[self._name] = b"".join(self._value).decode("utf-8", "replace")

    def _end(self) -> None:
        self._ended = True

    def _feed(self, *, line: bool = False) -> bool:
        # The fields are read a line at a time: a read never waits for bytes the client
        # has not sent yet, so a refusal is answered as soon as the file's headers arrive.
        block = (self._stream.readline(FORM_OVERHEAD_BYTES + 1) if line
                 else self._stream.read(_READ_BYTES))
        if not block:
            return False
        self._read += len(block)
        try:
            self._parser.write(block)
        except ParseError:  # a part's headers or framing that is not multipart's
            raise FormError("the body is not a multipart/form-data form: a part's headers "
                            "or boundaries cannot be read.") from None
        return True

    def read_fields(self) -> None:
        """Read up to the start of the file part (or the end of a form without one)."""
        while not self.file_started and not self._ended:
            if self._read > FORM_OVERHEAD_BYTES:
                raise FormError("the form fields are too large; send the fields given, "
                                "then the file, last.")
            if not self._feed(line=True):
                return

    def read_rest(self) -> None:
        """After the file: read the form to its end, the fields after the file kept
        (fields_after_file), as bounded as the fields before it."""
        while not self._ended:
            if self._read - self._read_at_file_end > FORM_OVERHEAD_BYTES:
                raise FormError("the form fields after the file are too large.")
            if not self._feed(line=True):
                return

    def file_chunks(self) -> Iterator[bytes]:
        """The file part's bytes as they arrive; FormError when the request ends inside
        it."""
        while True:
            pending, self._pending = self._pending, []
            yield from pending
            if self._file_ended or self._ended:
                return
            if not self._feed():
                raise FormError("the request ended inside the file.")
