"""The APIs' JSON parser (REST_FRAMEWORK's DEFAULT_PARSER_CLASSES): a body is read up to
its endpoint's bytes, and its items and nesting are counted from the text before a single
object is made (anex/api/bodylimit.py says what each endpoint takes).

The count is the JSON's structure outside its strings: every value but the first follows
a `[`, `:` or `,`, and every key a `{` or `,`, so one plus those characters counts the
values and keys (an empty array or object one more, for its bracket). They are counted
over the whole text in C and, only where that passes the limit, less those inside strings:
escaped backslashes and quotes dropped first (inside a string they pair up left to right,
as the replacements do), a string is a quote, anything but a quote, and a quote. Each
string is a key or a value, so a text of more strings than its items allow is refused
before any is looked at. Nesting is the brackets outside strings, counted in and out,
where there are enough brackets for it to matter. Nothing the size of the body is copied
(but where it escapes a backslash or a quote): the body is in memory as its bytes and its
text, and for a moment both.

DRF's own JSONParser is given `request.body` (Django's read of the whole body, which
raises past DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB: a 500 for a valid realtime embedding of
more), parses with no bound on what the text becomes, and lets a RecursionError through (a
500 for a body nested some thousand levels deep). This one reads the stream itself, bounded
by the endpoint's limit, refuses a body past its items (413) or nested past JSON_MAX_DEPTH
(400), and answers what json cannot parse as DRF does (400).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, get_encoding  # type: ignore[attr-defined]
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.json import strict_constant

from anex.api.bodylimit import body_limit, body_too_large_detail
from anex.api.errors import ApiError

# Arrays and objects inside one another, the body itself being level 1. A response_format
# nests up to 64 (inference.response_format.MAX_DEPTH) one level into its body; twice that
# is room for any request, and far from the thousand or so frames Python recurses through
# (the parser's own, and every later reader's of the value: serializers, json.dumps).
JSON_MAX_DEPTH = 128
# A string once its escaped backslashes and quotes are gone; unterminated, to the end (so
# the pattern never fails at a quote and tries again from the next one).
_STRING = re.compile(r'"[^"]*"?')
_TOKEN = re.compile(r'"[^"]*"?|[\[\]{}]')
_MARKS = "[{,:"
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonRefused(ValueError):
    """A JSON text refused before it was parsed; `too_large` for its items (else its
    nesting)."""

    def __init__(self, message: str, *, too_large: bool) -> None:
        super().__init__(message)
        self.message = message
        self.too_large = too_large


def json_structure_check(text: str, *, items: int, depth: int = JSON_MAX_DEPTH,
                         what: str = "The request body") -> None:
    """Refuse (JsonRefused, its message about `what`) a JSON text holding more than
    `items` values and keys, or nested more than `depth` arrays and objects deep, without
    parsing it. A text that is not JSON may pass (the parser then refuses it); one that is
    never fails."""
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    if text.count('"') > 2 * items:
        raise JsonRefused(too_many_items_detail(what, items), too_large=True)
    found = 1 + sum(text.count(mark) for mark in _MARKS)
    if found > items:  # with the marks inside strings, which are text
        found -= sum(text.count(mark, string.start(), string.end())
                     for string in _STRING.finditer(text) for mark in _MARKS)
    # A body nested past its depth is refused for that, though it be past its items as
    # well (as a body 5,000 levels deep is): its first items tell.
    if text.count("[") + text.count("{") > depth and _nests_past(text, depth, 3 * items):
        raise JsonRefused(too_deep_detail(what, depth), too_large=False)
    if found > items:
        raise JsonRefused(too_many_items_detail(what, items), too_large=True)


def _nests_past(text: str, depth: int, tokens: int) -> bool:
    """Whether the brackets outside strings, within the text's first `tokens` strings and
    brackets, nest past `depth` (a text within its items has fewer of them)."""
    level = 0
    for token in itertools.islice(_TOKEN.finditer(text), tokens):
        step = _STEP.get(token.group())
        if step is not None:
            level += step
            if level > depth:
                return True
    return False


def too_many_items_detail(what: str, items: int) -> str:
    return (f"{what} holds more than {items:,} JSON values and keys, over the limit of "
            "this endpoint. Send a smaller request.")


def too_deep_detail(what: str, depth: int) -> str:
    return f"{what} nests JSON arrays and objects more than {depth} levels deep."


def json_bounded_loads(text: str, *, items: int, depth: int = JSON_MAX_DEPTH,
                       what: str = "The request body") -> Any:
    """json.loads of a text that json_structure_check passed (JsonRefused if not); json's
    ValueError for one that is not JSON, NaN and Infinity included (DRF's strict JSON)."""
    json_structure_check(text, items=items, depth=depth, what=what)
    try:
        return json.loads(text, parse_constant=strict_constant)
    except RecursionError:  # unreachable past the check; refused all the same
        raise JsonRefused(too_deep_detail(what, depth), too_large=False) from None


class BoundedJSONParser(BaseParser):
    """application/json, within the endpoint's body limit. Not a subclass of DRF's
    JSONParser: DRF hands that one `request.body` (see above); this one gets the stream."""

    media_type = "application/json"
    renderer_class = JSONRenderer

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        context = dict(parser_context or {})
        limit = body_limit(context["request"].path)
        raw = _read(stream, limit.bytes)
        try:
            # DRF's charset of the request: text codecs only (bz2_codec would inflate a
            # body past every limit here).
            text = raw.decode(get_encoding(context))
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        del raw
        try:
            return json_bounded_loads(text, items=limit.items)
        except JsonRefused as refused:
            raise ApiError(413 if refused.too_large else 400, refused.message) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def _read(stream: Any, limit: int) -> bytes:
    """The body, refused (413) once it passes `limit` bytes, whatever length was declared:
    Django's stream ends at the declared one, which the body limit middleware has judged
    already, so this holds for a body with none (chunked) as well. Asked for all of it at
    once (a WSGI input reads until it has it), so a body is one buffer, never copied."""
    parts: list[bytes] = []
    size = 0
    while chunk := stream.read(limit + 1 - size):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ApiError(413, body_too_large_detail(size, limit))
    return b"".join(parts)  # the one part itself, as it is nearly always
