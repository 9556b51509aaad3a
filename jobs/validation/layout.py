"""Where a JSONL input's rows lie, recorded while the checks read it (jobs.validation.lines
validate_jsonl, given `layout`): the byte each chunk of the job's chunk size ends at, and a
uniform random sample of the rows, each with its byte range. The estimate keeps both, so
neither the sampled estimate nor the start reads the input whole again: the checks' read is
the one whole read before the first row runs
(docs/dev/decisions/2026-12-06-one-read-of-the-input.md).

The layout sees each block of whole lines the checks read, before they check it, and trusts
what the checks establish of a file they pass: its rows are its lines up to its last
non-blank one (a blank line between rows is refused; blank lines ending the file are let be;
jobs.jsonl says which lines are blank). So a block costs a strip of its tail and, where a
chunk ends or a sampled row lies in it, one vector pass for its newlines; nothing per row.
What it recorded of a file the checks refuse is never used, and `finish` gives no layout
when its count of rows is not the checks'.

The sample is Li's Algorithm L (ACM TOMS 20(4), 1994): a reservoir of `sample_rows` rows,
each later row entering it with the probability that keeps it a uniform sample of the rows
read so far, found by drawing the gap to the next entering row rather than a number per
row: a few hundred draws for a million rows.

Given `keys` (jobs.validation.grouping.ShareKeys), it also hands each block's rows, with
the byte each starts at, to the recorder of share keys, whose grouped order the layout then
carries (`grouped`): that costs one vector pass for a block's newlines and a hash or a few
per row, and is the one place a grouped plan's keys are read.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass

import numpy as np

from jobs.jsonl import SPACE
from jobs.validation.grouping import GroupedPlan, ShareKeys

_NEWLINE = ord("\n")


@dataclass(frozen=True)
class InputLayout:
    """A checked JSONL input's layout: chunks of `chunk_rows` rows, the k-th ending (its
    last newline included) at chunk_ends[k], the last at the file's end; and the sampled
    rows as Job.sample_rows keeps them, [row index, byte start, byte end], by index;
    and, where share keys were recorded, the grouped order and its statistics (None
    otherwise: grouping off, a parquet input, keys lost)."""

    chunk_rows: int
    chunk_ends: list[int]
    picks: list[list[int]]
    grouped: GroupedPlan | None = None


class RowLayout:
    """The recorder handed to validate_jsonl: fed every block the checks read, in order
    (`block`), then asked for the layout once the checks have counted the rows (`finish`).
    Holds the chunk ends and the sample: bounded by the file's chunks, not its rows."""

    def __init__(self, *, chunk_rows: int, sample_rows: int,
                 rng: random.Random | None = None, keys: ShareKeys | None = None) -> None:
        assert chunk_rows >= 1
        self.chunk_rows = chunk_rows
        self.sample_rows = sample_rows
        self.keys = keys
        self._rng = rng or random.Random()  # noqa: S311 - a sample, not a secret
        self._position = 0  # bytes read so far
        self._rows = 0  # rows so far: the lines up to the last non-blank one
        self._lost = False  # a block it cannot place: no layout
        self._ends: list[int] = []
        self._picked: list[list[int]] = []
        # The next row to enter the sample, and Algorithm L's running weight.
        self._next = 0 if sample_rows > 0 else sys.maxsize
        self._weight = 1.0

    def block(self, number: int, lines: int, chunk: bytes | None) -> None:
        """The checks' next block: `lines` whole lines (the last may lack its newline), the
        first numbered `number`; None for an over-long line read past unkept (a preflight
        check's), after which nothing is placed."""
        if self._lost:
            return
        if chunk is None:
            self._lost = True
            return
        start = self._position
        self._position += len(chunk)
        solid = len(chunk.rstrip(SPACE))
        if not solid:
            return  # blank lines only: no row (or, after rows, the file's end)
        if self._rows != number - 1:
            # A row after blank lines: the checks refuse this file.
            self._lost = True
            return
        # The block's last row is the line holding its last byte that is not whitespace:
        # counted back from the block's end, over its tail of blank lines only.
        newlines = lines - (not chunk.endswith(b"\n"))
        last = newlines - chunk.count(b"\n", solid)
        first_row, rows = number - 1, number + last
        ends: np.ndarray | None = None

        def line_end(line: int) -> int:
            nonlocal ends
            if ends is None:
                ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == _NEWLINE) + 1
            return start + (int(ends[line]) if line < len(ends) else len(chunk))

        # Chunks that end in this block: after each chunk_rows-th row.
        boundary = (first_row // self.chunk_rows + 1) * self.chunk_rows
        while boundary <= rows:
            self._ends.append(line_end(boundary - 1 - first_row))
            boundary += self.chunk_rows
        # Sampled rows in this block, with their byte ranges.
        while self._next < rows:
            line = self._next - first_row
            self._take([self._next, line_end(line - 1) if line else start, line_end(line)])
        if self.keys is not None and not self.keys.lost:
            if ends is None:
                ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == _NEWLINE) + 1
            # The block's rows start at its start and after each newline before its last row.
            starts = np.concatenate(([0], ends[:rows - first_row - 1])) + start
            self.keys.block(chunk, starts, first=number == 1)
        self._rows = rows

    def finish(self, rows: int) -> InputLayout | None:
        """The layout of a file the checks passed with `rows` rows; None when a block could
        not be placed or the rows it placed are not the checks' count."""
        if self._lost or self._rows != rows or not rows:
            return None
        ends = list(self._ends)
        if rows % self.chunk_rows:
            ends.append(self._position)  # the last chunk runs to the file's end
        grouped = self.keys.finish(rows=rows, end=self._position) \
            if self.keys is not None else None
        return InputLayout(chunk_rows=self.chunk_rows, chunk_ends=ends,
                           picks=sorted(self._picked), grouped=grouped)

    def _take(self, pick: list[int]) -> None:
        """Row pick[0] enters the sample; the next row to enter is drawn."""
        size = self.sample_rows
        if len(self._picked) < size:  # the first rows fill the reservoir
            self._picked.append(pick)
            if len(self._picked) < size:
                self._next += 1
                return
        else:
            self._picked[self._rng.randrange(size)] = pick
        self._weight *= math.exp(math.log(self._uniform()) / size)
        gap = math.floor(math.log(self._uniform()) / math.log1p(-self._weight)) \
            if self._weight < 1.0 else 0
        self._next += gap + 1

    def _uniform(self) -> float:
        """A uniform draw in (0, 1): its logarithm is finite."""
        while not (value := self._rng.random()):
            pass
        return value
