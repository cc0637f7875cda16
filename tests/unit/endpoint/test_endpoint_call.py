"""
One endpoint call (amp.endpoint._call, _client, _failures): its one timer,
cancellation by the caller, the bulkhead, the breaker, retries, the names of
failures, what goes on the wire, and the call seen through the Admitter.

Time is a Clock or a MemoryReactorClock throughout; what goes on the wire
and shadow mode over a loopback server are in
tests/integration/loopback/test_endpoint_call.py.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Optional

from twisted.internet import defer
from twisted.internet import error as ierror
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from amp.admission import Admitter
from amp.admission_review import parse_review
from amp.breaker import CLOSED, HALF_OPEN, OPEN, BreakerRegistry
from amp.config import BreakerConfig, EndpointSettings, parse_config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient, EndpointFailure, EndpointRequest, deferred_call
from amp.endpoint._failures import LocalFailure, classify
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.reasons import ENDPOINT_REASONS
from amp.reply import EndpointDecision
from amp.urls import parse_endpoint_url
from tests.support.endpoint_harness import (
    FailureAssertions,
    Harness,
    Hung,
    MemoryNet,
    NoAddresses,
    ResourceConnector,
    Switchable,
    http_reply,
    requests_total,
    review_body,
)

URL = "http://127.0.0.1:8090/mutate"
ORIGIN = "http://127.0.0.1:8090"


# ---------------------------------------------------------------- every reason is tested


#: Where most of the reasons' tests live (module paths under tests/).
READING = "integration.loopback.test_endpoint_reading."
QUEUE = "unit.endpoint.test_bulkhead_queue."


class ReasonCoverageTests(SynchronousTestCase):
    #: reason -> the test that provokes it through EndpointClient.call and
    #: the metric ("module.Class.test", the module's path under tests).
    TESTS = {
        "timeout": "unit.endpoint.test_endpoint_call.OneTimerTests.test_endpoint_timeout_shorter_than_the_time_left",
        "connection-refused": READING + "LoopbackReplyTests.test_refused",
        "connection-reset": READING + "LoopbackReplyTests.test_reset_mid_reply",
        "connection-failed": "unit.endpoint.test_endpoint_call.ConnectTests.test_name_that_does_not_resolve",
        "denied-address": "unit.endpoint.test_endpoint_call.ConnectTests.test_name_resolving_into_deny_networks",
        "tls-error": "integration.loopback.test_endpoint_tls.MutualTLSTests.test_wrong_ca_is_a_tls_error",
        "redirect": READING + "LoopbackReplyTests.test_redirect_is_not_followed",
        "http-4xx": READING + "LoopbackReplyTests.test_http_4xx",
        "http-5xx": READING + "LoopbackReplyTests.test_http_5xx",
        "response-too-large": READING + "LoopbackReplyTests.test_content_length_over_the_limit_fails_fast",
        "response-headers-too-large": READING
        + "LoopbackHeadTests.test_an_endpoint_streaming_header_lines_is_refused_long_before_its_timeout",
        "reply-buffer-full": READING + "ReplyBudgetTests.test_concurrent_bodies_stay_within_the_budget",
        "invalid-json": READING + "LoopbackReplyTests.test_non_json",
        "invalid-reply": READING + "LoopbackReplyTests.test_json_of_the_wrong_shape",
        "breaker-open": "unit.endpoint.test_endpoint_call.BreakerIntegrationTests.test_trip_refuse_trial_close",
        "queue-full": QUEUE + "QueueTests.test_calls_over_max_concurrent_and_max_queued_fail_fast",
        "queue-timeout": QUEUE + "QueueTests.test_a_waiter_fails_when_its_deadline_leaves_too_little_for_the_call",
        "latency-budget": QUEUE + "LatencyBudgetTests.test_an_origin_over_its_budget_is_shed_then_probed_back",
    }

    def test_every_reason_has_a_test(self) -> None:
        self.assertEqual(set(self.TESTS), set(ENDPOINT_REASONS))
        for reason, name in self.TESTS.items():
            module, cls, method = name.rsplit(".", 2)
            found = getattr(getattr(importlib.import_module(f"tests.{module}"), cls, None), method, None)
            self.assertTrue(callable(found), f"{reason}: {name} is missing")


# ---------------------------------------------------------------- the one timer


class OneTimerTests(SynchronousTestCase, FailureAssertions):
    """
    A call has a time of its own (its expiry, which its caller's one timer
    times) only when the endpoint's timeout is shorter than the caller's
    time left; otherwise the caller's deadline is the one timer, and the
    caller cancels.  The call itself arms no timer.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.hung = Hung()

    def harness(self, settings: Optional[EndpointSettings] = None) -> Harness:
        return Harness(self.clock, settings, connector=ResourceConnector(self.hung))

    def test_endpoint_timeout_shorter_than_the_time_left(self) -> None:
        h = self.harness(EndpointSettings(timeout=1.0, breaker=BreakerConfig(consecutive_failures=1)))
        d = h.call(URL, budget=9.5)
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [1.0])
        self.clock.advance(0.999)
        self.assertNoResult(d)
        self.clock.advance(0.001)
        e = self.assertReason(d, "timeout")
        self.assertIn("no reply within 1s", e.message)
        self.assertEqual(h.count(URL, "timeout"), 1)
        self.assertEqual(
            h.metrics.registry.get_sample_value("amp_endpoint_duration_seconds_sum", {"endpoint": ORIGIN}), 1.0
        )
        # The endpoint's own timeout is a verdict on the endpoint.
        self.assertEqual(h.breaker(URL).state, OPEN)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_no_timer_of_its_own_when_the_caller_has_less_time(self) -> None:
        h = self.harness(EndpointSettings(timeout=5.0))
        call, told = h.start(URL, budget=1.5)
        self.assertIsNone(call.expires)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(60)
        self.assertEqual((told.replies, told.failures), ([], []))

    def test_no_timer_of_its_own_when_the_times_are_equal(self) -> None:
        h = self.harness(EndpointSettings(timeout=2.0))
        call, _ = h.start(URL, budget=2.0)
        self.assertIsNone(call.expires)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_the_callers_deadline_ends_the_call_without_a_verdict(self) -> None:
        # The caller cancels when its deadline passes: the call had all its
        # time and timed out, but the review's deadline is not the
        # endpoint's fault.
        settings = EndpointSettings(timeout=5.0, breaker=BreakerConfig(consecutive_failures=1))
        h = self.harness(settings)
        for _ in range(3):
            d = h.call(URL, budget=1.0)
            self.clock.advance(1.0)
            e = self.assertReason(d, "timeout")
            self.assertEqual(e.message, "no reply within 1s")
        self.assertEqual(h.count(URL, "timeout"), 3)
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertEqual(h.client.in_flight(ORIGIN), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_the_caller_going_away_is_cancelled(self) -> None:
        settings = EndpointSettings(timeout=5.0, breaker=BreakerConfig(consecutive_failures=1))
        h = self.harness(settings)
        for _ in range(3):
            d = h.call(URL, budget=2.0)
            self.clock.advance(0.5)
            d.cancel()
            self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(h.count(URL, "cancelled"), 3)
        self.assertEqual(sum(h.count(URL, r) for r in ENDPOINT_REASONS), 0)
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertEqual(h.client.in_flight(ORIGIN), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_caller_cancel_releases_the_half_open_trial(self) -> None:
        settings = EndpointSettings(
            timeout=1.0, breaker=BreakerConfig(consecutive_failures=1, cooldown=5.0, half_open_requests=1)
        )
        h = self.harness(settings)
        d = h.call(URL)
        self.clock.advance(1.0)
        self.assertReason(d, "timeout")
        self.clock.advance(5.0)
        trial = h.call(URL)
        self.assertEqual(h.breaker(URL).state, HALF_OPEN)
        self.assertReason(h.call(URL), "breaker-open")
        trial.cancel()
        self.failureResultOf(trial, defer.CancelledError)
        # Nothing learned, slot free: the next call is the trial.
        self.assertEqual(h.breaker(URL).state, HALF_OPEN)
        self.assertNoResult(h.call(URL))

    def test_no_time_left_fails_without_a_request(self) -> None:
        h = self.harness()
        self.assertReason(h.call(URL, budget=0.0), "timeout")
        self.assertEqual(self.hung.held, [])
        self.assertEqual(h.breaker(URL).state, CLOSED)

    def test_overrides_give_each_url_its_timeout(self) -> None:
        config = parse_config(
            {
                "endpoints": {
                    "allow": ["http://127.0.0.1:*/*"],
                    "timeout": "5s",
                    "overrides": [
                        {"match": "http://127.0.0.1:8090/hang*", "timeout": "1s"},
                        {"match": "http://127.0.0.1:8090/*", "timeout": "3s"},
                    ],
                }
            }
        )
        endpoints = config.endpoints
        hang = parse_endpoint_url("http://127.0.0.1:8090/hang-forever")
        other = parse_endpoint_url("http://127.0.0.1:8090/slow")
        elsewhere = parse_endpoint_url("http://127.0.0.1:8091/hang")
        # First matching override wins.
        self.assertEqual(endpoints.settings_for(hang).timeout, 1.0)
        self.assertEqual(endpoints.settings_for(other).timeout, 3.0)
        self.assertEqual(endpoints.settings_for(elsewhere).timeout, 5.0)
        client = EndpointClient(
            self.clock, Metrics(), BreakerRegistry(self.clock), connector=ResourceConnector(self.hung)
        )
        deadline = Deadline.after(self.clock.seconds(), 9.5)
        calls = {
            u: deferred_call(client, EndpointRequest(u, endpoints.settings_for(u), b"{}", {}, deadline))
            for u in (hang, other, elsewhere)
        }
        self.clock.advance(1.0)
        self.assertReason(calls[hang], "timeout")
        self.assertNoResult(calls[other])
        self.clock.advance(2.0)
        self.assertReason(calls[other], "timeout")
        self.assertNoResult(calls[elsewhere])
        self.clock.advance(2.0)
        self.assertReason(calls[elsewhere], "timeout")


# ---------------------------------------------------------------- connecting and retries on a memory network


class ConnectTests(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.net = MemoryNet()

    def harness(self, **kw: Any) -> Harness:
        return Harness(self.net.reactor, EndpointSettings(**kw))

    def test_connect_timeout_reaches_the_connect(self) -> None:
        h = self.harness(connect_timeout=0.25)
        d = h.call(URL)
        self.assertEqual(self.net.connect_timeout(), 0.25)
        self.net.fail(ierror.TimeoutError())
        e = self.assertReason(d, "timeout")
        self.assertIn("connect", e.message)
        self.assertEqual(h.count(URL, "timeout"), 1)

    def test_refused_is_reported_at_once(self) -> None:
        # No waiting on HostnameEndpoint's 0.3s attempt beat: an IP literal
        # fails as soon as the connect does ...
        h = self.harness()
        d = h.call(URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        # ... and a host name within amp's 50ms beat.
        d = h.call("http://endpoint.test:8090/mutate")
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertNoResult(d)
        self.net.reactor.advance(0.05)
        self.assertReason(d, "connection-refused")

    def test_name_that_does_not_resolve(self) -> None:
        self.net.reactor.nameResolver = NoAddresses()
        h = self.harness()
        url = "http://amp-test.invalid:8090/mutate"
        d = h.call(url)
        self.assertEqual(self.net.attempts, 0)
        e = self.assertReason(d, "connection-failed")
        self.assertIn("resolve", e.message)
        self.assertEqual(h.count(url, "connection-failed"), 1)

    def test_name_resolving_into_deny_networks(self) -> None:
        # The memory reactor resolves every name to 127.0.0.1.  More on
        # denied addresses in test_ssrf.py.
        settings = EndpointSettings(
            deny_networks=parse_config({"endpoints": {"deny_networks": ["loopback"]}}).endpoints.deny_networks,
            breaker=BreakerConfig(consecutive_failures=1),
        )
        h = Harness(self.net.reactor, settings)
        url = "http://endpoint.test:8090/mutate"
        e = self.assertReason(h.call(url), "denied-address")
        self.assertIn("127.0.0.1", e.message)
        self.assertEqual(self.net.attempts, 0)
        self.assertEqual(h.count(url, "denied-address"), 1)
        self.assertEqual(h.breaker(url).state, CLOSED)

    def test_other_connect_error_is_connection_failed(self) -> None:
        h = self.harness()
        d = h.call(URL)
        self.net.fail(ierror.NoRouteError())
        self.assertReason(d, "connection-failed")

    def test_a_request_that_cannot_be_built_hands_its_ticket_back(self) -> None:
        settings = EndpointSettings(breaker=BreakerConfig(consecutive_failures=1, half_open_requests=1))
        h = Harness(self.net.reactor, settings)
        d = h.call(URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.net.reactor.advance(settings.breaker.cooldown)
        not_bytes: Any = {b"x-bad": 5}
        bad = deferred_call(
            h.client,
            EndpointRequest(
                parse_endpoint_url(URL), settings, b"{}", not_bytes, Deadline.after(self.net.reactor.seconds(), 5.0)
            ),
        )
        self.assertReason(bad, "connection-failed")
        self.assertEqual(len(self.flushLoggedErrors()), 1)
        # The half-open trial slot is free again: the next call goes out.
        h.call(URL)
        self.assertEqual(self.net.attempts, 2)

    def test_hung_endpoint_times_out_and_its_connection_is_aborted(self) -> None:
        h = self.harness(timeout=2.0)
        d = h.call(URL, budget=5.0)
        _, transport = self.net.accept()
        self.net.reactor.advance(1.999)
        self.assertNoResult(d)
        self.net.reactor.advance(0.001)
        e = self.assertReason(d, "timeout")
        self.assertIn("2s", e.message)
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.idle_connections(), 0)

    def test_caller_cancel_aborts_the_connection(self) -> None:
        h = self.harness()
        d = h.call(URL, budget=2.0)
        _, transport = self.net.accept()
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertFalse(transport.connected)
        self.assertEqual(h.count(URL, "cancelled"), 1)

    # -------- retries

    def test_no_retry_by_default(self) -> None:
        h = self.harness()
        d = h.call(URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 1)

    def test_retry_once_after_refused(self) -> None:
        h = self.harness(retry=True)
        d = h.call(URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertEqual(self.net.attempts, 2)
        proto, _ = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])
        self.assertEqual(h.count(URL, "ok"), 1)
        self.assertEqual(h.count(URL, "connection-refused"), 0)

    def test_retry_at_most_once(self) -> None:
        h = self.harness(retry=True)
        d = h.call(URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 2)

    def test_no_retry_after_a_connect_timeout(self) -> None:
        h = self.harness(retry=True)
        d = h.call(URL)
        self.net.fail(ierror.TimeoutError())
        self.assertReason(d, "timeout")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_after_the_call_timed_out(self) -> None:
        h = self.harness(retry=True, timeout=1.0)
        d = h.call(URL)
        self.net.reactor.advance(1.0)
        self.assertReason(d, "timeout")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_once_the_reply_started(self) -> None:
        h = self.harness(retry=True)
        d = h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n[")
        transport.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_when_the_request_was_sent(self) -> None:
        h = self.harness(retry=True)
        d = h.call(URL)
        proto, transport = self.net.accept()
        self.assertIn(b"POST", transport.value())
        transport.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_without_time_left(self) -> None:
        h = self.harness(retry=True, timeout=2.0)
        d = h.call(URL)
        self.net.reactor.advance(1.5)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 1)

    def test_retry_within_the_callers_time(self) -> None:
        # Half of the caller's time left, when that is the shorter.
        h = self.harness(retry=True, timeout=30.0)
        d = h.call(URL, budget=2.0)
        self.net.reactor.advance(0.9)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertEqual(self.net.attempts, 2)
        self.assertNoResult(d)


# ---------------------------------------------------------------- bulkhead and breaker (Clock + in-memory resources)


class BulkheadTests(SynchronousTestCase, FailureAssertions):
    # Waiting for a slot: tests/unit/endpoint/test_bulkhead_queue.py.
    def test_failures_and_cancels_free_their_slot(self) -> None:
        clock = Clock()
        hung = Hung()
        h = Harness(clock, EndpointSettings(max_concurrent=1, timeout=1.0), connector=ResourceConnector(hung))
        d = h.call(URL)
        clock.advance(1.0)
        self.assertReason(d, "timeout")
        d = h.call(URL, budget=0.5)
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertNoResult(h.call(URL))


class BreakerIntegrationTests(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.clock = Clock()
        self.resource = Switchable(500)
        self.settings = EndpointSettings(
            timeout=2.0,
            breaker=BreakerConfig(consecutive_failures=2, cooldown=5.0, max_cooldown=60.0, half_open_requests=1),
        )
        self.h = Harness(self.clock, self.settings, connector=ResourceConnector(self.resource))

    def deadline(self) -> Deadline:
        return Deadline.after(self.clock.seconds(), 9.5)

    def test_trip_refuse_trial_close(self) -> None:
        h = self.h
        self.assertReason(h.call(URL), "http-5xx")
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertReason(h.call(URL), "http-5xx")
        self.assertEqual(h.breaker(URL).state, OPEN)
        # Open: refused without reaching the endpoint.
        e = self.assertReason(h.call(URL), "breaker-open")
        self.assertIn("breaker open", e.message)
        self.assertEqual(self.resource.hits, 2)
        self.clock.advance(4.9)
        self.assertReason(h.call(URL), "breaker-open")
        self.assertEqual(self.resource.hits, 2)
        # Cool-down over: one trial goes through, and its success closes.
        self.clock.advance(0.1)
        self.resource.status = 200
        self.assertEqual(self.successResultOf(h.call(URL)).patch, [])
        self.assertEqual(self.resource.hits, 3)
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertEqual([s for _, s in h.transitions], [OPEN, HALF_OPEN, CLOSED])
        self.assertEqual(h.count(URL, "breaker-open"), 2)

    def test_half_open_allows_only_the_trial(self) -> None:
        h = Harness(self.clock, self.settings, connector=ResourceConnector(Hung()))
        breaker = h.breaker(URL)
        for _ in range(2):
            d = h.call(URL)
            self.clock.advance(2.0)
            self.assertReason(d, "timeout")
        self.assertEqual(breaker.state, OPEN)
        self.clock.advance(5.0)
        trial = h.call(URL)
        self.assertReason(h.call(URL), "breaker-open")
        self.clock.advance(2.0)
        self.assertReason(trial, "timeout")
        # The failed trial re-opens it, for longer.
        self.assertEqual(breaker.state, OPEN)
        self.assertGreater(breaker.reopens_in(), 5.0)

    def test_breaker_settings_come_from_the_origin(self) -> None:
        # An override for one path with its own breaker block does not give
        # the origin a second, flip-flopping breaker.
        strict = EndpointSettings(timeout=2.0, breaker=BreakerConfig(consecutive_failures=1))
        h = self.h
        self.assertReason(h.call(URL, settings=strict), "http-5xx")
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertReason(h.call(URL), "http-5xx")
        self.assertEqual(h.breaker(URL).state, OPEN)
        self.assertEqual(len([s for _, s in h.transitions if s == OPEN]), 1)

    def test_breaker_state_gauge_follows_transitions(self) -> None:
        # The wiring service.py does: on_change -> amp_circuit_breaker_state.
        from amp.metrics import BREAKER_STATE_VALUES

        metrics = Metrics()
        breakers = BreakerRegistry(
            self.clock, lambda origin, state: metrics.breaker_state.labels(origin).set(BREAKER_STATE_VALUES[state])
        )
        client = EndpointClient(self.clock, metrics, breakers, connector=ResourceConnector(self.resource))
        gauge = lambda: metrics.registry.get_sample_value(  # noqa: E731
            "amp_circuit_breaker_state", {"endpoint": ORIGIN}
        )
        url = parse_endpoint_url(URL)
        for _ in range(2):
            self.assertReason(
                deferred_call(client, EndpointRequest(url, self.settings, b"{}", {}, self.deadline())), "http-5xx"
            )
        self.assertEqual(gauge(), 2)
        self.clock.advance(5.0)
        self.resource.status = 200
        self.successResultOf(deferred_call(client, EndpointRequest(url, self.settings, b"{}", {}, self.deadline())))
        self.assertEqual(gauge(), 0)


# ---------------------------------------------------------------- classify (unit)


class ClassifyTests(SynchronousTestCase):
    def reason(self, exc: Exception) -> str:
        return classify(Failure(exc)).reason

    def test_names(self) -> None:
        from OpenSSL import SSL
        from service_identity import VerificationError

        from amp.http import BodyTooLarge, BufferFull, ConnectionClosed, HeadTooLarge, MalformedReply

        self.assertEqual(self.reason(ierror.ConnectionRefusedError()), "connection-refused")
        self.assertEqual(self.reason(ierror.TimeoutError()), "timeout")
        self.assertEqual(self.reason(ierror.DNSLookupError("x")), "connection-failed")
        self.assertEqual(self.reason(ConnectionClosed(Failure(SSL.Error([("SSL routines", "", "bad")])))), "tls-error")
        self.assertEqual(self.reason(ConnectionClosed(Failure(VerificationError(errors=[])))), "tls-error")
        self.assertEqual(self.reason(VerificationError(errors=[])), "tls-error")
        self.assertEqual(self.reason(SSL.Error([("SSL routines", "", "bad")])), "tls-error")
        self.assertEqual(self.reason(ConnectionClosed(Failure(ierror.ConnectionLost()))), "connection-reset")
        self.assertEqual(self.reason(defer.CancelledError()), "timeout")
        self.assertEqual(self.reason(EndpointFailure("http-5xx", "HTTP 500")), "http-5xx")
        self.assertEqual(self.reason(HeadTooLarge("over")), "response-headers-too-large")
        self.assertEqual(self.reason(BodyTooLarge("over")), "response-too-large")
        self.assertEqual(self.reason(MalformedReply("not HTTP")), "invalid-reply")
        # amp's own budget: not the endpoint's fault.
        self.assertIsInstance(classify(Failure(BufferFull("full"))), LocalFailure)
        inner = EndpointFailure("response-too-large", "over")
        self.assertIs(classify(Failure(inner)), inner)


# ---------------------------------------------------------------- what goes on the wire


class HostHeaderTests(SynchronousTestCase):
    def test_default_ports_are_left_out_and_ipv6_is_bracketed(self) -> None:
        from amp.endpoint._pool import host_header

        self.assertEqual(host_header(b"http", b"ep.team.svc", 80), b"ep.team.svc")
        self.assertEqual(host_header(b"https", b"ep.team.svc", 443), b"ep.team.svc")
        self.assertEqual(host_header(b"http", b"ep.team.svc", 443), b"ep.team.svc:443")
        self.assertEqual(host_header(b"https", b"::1", 8443), b"[::1]:8443")


# ---------------------------------------------------------------- through the Admitter


class AdmitterDeadlineTests(SynchronousTestCase):
    def admitter(self, clock: Clock, timeout: str) -> tuple[Admitter, Metrics, BreakerRegistry, Any]:
        config = parse_config(
            {
                "failure_policy": "Ignore",
                "kubernetes": {
                    "source": "static",
                    "namespaces": {
                        "team": {
                            "labels": {"amp.txn2.com/enabled": "true"},
                            "annotations": {"amp.txn2.com/ep": "http://127.0.0.1:8090/hang"},
                        }
                    },
                },
                "endpoints": {
                    "allow": ["http://127.0.0.1:*/*"],
                    "timeout": timeout,
                    "breaker": {"consecutive_failures": 1},
                },
            }
        )
        metrics = Metrics()
        breakers = BreakerRegistry(clock)
        client = EndpointClient(clock, metrics, breakers, connector=ResourceConnector(Hung()))
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics)
        return admitter, metrics, breakers, config.endpoints.defaults.breaker

    def test_the_reviews_deadline_is_the_one_timer(self) -> None:
        clock = Clock()
        admitter, metrics, breakers, breaker_config = self.admitter(clock, "30s")
        d = admitter.review(parse_review(review_body()), Deadline.after(clock.seconds(), 9.5))
        self.assertEqual([c.getTime() for c in clock.getDelayedCalls()], [9.5])
        clock.advance(9.499)
        self.assertNoResult(d)
        clock.advance(0.001)
        answer, outcome = self.successResultOf(d)
        response = json.loads(answer)["response"]
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.reason, "timeout")
        self.assertIn("no reply within 9.5s", response["auditAnnotations"]["error"])
        # The review's deadline cut the call: the breaker learned nothing.
        self.assertEqual(requests_total(metrics, ORIGIN, "timeout"), 1)
        self.assertEqual(breakers.get(ORIGIN, breaker_config).state, CLOSED)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_shorter_endpoint_timeout_is_the_endpoints_failure(self) -> None:
        clock = Clock()
        admitter, metrics, breakers, breaker_config = self.admitter(clock, "2s")
        d = admitter.review(parse_review(review_body()), Deadline.after(clock.seconds(), 9.5))
        # The review's one timer, set for the endpoint's timeout: it ends first.
        self.assertEqual([c.getTime() for c in clock.getDelayedCalls()], [2.0])
        clock.advance(2.0)
        answer, outcome = self.successResultOf(d)
        self.assertEqual(outcome.reason, "timeout")
        self.assertIn("timeout", json.loads(answer)["response"]["warnings"][0])
        self.assertEqual(breakers.get(ORIGIN, breaker_config).state, OPEN)
        self.assertEqual(clock.getDelayedCalls(), [])


class DecisionTypeTests(SynchronousTestCase):
    def test_object_reply_is_a_decision(self) -> None:
        clock = Clock()
        resource = Switchable(200, b'{"allowed": false, "status": {"code": 403, "message": "no"}}')
        h = Harness(clock, connector=ResourceConnector(resource))
        decision = self.successResultOf(h.call("http://127.0.0.1:8090/m"))
        self.assertIsInstance(decision, EndpointDecision)
        self.assertFalse(decision.allowed)
        self.assertEqual(decision.message, "no")
