"""
Tests for amp.memo: a memo never holds more than its size, forgets the
entry written least recently first (one at a time, never all at once), and
reads like the dict it is.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp.memo import Memo


def test_a_full_memo_forgets_the_entry_written_least_recently() -> None:
    memo: Memo[str, int] = Memo(3)
    for i, key in enumerate("abcd"):
        memo[key] = i
    assert list(memo.items()) == [("b", 1), ("c", 2), ("d", 3)]


def test_a_read_does_not_keep_an_entry() -> None:
    """Reads move nothing (they stay a dict's): the oldest write goes first even if just read."""
    memo: Memo[str, int] = Memo(2)
    memo["a"], memo["b"] = 1, 2
    assert memo.get("a") == 1 and memo["a"] == 1 and "a" in memo
    memo["c"] = 3
    assert "a" not in memo and memo.get("a") is None
    assert dict(memo) == {"b": 2, "c": 3}


def test_writing_a_known_key_evicts_nothing() -> None:
    memo: Memo[str, int] = Memo(2)
    memo["a"], memo["b"] = 1, 2
    memo["a"] = 10
    assert dict(memo) == {"a": 10, "b": 2}


def test_every_way_of_writing_is_bounded() -> None:
    memo: Memo[int, int] = Memo(4)
    memo.update({i: i for i in range(10)})
    for i in range(10, 20):
        memo.setdefault(i, i)
    assert list(memo) == [16, 17, 18, 19]


def test_a_copy_and_a_pickle_keep_the_size_and_the_order() -> None:
    memo: Memo[str, int] = Memo(2)
    memo["a"], memo["b"] = 1, 2
    for again in (copy.copy(memo), pickle.loads(pickle.dumps(memo))):
        assert again.size == 2 and list(again.items()) == [("a", 1), ("b", 2)]
        again["c"] = 3
        assert list(again) == ["b", "c"]


def test_a_memo_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one entry, not 0"):
        Memo(0)


@given(st.integers(min_value=1, max_value=8), st.lists(st.integers(min_value=0, max_value=20), max_size=60))
def test_a_memo_holds_the_latest_distinct_writes(size: int, keys: list[int]) -> None:
    """Against a model: after any writes, the memo holds the last C{size} keys written first, in that order."""
    memo: Memo[int, int] = Memo(size)
    model: list[int] = []
    for n, key in enumerate(keys):
        memo[key] = n
        if key not in model:
            model.append(key)
            if len(model) > size:
                model.pop(0)
    assert len(memo) <= size
    assert list(memo) == model
    assert all(memo[key] == max(n for n, k in enumerate(keys) if k == key) for key in memo)
