"""
The bulkhead of one endpoint origin: its calls in flight and the calls
waiting for a slot, in arrival order (pure: no reactor, no time).

A call takes a slot at once when fewer than its C{max_concurrent} calls are
in flight and nobody waits before it (L{Bulkhead.enter}); otherwise it may
wait in the origin's queue (L{Bulkhead.wait}), bounded by C{max_queued}.
When a call ends its slot is given back (L{Bulkhead.release}) and the
waiters at the head of the queue take the free slots in the order they
came (L{Bulkhead.admit}): a slot is handed over, never left free while
someone waits for it, and a later arrival never passes a waiter.  A waiter
that gives up (its review ended, or its deadline leaves no room for the call
any more) leaves the queue at once (L{Bulkhead.leave}).

How long a waiter may wait is its caller's business (L{amp.endpoint}: the
review's deadline less C{endpoints.min_call_time}, on the review's one
timer); this module only keeps the count and the order.

The queue is a dict (insertion-ordered, O(1) removal by key); each waiter
is kept with the C{max_concurrent} of its own settings: the head waits while
that many calls are in flight, and the waiters behind it wait for it.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Optional, TypeVar

W = TypeVar("W", bound=Hashable)


class Bulkhead(Generic[W]):
    """
    Slots in flight and an arrival-ordered queue for one origin.

    @ivar in_flight: calls holding a slot now.
    """

    __slots__ = ("in_flight", "_queue", "_admitting")

    def __init__(self) -> None:
        self.in_flight = 0
        self._queue: dict[W, int] = {}
        self._admitting = False

    def __repr__(self) -> str:
        return f"<Bulkhead in_flight={self.in_flight} queued={len(self._queue)}>"

    @property
    def queued(self) -> int:
        """Waiters in the queue now."""
        return len(self._queue)

    def enter(self, limit: int) -> bool:
        """
        Take a slot now, if fewer than C{limit} are taken and nobody waits
        (a waiter is never passed).
        """
        if self.in_flight < limit and not self._queue:
            self.in_flight += 1
            return True
        return False

    def wait(self, waiter: W, limit: int, max_queued: int) -> bool:
        """
        Queue C{waiter} behind the others, for a slot among C{limit}; false
        (and nothing queued) when C{max_queued} wait already.
        """
        if len(self._queue) >= max_queued:
            return False
        self._queue[waiter] = limit
        return True

    def leave(self, waiter: W) -> bool:
        """
        Take C{waiter} out of the queue (it gave up); false when it is not
        there (it was admitted, or had left already).
        """
        return self._queue.pop(waiter, None) is not None

    def waiting(self, waiter: W) -> bool:
        """Whether C{waiter} is in the queue."""
        return waiter in self._queue

    def release(self) -> None:
        """
        A call holding a slot ended: its slot is free (hand it on with
        L{admit}).
        """
        if self.in_flight > 0:
            self.in_flight -= 1

    def admit(self, start: Callable[[W], None]) -> None:
        """
        Give the free slots to the waiters at the head of the queue, in
        order: each is taken out of the queue holding a slot and passed to
        C{start}, which may L{release} it again at once (the waiter was
        refused after all), and the slot then goes to the next.  Called
        again from inside C{start} (a call that ends at once), it returns
        and the outer loop goes on: no recursion however long the queue.
        """
        if self._admitting:
            return
        self._admitting = True
        try:
            queue = self._queue
            while queue:
                waiter, limit = next(iter(queue.items()))
                if self.in_flight >= limit:
                    return
                del queue[waiter]
                self.in_flight += 1
                start(waiter)
        finally:
            self._admitting = False

    def head(self) -> Optional[W]:
        """The waiter that came first, or None."""
        for waiter in self._queue:
            return waiter
        return None
