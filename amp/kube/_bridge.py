"""
The one way from a watch thread to the reactor.

A L{Bridge} is the C{emit} of one L{amp.kube._watch.ListWatch}: called in the
thread with a typed event (L{amp.kube._events}), it hands the event to
C{reactor.callFromThread}, and the handler sees it on the reactor thread, in
the order the thread sent it.  Once L{Bridge.close} has run (on the reactor,
when the service stops or the watch is replaced), events still in flight
are dropped, so a stopped watch can never touch a newer run's state.
L{Bridge.finished}, the thread's last call, tells the reactor the thread has
ended (closed or not), so stopping waits for threads without polling them.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from twisted.internet.interfaces import IReactorFromThreads

from amp.kube._events import WatchEvent


class Bridge:
    """
    @param reactor: provides C{callFromThread}.
    @param handler: called on the reactor thread with each event.
    @param on_finished: called on the reactor thread once the thread has
        ended.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        handler: Callable[[WatchEvent], None],
        on_finished: Optional[Callable[[], None]] = None,
    ) -> None:
        self._call = reactor.callFromThread
        self._handler = handler
        self._on_finished = on_finished
        self.closed = False

    def __call__(self, event: WatchEvent) -> None:
        """Called in the thread: queue C{event} for the reactor."""
        self._call(self._deliver, event)

    def _deliver(self, event: WatchEvent) -> None:
        if not self.closed:
            self._handler(event)

    def finished(self) -> None:
        """Called in the thread as its very last act."""
        if self._on_finished is not None:
            self._call(self._on_finished)

    def close(self) -> None:
        """On the reactor: drop every event not delivered yet, and all later ones."""
        self.closed = True


def start_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """Run C{target} in a new daemon thread named C{name}."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
