from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from agl_lite.store.packed_ids import (
    MIN_SHARED,
    PrefixIndex,
    SeqRow,
    common_prefix_len,
    pack,
    resolve,
    unpack,
)

ids = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300)


@given(ids)
def test_pack_round_trips(values: list[int]) -> None:
    assert unpack(pack(array("I", values))).tolist() == values


def test_pack_is_four_bytes_a_token() -> None:
    assert len(pack(array("I", range(1000)))) == 4000


@given(ids, ids, ids)
def test_common_prefix_len_matches_a_plain_loop(prefix: list[int], a: list[int], b: list[int]) -> None:
    x, y = prefix + a, prefix + b
    expected = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    assert common_prefix_len(array("I", x), array("I", y)) == expected


def test_resolve_follows_a_chain() -> None:
    rows = {
        1: SeqRow(None, 0, array("I", [1, 2, 3])),
        2: SeqRow(1, 3, array("I", [4, 5])),
        3: SeqRow(2, 4, array("I", [9])),  # shares only part of its parent
    }
    assert resolve(3, rows.__getitem__).tolist() == [1, 2, 3, 4, 9]


def test_index_prefers_the_longest_shared_prefix() -> None:
    index = PrefixIndex()
    base = array("I", range(100))
    index.add("att", 1, array("I", base[:40]))
    index.add("att", 2, base)
    index.add("other", 3, array("I", range(200)))
    assert index.best_parent("att", array("I", [*range(100), 7, 7])) == (2, 100)
    assert index.best_parent("att", array("I", [*range(50), 5])) == (2, 50)


def test_index_ignores_short_shares_and_unknown_scopes() -> None:
    index = PrefixIndex()
    index.add("att", 1, array("I", range(100)))
    assert index.best_parent("att", array("I", [*range(MIN_SHARED - 1), 999])) is None
    assert index.best_parent("nope", array("I", range(100))) is None


def test_index_is_bounded_by_total_ids() -> None:
    index = PrefixIndex(max_ids=250)
    for scope in range(5):
        index.add(f"s{scope}", scope, array("I", range(100)))
    assert index.ids <= 250
    assert index.best_parent("s0", array("I", range(100))) is None  # least recently used: dropped
    assert index.best_parent("s4", array("I", range(100))) == (4, 100)
