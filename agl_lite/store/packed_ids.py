"""Token ids packed (uint32, little-endian) and prefix-shared, so a 50-turn trajectory costs O(new tokens).

A stored sequence is `parent[:parent_len] + tail`. A new prompt takes as parent the earlier sequence of the same
attempt (a prompt, or a prompt + completion) with which it shares the longest prefix. Pure functions and a small
in-memory index; the SQLite backend does the I/O.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MIN_SHARED", "PrefixIndex", "SeqRow", "common_prefix_len", "pack", "resolve", "unpack"]

MIN_SHARED = 16
"""Shorter common prefixes are not worth a reference."""

_SWAP = sys.byteorder != "little"


def pack(ids: array[int]) -> bytes:
    if ids.typecode != "I":
        ids = array("I", ids)
    if _SWAP:
        ids = array("I", ids)
        ids.byteswap()
    return ids.tobytes()


def unpack(blob: bytes) -> array[int]:
    ids = array("I")
    ids.frombytes(blob)
    if _SWAP:
        ids.byteswap()
    return ids


def common_prefix_len(a: array[int], b: array[int]) -> int:
    """Length of the common prefix of two id arrays (binary search over C-level slice comparisons)."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    ma, mb = memoryview(a), memoryview(b)
    if ma[:n] == mb[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ma[:mid] == mb[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class SeqRow:
    parent: int | None
    parent_len: int
    tail: array[int]


def resolve(
    seq_id: int, load: Callable[[int], SeqRow], cache: dict[int, array[int]] | None = None
) -> array[int]:
    """The full ids of a stored sequence, following parents iteratively (chains can be long)."""
    memo = cache if cache is not None else {}
    chain: list[tuple[int, SeqRow]] = []
    current: int | None = seq_id
    while current is not None and current not in memo:
        row = load(current)
        chain.append((current, row))
        current = row.parent
    base = memo[current] if current is not None else array("I")
    for sid, row in reversed(chain):
        ids = array("I", base[: row.parent_len]) if row.parent is not None else array("I")
        ids.extend(row.tail)
        memo[sid] = ids
        base = ids
    return memo[seq_id]


class PrefixIndex:
    """Recent full sequences per scope (an attempt), to find a new prompt's parent without reading the database.

    Bounded: `per_scope` sequences per scope and `max_ids` ids in all (least recently used scopes dropped first).
    A miss only costs sharing, never correctness.
    """

    def __init__(self, per_scope: int = 8, max_ids: int = 16_000_000) -> None:
        self.per_scope = per_scope
        self.max_ids = max_ids
        self.ids = 0
        self._index: OrderedDict[str, list[tuple[int, array[int]]]] = OrderedDict()

    def best_parent(self, scope: str, ids: array[int]) -> tuple[int, int] | None:
        """(seq id, shared length) of the candidate sharing the longest prefix, if at least MIN_SHARED."""
        candidates = self._index.get(scope)
        if not candidates:
            return None
        self._index.move_to_end(scope)
        best: tuple[int, int] | None = None
        for seq_id, seq in reversed(candidates):
            shared = common_prefix_len(seq, ids)
            if shared >= MIN_SHARED and (best is None or shared > best[1]):
                best = (seq_id, shared)
                if shared == len(ids):
                    break
        return best

    def add(self, scope: str, seq_id: int, ids: array[int]) -> None:
        entries = self._index.setdefault(scope, [])
        self._index.move_to_end(scope)
        entries.append((seq_id, ids))
        self.ids += len(ids)
        if len(entries) > self.per_scope:
            self.ids -= len(entries.pop(0)[1])
        while self.ids > self.max_ids and len(self._index) > 1:
            _, dropped = self._index.popitem(last=False)
            self.ids -= sum(len(e[1]) for e in dropped)
