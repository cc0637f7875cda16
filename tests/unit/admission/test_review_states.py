"""
Reviews in flight against endpoints that do anything, in any order: a
stateful property test of the review's path from L{Admitter.review_into}
through amp's endpoint client and pooled connections, on a memory reactor.

Hypothesis draws a chain (one to three endpoints over two origins, Ignore
or Fail, endpoint timeouts shorter and longer than the reviews' budgets,
retry on or off, a concurrency limit, its queue and how long a review may
wait in it) and a namespace source (static, or
one whose lookups the test answers or fails), then interleaves: new
reviews, connection attempts accepted or refused, replies (a patch, no
change, a 500, bytes that are not HTTP, a close), closes that take a while
to complete, time passing, clients going away, lookups answered.

What must hold whatever happens, as the API server and the operator see
it: a review is answered at most once and, while it waits, its deadline's
timer is set; in the end every review was answered exactly once, no call
is still counted in flight (its breaker ticket is back) or waiting for a
slot, no timer is left
but the pools' idle expiry, and nothing was logged as a failure (amp's own
bug).
"""

from __future__ import annotations

from typing import Any, Optional

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.logger import globalLogPublisher

from amp.admission import Admitter
from amp.admission._state import IllegalReviewTransition, ReviewState, check_review
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import NamespaceInfo, NamespaceLookupError, StaticNamespaceSource
from tests.support.endpoint_harness import ClientTransport, MemoryNet, SlowCloseTransport, http_reply
from tests.support.helpers import FakeSource, make_config, namespace, review_bytes

_ORIGINS = ("http://127.0.0.1:8090", "http://127.0.0.1:8091")
_PATCH = b'[{"op":"add","path":"/metadata/labels/touched","value":"yes"}]'


class _Reviewed:
    """One review started by the test: the answers it got, and the review while it waits."""

    def __init__(self) -> None:
        self.answers = 0
        #: The review while it waits (L{Admitter.review_into}), None if answered at once.
        self.review: Any = None

    def answered(self, answer: Any) -> None:
        self.answers += 1


class ReviewStates(RuleBasedStateMachine):
    @initialize(
        steps=st.integers(1, 3),
        origins=st.lists(st.sampled_from(_ORIGINS), min_size=3, max_size=3),
        policy=st.sampled_from(["Ignore", "Fail"]),
        timeout=st.sampled_from(["50ms", "250ms", "400ms", "1s", "30s"]),
        retry=st.booleans(),
        max_concurrent=st.sampled_from([1, 2, 64]),
        max_queued=st.sampled_from([0, 1, 1024]),
        min_call_time=st.sampled_from(["0s", "100ms", "250ms"]),
        lookups=st.booleans(),
        slow_close=st.booleans(),
    )
    def chain(
        self,
        steps: int,
        origins: list[str],
        policy: str,
        timeout: str,
        retry: bool,
        max_concurrent: int,
        max_queued: int,
        min_call_time: str,
        lookups: bool,
        slow_close: bool,
    ) -> None:
        self.urls = " ".join(f"{origins[i]}/step{i}" for i in range(steps))
        self.policy = policy
        config = make_config(
            {"team-a": namespace(self.urls, failure_policy=policy)},
            endpoints={
                "timeout": timeout,
                "retry": retry,
                "max_concurrent": max_concurrent,
                "max_queued": max_queued,
                "min_call_time": min_call_time,
            },
        )
        self.net = MemoryNet()
        self.clock = self.net.reactor
        metrics = Metrics()
        self.client = EndpointClient(self.clock, metrics, BreakerRegistry(self.clock))
        self.lookups = FakeSource() if lookups else None
        source = self.lookups if self.lookups is not None else StaticNamespaceSource(config.kubernetes)
        self.admitter = Admitter(config, source, self.client, self.clock, metrics)
        self.transport_class = SlowCloseTransport if slow_close else ClientTransport
        self.reviews: list[_Reviewed] = []
        self.connections: list[tuple[Any, Any]] = []
        #: Connect attempts the test has accepted or refused.
        self.handled = 0
        self.failures: list[str] = []
        self._observer = self._watch_failures
        globalLogPublisher.addObserver(self._observer)

    def _watch_failures(self, event: dict) -> None:
        failure = event.get("log_failure")
        if failure is not None:
            self.failures.append(failure.getTraceback())

    def teardown(self) -> None:
        try:
            if hasattr(self, "reviews"):
                self.check_the_end()
        finally:
            if hasattr(self, "_observer"):
                globalLogPublisher.removeObserver(self._observer)

    # ------------------------------------------------------------ what the test sees

    def _attempts_waiting(self) -> bool:
        self._skip_stopped()
        return self.handled < self.net.attempts

    def _skip_stopped(self) -> None:
        # Attempts the client gave up on itself (a cancelled connect) are
        # not the test's to answer.
        connectors = self.clock.connectors
        while self.handled < self.net.attempts and getattr(connectors[self.handled], "stoppedConnecting", False):
            self.handled += 1

    def _asked(self) -> list[tuple[Any, Any]]:
        """Open connections with a request written and not yet answered."""
        return [(p, t) for p, t in self.connections if t.value() and t.connected and not t.disconnecting]

    def _closing(self) -> list[tuple[Any, Any]]:
        return [(p, t) for p, t in self.connections if t.connected and t.disconnecting]

    def _waiting(self) -> list[_Reviewed]:
        return [r for r in self.reviews if r.review is not None and not r.review.done]

    # ------------------------------------------------------------ rules

    @rule(budget=st.sampled_from([0.3, 0.45, 1.5, 9.5]))
    def start_review(self, budget: float) -> None:
        reviewed = _Reviewed()
        reviewed.review = self.admitter.review_into(
            reviewed.answered, parse_review(review_bytes()), Deadline.after(self.clock.seconds(), budget)
        )
        self.reviews.append(reviewed)

    @precondition(lambda self: self._attempts_waiting())
    @rule()
    def accept(self) -> None:
        self.connections.append(self.net.accept(self.handled, self.transport_class))
        self.handled += 1

    @precondition(lambda self: self._attempts_waiting())
    @rule()
    def refuse(self) -> None:
        self.net.fail(ConnectionRefusedError(), self.handled)
        self.handled += 1

    @precondition(lambda self: bool(self._asked()))
    @rule(
        which=st.integers(0, 1000),
        reply=st.sampled_from(
            [
                http_reply(_PATCH),
                http_reply(b"[]"),
                http_reply(b"oops", code=500),
                b"garbage\r\n\r\n",
                http_reply(b"[]", extra=b"Connection: close\r\n"),
                None,
            ]
        ),
    )
    def endpoint_answers(self, which: int, reply: Optional[bytes]) -> None:
        asked = self._asked()
        protocol, transport = asked[which % len(asked)]
        transport.clear()
        if reply is None:
            StringTransportWithDisconnection.loseConnection(transport)
        else:
            protocol.dataReceived(reply)

    @precondition(lambda self: bool(self._closing()))
    @rule(which=st.integers(0, 1000))
    def close_completes(self, which: int) -> None:
        closing = self._closing()
        _, transport = closing[which % len(closing)]
        transport.closed()

    @rule(seconds=st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.3, 1.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self._waiting()))
    @rule(which=st.integers(0, 1000))
    def client_goes_away(self, which: int) -> None:
        waiting = self._waiting()
        review = waiting[which % len(waiting)].review
        assert review is not None
        review.cancel()

    @precondition(lambda self: self.lookups is not None and any(not d.called for _, _, d in self.lookups.fetches))
    @rule(which=st.integers(0, 1000), found=st.booleans())
    def lookup_answers(self, which: int, found: bool) -> None:
        assert self.lookups is not None
        open_fetches = [d for _, _, d in self.lookups.fetches if not d.called]
        d = open_fetches[which % len(open_fetches)]
        if found:
            d.callback(
                NamespaceInfo(
                    "team-a",
                    {"amp.txn2.com/enabled": "true"},
                    {"amp.txn2.com/ep": self.urls, "amp.txn2.com/failure-policy": self.policy},
                )
            )
        else:
            d.errback(NamespaceLookupError("the API server did not answer"))

    # ------------------------------------------------------------ what must hold

    @invariant()
    def answered_at_most_once_and_timed_while_waiting(self) -> None:
        if not hasattr(self, "reviews"):
            return
        timed = {id(getattr(call.func, "__self__", None)) for call in self.clock.getDelayedCalls() if call.active()}
        for reviewed in self.reviews:
            assert reviewed.answers <= 1, "a review was answered twice"
            review = reviewed.review
            if review is None or review.done:
                assert reviewed.answers == 1, "a review ended without an answer"
                assert review is None or review.state is ReviewState.ANSWERED
            else:
                assert reviewed.answers == 0
                # At rest, a review not answered waits on exactly one step.
                assert review.state in (ReviewState.LOOKING_UP, ReviewState.CALLING), review.state
                assert id(review.waiting) in timed, "a review waits with no timer for its deadline"
        assert not self.failures, self.failures[0]

    def check_the_end(self) -> None:
        """Everything the endpoints and lookups still owe fails or closes; then what must be true."""
        for _ in range(40):
            if self.lookups is not None:
                for _, _, d in self.lookups.fetches:
                    if not d.called:
                        d.errback(NamespaceLookupError("late"))
            for _, transport in self._closing():
                transport.closed()
            while self._attempts_waiting():
                self.net.fail(ConnectionRefusedError(), self.handled)
                self.handled += 1
            self.clock.advance(1.0)
        assert [r.answers for r in self.reviews] == [1] * len(self.reviews)
        for origin in _ORIGINS:
            assert self.client.in_flight(origin) == 0, f"calls still counted in flight on {origin}"
            assert self.client.queued(origin) == 0, f"calls still waiting for a slot on {origin}"
        left = [call for call in self.clock.getDelayedCalls() if getattr(call.func, "__name__", "") != "_expire"]
        assert left == [], f"timers left: {left}"
        assert not self.failures, self.failures[0]


ReviewStates.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
ReviewStatesTests = ReviewStates.TestCase


def test_a_review_transition_not_in_the_table_is_refused_by_name() -> None:
    """An answered review goes nowhere; a review waits on one step at a time."""
    assert check_review(ReviewState.CALLING, ReviewState.TIMED_OUT) is ReviewState.TIMED_OUT
    for old, new in [(ReviewState.ANSWERED, ReviewState.CALLING), (ReviewState.LOOKING_UP, ReviewState.CALLING)]:
        try:
            check_review(old, new)
        except IllegalReviewTransition as e:
            assert f"{old.name} -> {new.name}" in str(e)
        else:
            raise AssertionError(f"{old.name} -> {new.name} allowed")
