"""The prefix-grouped order of a JSONL job's rows (issue 43; docs/dev/decisions/
2026-12-06-prefix-grouped-plan.md): rows whose prompts share a prefix are planned next to
each other, and identical rows side by side, so that a group's rows reach the engine
together and its shared prefix is computed once while it is cached (vLLM v1 finds a block
in its prefix cache as soon as a request scheduled in the same step holds it, so no row
needs to go first: bench/prefix_order.py), and the chunk that holds identical rows
computes them once (inference.kinds). vLLM schedules in arrival order: the product has to
order its rows before they reach it.

Two halves. `ShareKeys` is fed every block the estimate's checks read (through
jobs.validation.layout.RowLayout) and keeps, per row, in numpy columns: the byte it starts
at (so any row can be read alone), a whole-row key (a hash of its body bytes: every row of
a file the checks pass has the same url, so rows identical but for custom_id share it),
and, for chat rows, prefix levels: hashes of the first 256 * 2**k bytes of its prompt (its
tools JSON, then its messages JSON, as the line holds them), for each such length the
prompt reaches. Keys are read off the raw line (msgspec.Raw: the body is found, never
built), so the one read stays one read. `grouped` then sorts the rows once they are all
read. The hash is Python's own (SipHash, keyed per process: a row's key is compared only
with the other rows' of the same read, never kept), a tenth of hashlib's cost a call on
short rows.

A byte prefix of the JSON is a stand-in for a token prefix of the rendered prompt: two
rows whose messages JSON agree on the first N bytes render to the same first tokens up to
about there (the chat template renders messages in order), which is what the engine's
prefix cache matches on. It never decides an answer, only an order, so a hash collision
costs at most a row placed beside an unrelated one; the level hashes are 32 bits to keep a
million chat rows near 50 MB, the whole-row key 64 bits since it is also a statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from jobs.jsonl import BOM

# Prefix levels: 256, 512, ... bytes (LEVELS of them, up to 32 KiB). Doubling lengths keep
# a row's keys few (a 4 KB prompt has 5) while a shared document of any size is matched to
# within half its length; past the last level, rows that share a longer prefix are still
# grouped by it, just no finer.
LEVEL_BASE = 256
LEVELS = 8
LEVEL_LENGTHS = tuple(LEVEL_BASE << k for k in range(LEVELS))
LEVEL_BYTES = np.array(LEVEL_LENGTHS, np.int64)
# A file with fewer rows than this in shared groups plans contiguously: grouping it would
# scatter its chunks' reads for a gain too small to see.
MIN_GROUPED_SHARE = 0.05
# Keys are kept for at most this many rows (about 52 bytes a chat row, 16 an embedding
# row); a larger file plans contiguously, as before grouping.
MAX_ROWS = 2_000_000


class _Line(msgspec.Struct, gc=False):
    """What a row's keys are read from: its body, found and not built."""

    body: msgspec.Raw = msgspec.Raw(b"null")


class _ChatBody(msgspec.Struct, gc=False):
    """What a chat row's prompt prefix is read from: its tools and messages, as JSON."""

    messages: msgspec.Raw = msgspec.Raw(b"")
    tools: msgspec.Raw = msgspec.Raw(b"")


_LINES = msgspec.json.Decoder(_Line)
_CHAT_BODY = msgspec.json.Decoder(_ChatBody)


class ShareKeys:
    """Each row's start and share keys, recorded block by block as the checks read them
    (RowLayout.block calls `block`). `prefixes`: chat rows, whose prompts have prefix
    levels; an embedding or decision row has its whole-row key alone. Any block it cannot
    read (msgspec refuses a line the checks may still pass, too many rows) leaves it
    `lost`: the job then plans contiguously, never wrongly."""

    def __init__(self, *, prefixes: bool, max_rows: int = MAX_ROWS) -> None:
        self.prefixes = prefixes
        self.max_rows = max_rows
        self.lost = False
        self.rows = 0
        # Per block: row starts (uint64), whole-row keys (uint64), prompt bytes (uint32)
        # and prefix levels (uint32, rows x LEVELS; 0 where the prompt is shorter).
        self._starts: list[np.ndarray] = []
        self._wholes: list[np.ndarray] = []
        self._sizes: list[np.ndarray] = []
        self._levels: list[np.ndarray] = []

    def block(self, chunk: bytes, starts: np.ndarray, *, first: bool) -> None:
        """A block of whole lines whose rows start at `starts` (file offsets, one a row;
        the block's lines past its rows are blank), the block itself starting at
        starts[0]; `first`: it starts the file (a byte order mark may lead it)."""
        if self.lost:
            return
        rows = len(starts)
        if self.rows + rows > self.max_rows:
            self._lose()
            return
        skip = len(BOM) if first and chunk.startswith(BOM) else 0
        try:
            lines = _LINES.decode_lines(memoryview(chunk)[skip:])
        except msgspec.DecodeError:
            self._lose()  # the checks decide whether the file is taken; its plan is plain
            return
        if len(lines) != rows:
            self._lose()
            return
        # Every row of a file the checks pass has the same url (one endpoint a file): the
        # body alone tells identical rows apart.
        wholes = np.fromiter([hash(bytes(line.body)) for line in lines], np.int64, rows)
        self._starts.append(np.asarray(starts, np.uint64))
        self._wholes.append(wholes.view(np.uint64))
        if self.prefixes:
            self._prefix_levels(lines)
        self.rows += rows

    def _prefix_levels(self, lines: list[_Line]) -> None:
        """Each row's prompt size and prefix levels: a hash of each level's length of its
        first bytes (the levels double, so a prompt's are hashed over about twice its
        length)."""
        digests: list[int] = []
        reached = np.zeros(len(lines), np.int64)
        sizes = np.zeros(len(lines), np.uint32)
        for at, line in enumerate(lines):
            try:
                body = _CHAT_BODY.decode(line.body)
            except msgspec.DecodeError:  # not an object: the checks refuse the row
                continue
            prompt = bytes(body.tools) + bytes(body.messages) if len(body.tools) \
                else bytes(body.messages)
            size = len(prompt)
            sizes[at] = min(size, 2**32 - 1)
            if size < LEVEL_BASE:
                continue
            for length in LEVEL_LENGTHS:
                if length > size:
                    break
                digests.append(hash(prompt[:length]))
                reached[at] += 1
        levels = np.zeros((len(lines), LEVELS), np.uint32)
        if digests:
            values = (np.array(digests, np.int64).view(np.uint64) & 0xFFFFFFFF
                      ).astype(np.uint32)
            values[values == 0] = 1  # 0 is "the prompt is shorter than this level"
            row = np.repeat(np.arange(len(lines)), reached)
            level = np.arange(len(values)) - np.repeat(np.cumsum(reached) - reached, reached)
            levels[row, level] = values
        self._sizes.append(sizes)
        self._levels.append(levels)

    def _lose(self) -> None:
        self.lost = True
        self._starts, self._wholes, self._sizes, self._levels = [], [], [], []

    def finish(self, *, rows: int, end: int) -> GroupedPlan | None:
        """The plan for a file the checks passed with `rows` rows ending at byte `end`;
        None when the keys were lost or are not the checks' rows."""
        if self.lost or self.rows != rows or not rows:
            return None
        starts = np.concatenate([*self._starts, np.array([end], np.uint64)])
        self._starts = []
        wholes = np.concatenate(self._wholes)
        self._wholes = []
        sizes = levels = None
        if self.prefixes:
            sizes = np.concatenate(self._sizes)
            levels = np.concatenate(self._levels)
            self._sizes, self._levels = [], []
        return grouped(wholes=wholes, levels=levels, sizes=sizes, starts=starts)


@dataclass(frozen=True)
class GroupedPlan:
    """A job's planned order and what the estimate states of it. `order` is the row
    indexes in the order they run (uint32), None when the plan stays contiguous; `starts`
    every row's first byte and, last, the file's end (uint64: row i is bytes starts[i] to
    starts[i + 1]). `shared_prefix_share` (chat rows only, else None): the share of the
    rows' prompt bytes that the row before in the planned order already held, at the level
    lengths; `identical_rows`: rows that repeat an earlier row but for custom_id."""

    order: np.ndarray | None
    starts: np.ndarray
    shared_prefix_share: float | None
    identical_rows: int


def _first_seen(keys: np.ndarray, valid: np.ndarray | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key as the index of the first row holding it (a key no other row holds
    is the row's own index, so it sorts where the row is), and how many rows hold it.
    Rows not `valid` (a prompt shorter than the level) are their own index, held once."""
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                          return_counts=True)
    seen = first[inverse].astype(np.uint32)
    held = counts[inverse]
    if valid is not None:
        own = ~valid
        seen[own] = np.flatnonzero(own).astype(np.uint32)
        held[own] = 1
    return seen, held


def grouped(*, wholes: np.ndarray, levels: np.ndarray | None, sizes: np.ndarray | None,
            starts: np.ndarray, min_share: float = MIN_GROUPED_SHARE) -> GroupedPlan:
    """The rows' planned order: sorted by (level 0, level 1, ..., whole-row key), each as
    the first row holding it, stably, so rows of a shared prefix come together at the place
    of the group's first row, identical rows side by side within them, and rows sharing
    nothing keep their place in file order. Contiguous (order None) when fewer than
    `min_share` of the rows are in a group of two or more (identical rows, or a prefix
    some but not all rows hold), or nothing moves: a file without shared work plans and
    reads exactly as before."""
    rows = len(wholes)
    whole_seen, whole_held = _first_seen(wholes)
    identical = rows - int(np.count_nonzero(whole_seen == np.arange(rows, dtype=np.uint32)))
    in_group = whole_held > 1
    keys: list[np.ndarray] = [whole_seen]
    if levels is not None:
        for level in range(LEVELS):
            column = levels[:, level]
            reached = column != 0
            if not reached.any():
                break
            seen, held = _first_seen(column, reached)
            # A prefix every row holds (one system prompt) orders nothing: the engine's
            # cache keeps it whatever the order. Only a group of some of the rows counts.
            in_group |= (held > 1) & (held < rows)
            keys.append(seen)
        del levels
    order: np.ndarray | None = None
    if rows > 1 and np.count_nonzero(in_group) >= min_share * rows:
        # lexsort's last key is its first: level 0 leads, the whole-row key breaks ties.
        candidate = np.lexsort(keys).astype(np.uint32)
        if not np.array_equal(candidate, np.arange(rows, dtype=np.uint32)):
            order = candidate
    share = None
    if sizes is not None:
        planned = order if order is not None else np.arange(rows, dtype=np.uint32)
        share = _shared_share(keys[1:], sizes, planned)
    return GroupedPlan(order=order, starts=starts, shared_prefix_share=share,
                       identical_rows=identical)


def _shared_share(levels: list[np.ndarray], sizes: np.ndarray, order: np.ndarray) -> float:
    """The share of the prompt bytes that each row's predecessor in `order` already held:
    the longest level length at which the two rows' prefixes are the same (first-seen keys
    are equal only where both prompts reach the level and agree on it)."""
    total = int(sizes.sum(dtype=np.int64))
    if not total or len(order) < 2:
        return 0.0
    before, after = order[:-1], order[1:]
    shared = np.zeros(len(after), np.int64)
    for level, keys in enumerate(levels):
        shared[keys[after] == keys[before]] = LEVEL_BYTES[level]
    return min(1.0, float(shared.sum()) / total)


def order_bytes(order: np.ndarray) -> bytes:
    """A planned order as ChunkPlan keeps it: little-endian uint32."""
    return np.asarray(order, "<u4").tobytes()


def starts_bytes(starts: np.ndarray) -> bytes:
    """Row starts (and the file's end) as ChunkPlan keeps them: little-endian uint64."""
    return np.asarray(starts, "<u8").tobytes()


def plan_arrays(order: bytes, starts: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The planned order and row starts ChunkPlan keeps, read back."""
    return np.frombuffer(order, "<u4"), np.frombuffer(starts, "<u8")

