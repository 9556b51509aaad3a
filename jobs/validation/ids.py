"""Duplicate row identities, found in bounded memory.

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

_EMPTY = 0


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
