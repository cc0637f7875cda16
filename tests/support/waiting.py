"""
Waiting for something another thread or another process does, with a hard
deadline: the suite's one place for it.

  - L{wait_until}: on the reactor, for a change made by a thread (a
    Kubernetes watch) or arriving over a loopback socket.  It polls the
    predicate every 10 ms with C{callLater} (never sleeping) and fails with
    L{WaitTimeout} after C{timeout} seconds.
  - L{poll_until}: blocking, for harnesses that drive another process (the
    end-to-end tests, the workers tests, the benchmark and the soak):
    calls C{probe} until it returns a result, sleeping between calls.  This
    is the one place outside the daemon where the suite sleeps.

What happens in-process in one thread needs neither: drive it with a
L{twisted.internet.task.Clock}.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What was awaited did not happen in time; the message says what."""


def _timed_out(what: str, timeout: float, details: Optional[Callable[[], str]]) -> WaitTimeout:
    extra = details() if details is not None else ""
    return WaitTimeout(f"timed out after {timeout:g}s waiting for {what}" + (f"\n{extra}" if extra else ""))


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    what: str = "condition",
    *,
    clock: Optional[IReactorTime] = None,
    details: Optional[Callable[[], str]] = None,
) -> Deferred:
    """
    Fire (with the predicate's result) once C{predicate()} returns a true
    value, checked now and then every 10 ms on C{clock} (default: the global
    reactor); fail with L{WaitTimeout} naming C{what} after C{timeout}
    seconds.  Cancelling the Deferred stops the polling.
    """
    if clock is None:
        from twisted.internet import reactor as clock  # type: ignore[assignment]
    assert clock is not None
    deadline = clock.seconds() + timeout
    pending: list[Any] = []

    def cancel(_: Deferred) -> None:
        for call in pending:
            if call.active():
                call.cancel()

    done: Deferred = Deferred(cancel)

    def check() -> None:
        pending.clear()
        try:
            result = predicate()
        except BaseException as e:  # a broken predicate fails the wait at once
            done.errback(e)
            return
        if result:
            done.callback(result)
        elif clock.seconds() >= deadline:
            done.errback(_timed_out(what, timeout, details))
        else:
            pending.append(clock.callLater(0.01, check))

    check()
    return done


def poll_until(
    what: str,
    probe: Callable[[], Optional[T]],
    timeout: float,
    details: Optional[Callable[[], str]] = None,
    *,
    interval: float = 0.05,
) -> T:
    """
    Call C{probe} until it returns something other than None or False, and
    return that; raise L{WaitTimeout} saying C{what} was awaited (and
    C{details()}, e.g. a process's log tail) after C{timeout} seconds.
    Blocking: only for harnesses waiting on another process.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, details)
        time.sleep(interval)
