"""Duplicate row identities, found in bounded memory: DigestSet one id at a time (parquet),
IdSet a block of JSONL lines at a time.

A Python set of a million custom_id strings (or even of their 8-byte digests as bytes or
int objects) costs 70-100 MB in object headers. This keeps each identity as an 8-byte
BLAKE2b digest in one flat array of unsigned 64-bit slots (open addressing, linear probing,
at most half full): about 16 bytes per row.

Two different ids share a digest with probability about n^2 / 2^65 (3e-8 at a million
rows); such a pair would be refused as a duplicate. Digests are deterministic, so a file's
verdict never changes between runs.
"""

from __future__ import annotations

from array import array
from hashlib import blake2b

import numpy as np

_EMPTY = 0
# IdSet's flags: at least this many slots per id kept, at most twice as many (a byte each).
BITS_PER_ID = 16


class DigestSet:
    def __init__(self, capacity: int = 1 << 12) -> None:
        self._slots = array("Q", bytes(8 * capacity))
        self._mask = capacity - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, identity: str) -> bool:
        """Record identity; False when it was already there."""
        digest = int.from_bytes(blake2b(identity.encode("utf-8", "surrogatepass"),
                                        digest_size=8).digest(), "little") or 1
        if not self._insert(digest):
            return False
        self._count += 1
        if self._count * 2 > len(self._slots):
            self._grow()
        return True

    def _insert(self, digest: int) -> bool:
        slots, mask = self._slots, self._mask
        index = digest & mask
        while True:
            held = slots[index]
            if held == _EMPTY:
                slots[index] = digest
                return True
            if held == digest:
                return False
            index = (index + 1) & mask

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        self._mask = len(self._slots) - 1
        for digest in old:
            if digest != _EMPTY:
                self._insert(digest)


class IdSet:
    """The JSONL checker's custom_ids, taken a block of lines at a time.

    Each id is kept as its 64-bit hash() in sorted numpy runs (8 bytes a row), merged as
    they grow so there are never more than about log2(rows / block) of them, beside a flag
    array (16 to 32 bytes a row) marking the slots their hashes fall in. A block's ids are
    checked with a few numpy calls, not a Python step per row: a new id's slot is almost
    always unflagged, and only the few whose slot is flagged are searched for in the runs.
    hash() is keyed per process, so a false duplicate (two different ids, one hash: about
    n^2 / 2^65, 3e-8 at a million rows) does not repeat when the file is checked again.

    A block is taken either whole (`fresh`: the fast lane, every row valid) or line by line
    (`begin`, then `add` per row in file order, then `end`).
    """

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []
        self._rows = 0
        # One flag per slot of hash & mask, set for every id kept: an id whose slot is unset
        # was never seen, so only the few whose slot is set are searched for in the runs.
        # At least BITS_PER_ID slots an id (about 1 in 16 new ids is searched for).
        self._seen = np.zeros(1 << 16, bool)
        # Line by line: the block's ids already known before it (from `begin`), the hashes
        # `begin` looked up, and the ones added so far.
        self._before: set[int] = set()
        self._looked: set[int] = set()
        self._block: set[int] = set()

    def __len__(self) -> int:
        return self._rows + len(self._block)

    def fresh(self, identities: list[str]) -> bool:
        """Keep a whole block of ids and answer True when none was seen before and no two
        are equal; else keep nothing and answer False (the block is then checked line by
        line, which names the duplicate)."""
        hashes = np.fromiter(map(hash, identities), np.int64, len(identities))
        hashes.sort()
        if (hashes[1:] == hashes[:-1]).any():
            return False
        maybe = self._seen[hashes & (len(self._seen) - 1)]
        if maybe.any() and self._known(hashes[maybe]).any():
            return False
        self._push(hashes)
        return True

    def begin(self, identities: list[str]) -> None:
        """Look up, in one search, the ids of a block about to be added line by line."""
        hashes = np.fromiter(map(hash, identities), np.int64, len(identities))
        self._looked = set(hashes.tolist())
        maybe = hashes[self._seen[hashes & (len(self._seen) - 1)]]
        self._before = set(maybe[self._known(maybe)].tolist())

    def add(self, identity: str) -> bool:
        """Record one id of the open block; False when it was already there."""
        digest = hash(identity)
        if digest in self._block:
            return False
        if digest in self._looked:
            if digest in self._before:
                return False
        elif self._known(np.array([digest], np.int64)).any():  # not looked up by begin
            return False
        self._block.add(digest)
        return True

    def end(self) -> None:
        """Keep the block's ids."""
        if self._block:
            self._push(np.array(sorted(self._block), np.int64))
        self._block, self._before, self._looked = set(), set(), set()

    def _known(self, hashes: np.ndarray) -> np.ndarray:
        found = np.zeros(len(hashes), bool)
        for run in self._runs:
            at = np.searchsorted(run, hashes)
            at[at == len(run)] = 0
            found |= run[at] == hashes
        return found

    def _push(self, run: np.ndarray) -> None:
        self._rows += len(run)
        self._runs.append(run)
        if self._rows * BITS_PER_ID > len(self._seen):  # grown: flag every id kept again
            size = len(self._seen)
            while self._rows * BITS_PER_ID > size:
                size *= 2
            self._seen = np.zeros(size, bool)
            for kept in self._runs:
                self._seen[kept & (size - 1)] = True
        else:
            self._seen[run & (len(self._seen) - 1)] = True
        # Like a binary counter: a run merges into the one before it while that one is not
        # at least twice its size, so runs grow geometrically and stay few.
        while len(self._runs) > 1 and len(self._runs[-2]) < 2 * len(self._runs[-1]):
            last = self._runs.pop()
            merged = np.concatenate((self._runs.pop(), last))
            merged.sort(kind="stable")
            self._runs.append(merged)
