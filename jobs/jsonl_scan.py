"""A JSONL line's `body.model`, found without building the line: what an OpenAI batch's
create reads of its file (openai_api.batches) in the web request, where a 64 MiB line
decoded whole is ~25x its bytes in objects and seconds of the GIL (issue 40 H1).

A short line is read by the one reader (jobs.jsonl.line_loads), as the checks read it. A
longer one is scanned a block at a time, vectorized (numpy), never decoded: the scan
tracks which bytes are inside strings (escapes included) and how deep each bracket is,
and looks only at the keys that decide the answer, `"body"` directly in the top-level
object and `"model"` directly in that body. Memory is a block's arrays whatever the line
holds, and the work per byte is a few vector passes, with no Python step per token.

On a line that is valid JSON the scan reads what line_loads reads: the last of duplicate
keys wins (a second "body" replaces the first, a second "model" the first), a key spelled
with \\u escapes is the key it spells, and the model is the string's value decoded by
line_loads itself. What it does not do is check the rest of a long line: a long line
that is not JSON can still give its model here, and the job's checks then name the line
(invalid_json_line), where a short one is passed over (tests/unit/test_jsonl_scan.py
holds the scan to line_loads on generated lines)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from jobs.jsonl import BOM, line_loads, line_row

# Lines up to this size are read whole by line_loads (a few MB of objects at most); past
# it they are scanned.
WHOLE_LINE_BYTES = 64 * 1024
# The scan's block: its arrays (an index per quote or bracket) stay within a few MB.
BLOCK_BYTES = 256 * 1024
# A model id is a short name; a value longer than this is kept only as its first
# characters, to name it in an error ("Unknown model '…'").
MODEL_RAW_BYTES = 1024
MODEL_LABEL_CHARS = 200

_QUOTE, _BACKSLASH, _COLON, _OPEN_OBJECT = 0x22, 0x5C, 0x3A, 0x7B
# `{` and `[` differ from each other by 0x20 only, as do `}` and `]`: one OR folds each
# pair onto one value.
_OPENS, _CLOSES = 0x7B, 0x7D
_WHITESPACE = b" \t\r\n"
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(_WHITESPACE)] = True
# The longest a key of interest can be written: every character as a \\uXXXX escape.
_KEY_RAW_MAX = 6 * len("model") + 2


@dataclass(frozen=True)
class LineModel:
    """One line of the file as the scan read it: its number (from 1), its length in bytes
    (the newline left out), and body.model when that is a non-empty string."""

    number: int
    size: int
    model: str | None


def lines_body_model(stream: IO[bytes], *, lines: int, max_bytes: int) -> Iterator[LineModel]:
    """The stream's first `lines` lines, each with its body.model, read `BLOCK_BYTES` at a
    time. A line is given once read whole within the first `max_bytes` bytes of the stream
    (its newline counted); one that reaches them is not, nor any after it. A blank line, or
    one that is not a request object, is given with model None."""
    consumed = read = 0
    rest = b""
    for number in range(1, lines + 1):
        line = _Line(number)
        ended = False
        while not ended:
            if not rest:
                if read >= max_bytes:
                    break
                rest = stream.read(min(BLOCK_BYTES, max_bytes - read))
                read += len(rest)
                if not rest:
                    break  # the file's end: its last line may lack a newline
            cut = rest.find(b"\n")
            if cut < 0:
                line.feed(rest)
                rest = b""
            else:
                line.feed(rest[:cut])
                rest = rest[cut + 1:]
                ended = True
        consumed += line.size + ended
        if consumed >= max_bytes or not (ended or line.size):
            return
        yield LineModel(number, line.size, line.model())
        if not ended:
            return


class _Line:
    """One line, fed in pieces (no newline in them): kept whole while short, scanned once
    it is not."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.size = 0
        self._kept: list[bytes] | None = []
        self._scan: BodyModelScan | None = None

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self.number == 1 and self.size == 0 and data.startswith(BOM):
            data = data[len(BOM):]
            self.size += len(BOM)
        self.size += len(data)
        if self._kept is not None:
            self._kept.append(data)
            if self.size <= WHOLE_LINE_BYTES:
                return
            kept, self._kept = self._kept, None
            self._scan = BodyModelScan()
            for piece in kept:
                self._scan.feed(piece)
            return
        assert self._scan is not None
        self._scan.feed(data)

    def model(self) -> str | None:
        if self._scan is not None:
            return self._scan.model()
        assert self._kept is not None
        line = line_row(b"".join(self._kept))  # the BOM was dropped as it was fed
        if not line:
            return None
        try:
            # The checks' own reader (jobs.validation.lines): what it refuses names nothing.
            request = line_loads(line)
        except (ValueError, RecursionError):
            return None  # the job's checks name this line
        body = request.get("body") if isinstance(request, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        return _label(model) if isinstance(model, str) and model else None


def _label(model: str) -> str:
    return model if len(model) <= MODEL_LABEL_CHARS else model[:MODEL_LABEL_CHARS] + "…"


class _NotAString:
    """body.model is there and is not a string."""


_NOT_A_STRING = _NotAString()


class BodyModelScan:
    """The scan of one long line, fed its bytes in order (no newline among them), then
    asked for its model().

    What it carries from one block to the next: the depth and the string state at the
    block's end, the last "body" key's state (its value an object still open, or not an
    object) and that body's last "model" value; and at most a few hundred bytes that a
    key of interest at the block's end still needs (its colon, its value) - whitespace
    between tokens is dropped from them, which changes nothing JSON means."""

    def __init__(self) -> None:
        self._carry = b""
        self._depth = 0
        self._in_string = False
        self._escaped = False  # the next byte is escaped (a string's odd backslash run)
        self._top: bool | None = None  # whether the line is an object (None: unknown yet)
        self._body = False  # the last body's value is an object
        self._body_open = False  # inside that object now
        self._model: str | _NotAString | None = None
        self._invalid = False  # the model's value is a string line_loads refuses

    def model(self) -> str | None:
        if not self._top or not self._body or self._invalid:
            return None
        model = self._model
        return model if isinstance(model, str) and model else None

    def feed(self, data: bytes) -> None:
        if self._top is False or not data:
            return
        if self._top is None:
            start = len(data) - len(data.lstrip(_WHITESPACE))
            if start == len(data):
                return
            self._top = data[start] == _OPEN_OBJECT
            if not self._top:
                return  # not an object: it names no model, whatever follows
        buffer, self._carry = self._carry + data, b""
        self._block(buffer)

    def _block(self, buffer: bytes) -> None:
        block = _Block(buffer, depth=self._depth, in_string=self._in_string,
                       escaped=self._escaped)
        size = block.size
        cut = block.short_string_end()
        bodies, body_values, sure = block.keys(b"body", 1)
        if len(bodies) and (not sure[-1] or body_values[-1] >= size):
            # The last may be a key whose colon, or whose value, is in the next block:
            # it is read again with it (a body before it still counts if it is not one).
            cut = min(cut, int(bodies[-1]))
            bodies, body_values = bodies[:-1], body_values[:-1]
        if len(bodies):
            value = int(body_values[-1])
            self._body = self._body_open = bool(block.data[value] == _OPEN_OBJECT)
            self._model, self._invalid = None, False
            region = value + 1
        else:
            region = 0
        carry: bytes | None = None
        if self._body_open:
            end = block.closing(region, depth=1)
            models, values, sure = block.keys(b"model", 2)
            inside = (models >= region) & (models < min(end if end is not None else size, cut))
            models, values, sure = models[inside], values[inside], sure[inside]
            if len(models) and not sure[-1]:  # maybe a key: read again with the next block
                cut = min(cut, int(models[-1]))
                models, values = models[:-1], values[:-1]
            if len(models):
                key, value = int(models[-1]), int(values[-1])
                carry = self._model_value(block, key, value)
                if carry is not None:
                    cut = min(cut, key)
            if end is not None and end < cut:
                self._body_open = False
        if cut < size:
            self._carry = carry if carry is not None else _tail(buffer[cut:])
            self._depth = block.depth_at(cut)
            self._in_string = self._escaped = False
        else:
            self._depth = block.end_depth
            self._in_string, self._escaped = block.ends_in_string, block.ends_escaped

    def _model_value(self, block: _Block, key: int, value: int) -> bytes | None:
        """Read the value of the body's last "model" key (at `key`, its value at `value`):
        the bytes to read again with the next block when it runs past this one."""
        buffer, size = block.buffer, block.size
        if value >= size:  # its colon or its value is in the next block
            return buffer[key:].translate(None, _WHITESPACE)
        if block.data[value] != _QUOTE:
            self._model, self._invalid = _NOT_A_STRING, False
            return None
        close = block.string_end(value)
        raw_end = close if close is not None else size
        if raw_end - value - 1 > MODEL_RAW_BYTES:  # no model id is this long
            self._model = _prefix(buffer[value + 1:value + 1 + MODEL_RAW_BYTES])
            self._invalid = False
            return None
        if close is None:  # a short value that runs on into the next block
            return buffer[key:value].translate(None, _WHITESPACE) + buffer[value:]
        try:
            decoded = line_loads(buffer[value:close + 1])
        except ValueError:  # a lone surrogate: line_loads refuses the whole line
            self._model, self._invalid = None, True
            return None
        self._model, self._invalid = _label(decoded), False
        return None


class _Block:
    """One block of a long line, indexed: where its real quotes are (those no backslash
    escapes) and its brackets outside strings, and the depth after each of those brackets.
    Positions, not a value per byte: a block that is mostly text (a long content string,
    base64) costs a few compares, and a depth is a search among the brackets."""

    def __init__(self, buffer: bytes, *, depth: int, in_string: bool, escaped: bool) -> None:
        self.buffer = buffer
        self.data = data = np.frombuffer(buffer, dtype=np.uint8)
        self.size = len(data)
        self.quotes, self.ends_escaped = _real_quotes(buffer, data, escaped)
        # Real quotes alternate: opening, closing, ... (the first closes a string begun in
        # an earlier block when the block starts inside one).
        first = int(in_string)
        self.opens = self.quotes[first::2]
        self.closes = self.quotes[first + 1::2]
        self.ends_in_string = (len(self.quotes) + in_string) % 2 == 1
        self.start_depth = depth
        if in_string and not len(self.quotes):  # all of it inside one string
            brackets = np.zeros(0, dtype=np.intp)
        else:
            folded = data | 0x20
            brackets = np.flatnonzero((folded == _OPENS) | (folded == _CLOSES))
            if len(brackets) and len(self.quotes):
                outside = (np.searchsorted(self.quotes, brackets) + first) & 1 == 0
                brackets = brackets[outside]
        self.brackets = brackets
        steps = (data[brackets] | 0x20 == _OPENS).astype(np.int32) * 2 - 1
        self.depths = depth + np.cumsum(steps, dtype=np.int32)  # just after each bracket
        self.end_depth = int(self.depths[-1]) if len(self.depths) else depth
        self._solids: np.ndarray | None = None

    def depths_at(self, positions: np.ndarray) -> np.ndarray:
        """The depth just before each position."""
        if not len(self.brackets):
            return np.full(len(positions), self.start_depth)
        before = np.searchsorted(self.brackets, positions)
        return np.where(before > 0, self.depths[np.maximum(before - 1, 0)], self.start_depth)

    def depth_at(self, position: int) -> int:
        return int(self.depths_at(np.array([position]))[0])

    def short_string_end(self) -> int:
        """Where a string the block ends inside begins, when it is short enough to be a key
        of interest (read again with the next block); else the block's size."""
        if len(self.opens) > len(self.closes) and self.size - self.opens[-1] <= _KEY_RAW_MAX:
            return int(self.opens[-1])
        return self.size

    def string_end(self, open_quote: int) -> int | None:
        """The closing quote of the string opened at open_quote, when in this block."""
        after = int(np.searchsorted(self.quotes, open_quote, side="right"))
        return int(self.quotes[after]) if after < len(self.quotes) else None

    def closing(self, start: int, *, depth: int) -> int | None:
        """The first bracket at or after start that brings the depth back to `depth`."""
        after = int(np.searchsorted(self.brackets, start))
        back = np.flatnonzero(self.depths[after:] <= depth)
        return int(self.brackets[after + back[0]]) if len(back) else None

    def solid(self, positions: np.ndarray) -> np.ndarray:
        """The first byte that is not whitespace at or after each position (the block's
        size where there is none)."""
        size = self.size
        positions = np.minimum(positions, size)
        landed = positions < size
        landed[landed] = ~_IS_SPACE[self.data[positions[landed]]]
        if landed.all():
            return positions
        if self._solids is None:
            self._solids = np.flatnonzero(~_IS_SPACE[self.data])
        solids = self._solids
        at = np.searchsorted(solids, positions)
        return np.where(at < len(solids), solids[np.minimum(at, len(solids) - 1)], size)

    def keys(self, word: bytes, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The strings at `depth` that spell `word` and are keys, or may be (only
        whitespace follows them in this block): their opening quotes, where their values
        start (the block's size when not in it), and whether each is surely a key."""
        starts = self.opens[:len(self.closes)]
        lengths = self.closes - starts - 1
        chosen = (lengths >= len(word)) & (lengths <= 6 * len(word))
        starts, ends = starts[chosen], self.closes[chosen]
        if len(starts):
            chosen = self.depths_at(starts) == depth
            starts, ends = starts[chosen], ends[chosen]
        if len(starts):
            chosen = _spells(self.data, starts + 1, ends, word)
            starts, ends = starts[chosen], ends[chosen]
        if not len(starts):
            return starts, starts, np.zeros(0, dtype=bool)
        colons = self.solid(ends + 1)
        waiting = colons >= self.size
        keyed = ~waiting
        keyed[keyed] = self.data[colons[keyed]] == _COLON
        values = np.where(keyed, self.solid(colons + 1), self.size)
        chosen = keyed | waiting
        return starts[chosen], values[chosen], keyed[chosen]


def _real_quotes(buffer: bytes, data: np.ndarray, escaped: bool) -> tuple[np.ndarray, bool]:
    """The positions of the quotes no backslash escapes (`escaped`: the block's first byte
    is), and whether the byte after the block is escaped."""
    quotes = np.flatnonzero(data == _QUOTE)
    size = len(data)
    trailing = size - len(buffer.rstrip(b"\\"))
    ends_escaped = (trailing + (escaped if trailing == size else 0)) % 2 == 1
    if not len(quotes) or (not escaped and buffer.find(b"\\") < 0):
        return quotes, ends_escaped
    after_slash = data[np.maximum(quotes - 1, 0)] == _BACKSLASH
    after_slash[quotes == 0] = escaped
    if not after_slash.any():
        return quotes, ends_escaped
    twice = data[np.maximum(quotes - 2, 0)] == _BACKSLASH
    twice[quotes < 2] = False
    if not (after_slash & twice).any() and not (escaped and quotes[0] == 1 and after_slash[0]):
        # Every escape before a quote is a single backslash (\"), the common case.
        return quotes[~after_slash], ends_escaped
    # Runs of backslashes: the byte right after a run of odd length is escaped (a run at the
    # block's start counts the escape carried into it).
    slashes = np.flatnonzero(data == _BACKSLASH)
    breaks = np.flatnonzero(np.diff(slashes) != 1)
    run_starts = slashes[np.concatenate(([0], breaks + 1))]
    run_ends = slashes[np.concatenate((breaks, [len(slashes) - 1]))] + 1
    lengths = run_ends - run_starts + np.where(run_starts == 0, int(escaped), 0)
    marked = np.zeros(size + 1, dtype=bool)
    marked[run_ends[lengths % 2 == 1]] = True
    marked[0] |= escaped
    return quotes[~marked[quotes]], ends_escaped


def _tail(data: bytes) -> bytes:
    """A block's tail read again with the next block: a short string it ends inside, or a
    key and what follows it up to its value, whitespace after the key dropped."""
    close = _first_real_quote(data, 1)
    if close is None:
        return data
    return data[:close + 1] + data[close + 1:].translate(None, _WHITESPACE)


def _first_real_quote(data: bytes, start: int) -> int | None:
    """The first quote at or after start that no backslash escapes (a short tail)."""
    position = start
    while (found := data.find(b'"', position)) >= 0:
        run = len(data[:found]) - len(data[:found].rstrip(b"\\"))
        if run % 2 == 0:
            return found
        position = found + 1
    return None


def _spells(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, word: bytes) -> np.ndarray:
    """Whether each string's raw bytes [start, end) spell `word`, each of its characters
    as itself or as a \\uXXXX escape (hex digits in either case): the key JSON reads."""
    plain = ends - starts == len(word)
    ok = plain.copy()
    for index, char in enumerate(word):
        ok[plain] &= data[starts[plain] + index] == char
    spelled = ~plain
    if not spelled.any():
        return ok
    # Written with escapes (rare): a character at a time, each one byte or six.
    size = len(data)
    position = starts[spelled]
    limit = ends[spelled]
    matched = np.ones(len(position), dtype=bool)

    def at(offset: int) -> np.ndarray:
        return data[np.minimum(position + offset, size - 1)]

    for char in word:
        same = at(0) == char
        escaped = (at(0) == _BACKSLASH) & (at(1) == ord("u")) & (position + 5 < limit)
        for index, digit in enumerate(f"{char:04x}".encode()):
            escaped &= (at(2 + index) | 0x20) == digit
        matched &= (same | escaped) & (position < limit)
        position = position + np.where(escaped & ~same, 6, 1)
    ok[spelled] = matched & (position == limit)
    return ok


def _prefix(raw: bytes) -> str:
    """The first characters of a model value too long to be one, for its error message."""
    for trim in range(0, 7):
        try:
            value = line_loads(b'"' + raw[:len(raw) - trim] + b'"')
        except ValueError:
            continue
        return _label(value + "…") if isinstance(value, str) else "…"
    return "…"
