"""
Tests for amp.bulkhead: an origin's slots and its arrival-ordered queue,
without a reactor; and a generated model of calls arriving, ending, giving
up and being refused when a slot reaches them, checking that no slot is
ever lost or doubled and that waiters start in the order they came.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amp.bulkhead import Bulkhead


def test_slots_are_taken_up_to_the_limit_then_calls_wait() -> None:
    b: Bulkhead[str] = Bulkhead()
    assert b.enter(2) and b.enter(2)
    assert not b.enter(2)
    assert b.in_flight == 2
    assert b.wait("a", 2, max_queued=10)
    assert b.queued == 1


def test_a_free_slot_goes_to_the_first_waiter_not_a_new_arrival() -> None:
    b: Bulkhead[str] = Bulkhead()
    b.enter(1)
    b.wait("a", 1, 10)
    b.wait("b", 1, 10)
    b.release()
    # A call arriving now may not pass the waiters, though a slot is free.
    assert not b.enter(1)
    started: list[str] = []
    b.admit(started.append)
    assert started == ["a"]
    assert b.in_flight == 1
    assert b.head() == "b"


def test_admit_fills_every_free_slot_in_order() -> None:
    b: Bulkhead[str] = Bulkhead()
    for _ in range(3):
        b.enter(3)
    for w in "abcd":
        b.wait(w, 3, 10)
    b.release()
    b.release()
    started: list[str] = []
    b.admit(started.append)
    assert started == ["a", "b"]
    assert b.in_flight == 3 and b.queued == 2


def test_the_queue_is_bounded() -> None:
    b: Bulkhead[str] = Bulkhead()
    b.enter(1)
    assert b.wait("a", 1, 2) and b.wait("b", 1, 2)
    assert not b.wait("c", 1, 2)
    assert b.queued == 2
    assert not b.wait("d", 1, 0)


def test_a_waiter_that_gives_up_leaves_at_once() -> None:
    b: Bulkhead[str] = Bulkhead()
    b.enter(1)
    b.wait("a", 1, 10)
    b.wait("b", 1, 10)
    assert b.leave("a")
    assert not b.leave("a")
    assert b.queued == 1
    b.release()
    started: list[str] = []
    b.admit(started.append)
    assert started == ["b"]


def test_a_waiter_refused_when_its_slot_comes_passes_the_slot_on() -> None:
    # The slot's new holder is refused (its breaker opened meanwhile): it
    # releases at once from inside admit, and the next waiter gets it.
    b: Bulkhead[str] = Bulkhead()
    b.enter(1)
    for w in "abc":
        b.wait(w, 1, 10)
    started: list[str] = []

    def start(w: str) -> None:
        if w == "a":
            b.release()
            b.admit(start)  # re-entered: a no-op, the outer loop goes on
        else:
            started.append(w)

    b.release()
    b.admit(start)
    assert started == ["b"]
    assert b.in_flight == 1 and b.head() == "c"


def test_a_long_queue_refused_at_once_does_not_recurse() -> None:
    b: Bulkhead[int] = Bulkhead()
    b.enter(1)
    for i in range(5000):
        b.wait(i, 1, 10000)
    seen: list[int] = []

    def refuse(w: int) -> None:
        seen.append(w)
        b.release()
        b.admit(refuse)

    b.release()
    b.admit(refuse)
    assert seen == list(range(5000))
    assert b.in_flight == 0 and b.queued == 0


def test_a_head_with_a_smaller_limit_holds_the_ones_behind_it() -> None:
    b: Bulkhead[str] = Bulkhead()
    b.enter(4)
    b.enter(4)
    b.wait("small", 1, 10)
    b.wait("big", 4, 10)
    started: list[str] = []
    b.admit(started.append)
    assert started == []
    b.release()
    b.release()
    b.admit(started.append)
    assert started == ["small", "big"]


class BulkheadModel(RuleBasedStateMachine):
    """
    Calls arrive (taking a slot or waiting), calls in flight end, waiters
    give up, and a slot that reaches a waiter may be refused; the model
    keeps who holds a slot and who waits, in order.
    """

    LIMIT = 3
    MAX_QUEUED = 4

    def __init__(self) -> None:
        super().__init__()
        self.b: Bulkhead[int] = Bulkhead()
        self.next_id = 0
        self.holding: set[int] = set()
        self.waiting: list[int] = []
        self.started: list[int] = []
        self.refuse_next = False

    def _start(self, w: int) -> None:
        assert self.waiting and self.waiting[0] == w, "a waiter started out of order"
        self.waiting.pop(0)
        if self.refuse_next:
            self.b.release()
            return
        self.holding.add(w)
        self.started.append(w)

    @rule()
    def arrive(self) -> None:
        w = self.next_id
        self.next_id += 1
        if self.b.enter(self.LIMIT):
            assert not self.waiting
            self.holding.add(w)
            self.started.append(w)
        elif self.b.wait(w, self.LIMIT, self.MAX_QUEUED):
            self.waiting.append(w)
        else:
            assert len(self.waiting) == self.MAX_QUEUED

    @precondition(lambda self: self.holding)
    @rule(data=st.data(), refuse=st.booleans())
    def end(self, data: st.DataObject, refuse: bool) -> None:
        w = data.draw(st.sampled_from(sorted(self.holding)))
        self.holding.discard(w)
        self.b.release()
        self.refuse_next = refuse
        self.b.admit(self._start)
        self.refuse_next = False

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(self.waiting))
        assert self.b.leave(w)
        self.waiting.remove(w)
        self.b.admit(self._start)

    @invariant()
    def no_slot_is_lost_or_doubled(self) -> None:
        assert self.b.in_flight == len(self.holding) <= self.LIMIT
        assert self.b.queued == len(self.waiting) <= self.MAX_QUEUED

    @invariant()
    def nobody_waits_for_a_free_slot(self) -> None:
        if self.waiting:
            assert self.b.in_flight == self.LIMIT

    @invariant()
    def calls_start_in_arrival_order(self) -> None:
        assert self.started == sorted(self.started)


TestBulkheadModel = BulkheadModel.TestCase
