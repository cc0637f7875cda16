"""
The edges of HTTP/1.1 framing by the RFC, over real loopback sockets:

  - the listener (amp's own, TLS, reviews behind it) against a raw client:
    Host rules (RFC 9112 section 3.2), absolute-form targets (3.2.2),
    transfer codings amp does not implement (6.1: 501; 6.3: 400), and
    whitespace around field values (RFC 9110 section 5.5);
  - the endpoint client against a hostile raw endpoint: a transfer coding
    amp does not decode fails the call and closes the connection, obs-fold
    is unfolded (RFC 9112 section 5.2), and trailers count against the
    reply head's limits while they arrive;
  - and, for any value (Hypothesis), the Host rule and the transfer
    coding rule themselves.

Every wait is bounded; nothing here measures time.
"""

from __future__ import annotations

from typing import Any, Optional

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from amp.config import BreakerConfig, EndpointSettings
from amp.http._target import _HOST, OWS, host_problem, transfer_coding_problem
from tests.integration.loopback.test_hostile_clients import HostileTestCase
from tests.support.endpoint_harness import PATCH, PATCH_BYTES, FailureAssertions, LoopbackServer, RealHarness
from tests.support.helpers import UID, decode_answer, parse_raw_response, review_bytes

# ---------------------------------------------------------------- the listener


def request(
    body: bytes,
    *,
    host: Optional[list[bytes]] = None,
    target: bytes = b"/mutate",
    version: bytes = b"HTTP/1.1",
    extra: bytes = b"",
    framing: Optional[bytes] = None,
) -> bytes:
    """A POST of C{body}: Host fields C{host} (default one, 127.0.0.1), framed by Content-Length or C{framing}."""
    hosts = [b"127.0.0.1"] if host is None else host
    head = b"POST %s %s\r\n" % (target, version)
    head += b"".join(b"Host: %s\r\n" % h for h in hosts)
    head += b"Content-Type: application/json\r\n" + extra
    if framing is None:
        return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    return head + framing + b"\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class ListenerFramingTests(HostileTestCase):
    """
    Raw requests over TLS to the real listener: what RFC 9112 refuses is
    refused (and never reviewed), what it allows is reviewed.
    """

    @inlineCallbacks
    def exchange(self, amp: Any, data: bytes, until: bytes = b"") -> Any:
        """Send C{data} on a new connection; the answer once C{until} arrived, or once amp closed."""
        c = yield self.client(amp)
        c.send(data)
        if until:
            yield c.until(until)
            return c.received
        return (yield self.closed(c))

    @inlineCallbacks
    def assertReviewed(self, amp: Any, data: bytes) -> Any:
        received = yield self.exchange(amp, data, until=b'"uid"')
        status, _, body = parse_raw_response(received)
        self.assertEqual(status, 200, received[:300])
        self.assertEqual(decode_answer(body)["response"]["uid"], UID)

    @inlineCallbacks
    def test_host_fields_that_rfc_9112_refuses_are_400_and_never_reviewed(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        cases = {
            "no Host": ([], b"no Host header fields"),
            "two Hosts": ([b"127.0.0.1", b"127.0.0.1"], b"2 Host header fields"),
            "a space inside": ([b"amp amp"], b"is not a valid host[:port]"),
            "a path": ([b"amp/mutate"], b"is not a valid host[:port]"),
            "user info": ([b"user@amp"], b"is not a valid host[:port]"),
            "a port that is not digits": ([b"amp:44x"], b"is not a valid host[:port]"),
            "two colons": ([b"amp:1:2"], b"is not a valid host[:port]"),
            "an unclosed IP literal": ([b"[::1"], b"is not a valid host[:port]"),
        }
        for name, (hosts, message) in cases.items():
            data = yield self.exchange(amp, request(body, host=hosts))
            self.assertRefused(data, 400, message)
            self.assertIn(b"RFC 9112 section 3.2", data, name)
        self.assertEqual(amp.metrics.bad_requests.labels("400")._value.get(), len(cases))

    @inlineCallbacks
    def test_host_fields_that_rfc_9112_allows_are_reviewed(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for host in (
            b"127.0.0.1:8443",
            b"[::1]:443",
            b"amp.amp-system.svc",
            b"",
            b"  amp.example \t",
            b"xn--bcher-kva.example",
            b"%41mp",
        ):
            yield self.assertReviewed(amp, request(body, host=[host]))
        # HTTP/1.0 may leave it out.
        yield self.assertReviewed(amp, request(body, host=[], version=b"HTTP/1.0"))

    @inlineCallbacks
    def test_an_absolute_form_target_is_served_by_its_path(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for target in (
            b"https://127.0.0.1:%d/mutate?timeout=10s" % amp.port,
            b"HTTPS://amp.example/mutate",
            b"http://[::1]/mutate",
        ):
            yield self.assertReviewed(amp, request(body, target=target))
        # Its path decides: not the webhook's, not found (the connection stays usable).
        received = yield self.exchange(amp, request(body, target=b"https://amp.example/other"), until=b"\r\n\r\n")
        self.assertEqual(parse_raw_response(received)[0], 404)

    @inlineCallbacks
    def test_absolute_targets_that_are_not_http_urls_are_400(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for target in (
            b"ftp://amp.example/mutate",
            b"https:///mutate",
            b"https://user@amp/mutate",
            b"https://amp:x/mutate",
        ):
            data = yield self.exchange(amp, request(body, target=target))
            self.assertRefused(data, 400, b"request target")

    @inlineCallbacks
    def test_a_transfer_coding_amp_does_not_implement_is_501_and_closed(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for te in (b"gzip, chunked", b"deflate,chunked", b"identity, chunked"):
            data = yield self.exchange(amp, request(body, framing=b"Transfer-Encoding: " + te))
            self.assertRefused(data, 501, b"amp does not implement the transfer coding")
        # Split over two fields: the same codings.
        data = yield self.exchange(amp, request(body, framing=b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked"))
        self.assertRefused(data, 501, b"'gzip'")
        self.assertEqual(amp.metrics.bad_requests.labels("501")._value.get(), 4)

    @inlineCallbacks
    def test_codings_that_do_not_end_in_one_chunked_are_400_and_closed(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for te in (b"gzip", b"chunked, gzip", b"chunked, chunked"):
            data = yield self.exchange(amp, request(body, framing=b"Transfer-Encoding: " + te))
            self.assertRefused(data, 400, b"Transfer-Encoding")

    @inlineCallbacks
    def test_whitespace_around_field_values_is_not_part_of_them(self) -> Any:
        amp = yield self.start(request_timeout="5s")
        body = review_bytes()
        for te in (b" chunked ", b"\tchunked\t", b"chunked \t ", b"  CHUNKED"):
            yield self.assertReviewed(amp, request(body, framing=b"Transfer-Encoding:" + te))
        # Content-Type with whitespace after it is JSON still (not 415).
        data = request(body).replace(b"Content-Type: application/json\r\n", b"Content-Type:\t application/json \t\r\n")
        yield self.assertReviewed(amp, data)
        # Expect with whitespace after it gets its 100.
        c = yield self.client(amp)
        c.send(
            b"POST /mutate HTTP/1.1\r\nHost: amp\r\nContent-Type: application/json\r\nExpect: 100-continue \t\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        yield c.until(b"HTTP/1.1 100 Continue\r\n\r\n")
        c.send(body)
        yield c.until(b'"uid"')


# ---------------------------------------------------------------- the endpoint client


class Scripted(Protocol):
    """
    A hostile endpoint: answers the first request on its connection with
    C{pieces}, one per reactor turn, then C{more()} (if given) every turn
    until the connection is gone.
    """

    def __init__(self, pieces: list[bytes], more: Any = None) -> None:
        self.pieces = list(pieces)
        self.more = more
        self.sent = 0
        self.lost: Deferred = Deferred()
        self._started = False

    def dataReceived(self, data: bytes) -> None:
        if not self._started and b"\r\n\r\n" in data:
            self._started = True
            self._next()

    def _next(self) -> None:
        if self.lost.called:
            return
        if self.pieces:
            piece = self.pieces.pop(0)
        elif self.more is not None:
            piece = self.more(self.sent)
        else:
            return
        self.sent += len(piece)
        self.transport.write(piece)
        reactor.callLater(0, self._next)

    def connectionLost(self, reason: Any) -> None:
        self.lost.callback(None)


class ScriptedFactory(Factory):
    """Each new connection answered by the next script; then with a plain, good reply."""

    def __init__(self, *scripts: Scripted) -> None:
        self.scripts = list(scripts)
        self.made: list[Scripted] = []

    def buildProtocol(self, addr: Any) -> Scripted:
        p = self.scripts.pop(0) if self.scripts else Scripted([good_reply()])
        self.made.append(p)
        return p


def good_reply(extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(PATCH_BYTES), PATCH_BYTES)


def chunked_head(extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sTransfer-Encoding: chunked\r\n\r\n" % extra


CHUNK = b"%x\r\n%s\r\n" % (len(PATCH_BYTES), PATCH_BYTES)


class EndpointTestCase(TestCase, FailureAssertions):
    timeout = 20

    def serve(self, *scripts: Scripted) -> tuple[LoopbackServer, ScriptedFactory]:
        factory = ScriptedFactory(*scripts)
        return LoopbackServer.start(self, factory), factory

    def harness(self, **settings: Any) -> RealHarness:
        return RealHarness(self, EndpointSettings(breaker=BreakerConfig(consecutive_failures=100), **settings))

    @inlineCallbacks
    def assertNextCallOpensAConnection(self, h: RealHarness, server: LoopbackServer) -> Any:
        before = server.accepted
        decision = yield h.call(server.url("/mutate"))
        self.assertEqual(decision.patch, PATCH)
        self.assertEqual(server.accepted, before + 1)


class TransferCodingTests(EndpointTestCase):
    @inlineCallbacks
    def test_a_coding_amp_does_not_decode_fails_the_call_and_closes_the_connection(self) -> Any:
        for te in (b"gzip, chunked", b"gzip", b"chunked, gzip", b"deflate,\tchunked"):
            script = Scripted([chunked_head().replace(b"chunked", te), CHUNK, b"0\r\n\r\n"])
            server, _ = self.serve(script)
            h = self.harness()
            e = yield self.assertFailsWith(h.call(server.url("/mutate")), "invalid-reply")
            self.assertIn("Transfer-Encoding", e.message)
            yield script.lost  # amp closed it
            yield self.assertNextCallOpensAConnection(h, server)

    @inlineCallbacks
    def test_chunked_with_whitespace_and_case_is_read_and_reused(self) -> Any:
        script = Scripted([b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n", CHUNK, b"0\r\n\r\n"])
        server, _ = self.serve(script)
        h = self.harness()
        decision = yield h.call(server.url("/mutate"))
        self.assertEqual(decision.patch, PATCH)
        self.assertEqual(h.client.idle_connections(), 1)


class ObsFoldTests(EndpointTestCase):
    @inlineCallbacks
    def test_a_folded_header_is_unfolded_and_read(self) -> Any:
        # Folded over three lines, the fold arriving in the reads after
        # its line: the value is "keep-alive, close", so the connection
        # is not reused.
        script = Scripted(
            [
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive,\r\n",
                b" \t close\r\n",
                b"X-Note: a\r\n",
                b"\tb\r\n",
                b"Content-Length: %d\r\n\r\n%s" % (len(PATCH_BYTES), PATCH_BYTES),
            ]
        )
        server, _ = self.serve(script)
        h = self.harness()
        decision = yield h.call(server.url("/mutate"))
        self.assertEqual(decision.patch, PATCH)
        yield script.lost
        yield self.assertNextCallOpensAConnection(h, server)

    @inlineCallbacks
    def test_a_folded_header_in_one_read_keeps_its_connection_when_it_allows(self) -> Any:
        script = Scripted([good_reply(b"X-Note: a\r\n b\r\n")])
        server, _ = self.serve(script)
        h = self.harness()
        decision = yield h.call(server.url("/mutate"))
        self.assertEqual(decision.patch, PATCH)
        self.assertEqual(h.client.idle_connections(), 1)


class TrailerTests(EndpointTestCase):
    @inlineCallbacks
    def test_trailers_within_the_limits_are_read_and_the_connection_reused(self) -> Any:
        script = Scripted([chunked_head(), CHUNK, b"0\r\nX-T1: a\r\nX-T2: b\r\n\r\n"])
        server, _ = self.serve(script)
        h = self.harness()
        decision = yield h.call(server.url("/mutate"))
        self.assertEqual(decision.patch, PATCH)
        self.assertEqual(h.client.idle_connections(), 1)

    @inlineCallbacks
    def test_endless_trailer_fields_are_refused_at_max_response_headers(self) -> Any:
        script = Scripted([chunked_head(), CHUNK, b"0\r\n"], more=lambda sent: b"X-T: %d\r\n" % sent)
        server, _ = self.serve(script)
        h = self.harness(max_response_headers=20, timeout=30.0)
        e = yield self.assertFailsWith(h.call(server.url("/mutate"), budget=60.0), "response-headers-too-large")
        self.assertIn("header and trailer lines (endpoints.max_response_headers)", e.message)
        yield script.lost
        # The head's 3 lines and 18 trailers: refused at the 21st line, not read on.
        self.assertLess(script.sent, 4096)
        self.assertEqual(h.client.budget.held, 0)

    @inlineCallbacks
    def test_one_endless_trailer_field_is_refused_at_max_response_header_size(self) -> Any:
        block = b"v" * 16384
        script = Scripted([chunked_head(), CHUNK, b"0\r\nX-Big: "], more=lambda sent: block)
        server, _ = self.serve(script)
        h = self.harness(max_response_header_size=8192, timeout=30.0)
        e = yield self.assertFailsWith(h.call(server.url("/mutate"), budget=60.0), "response-headers-too-large")
        self.assertIn("trailers are larger than the 8192 byte limit", e.message)
        yield script.lost
        self.assertEqual(h.client.budget.held, 0)

    @inlineCallbacks
    def test_megabytes_of_trailers_in_large_writes_are_refused(self) -> Any:
        fields = b"".join(b"X-T%05d: %s\r\n" % (i, b"t" * 80) for i in range(12000))  # about 1 MiB
        script = Scripted([chunked_head() + CHUNK + b"0\r\n" + fields + b"\r\n"])
        server, _ = self.serve(script)
        h = self.harness(timeout=30.0)
        yield self.assertFailsWith(h.call(server.url("/mutate"), budget=60.0), "response-headers-too-large")
        yield script.lost
        yield self.assertNextCallOpensAConnection(h, server)


# ---------------------------------------------------------------- the rules, for any value

HOST_BYTES = st.binary(max_size=30) | st.text("ab1.-:[]%4F@ _~!", max_size=20).map(str.encode)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(value=HOST_BYTES)
def test_a_host_is_refused_exactly_when_rfc_3986_says_it_is_not_host_and_port(value: bytes) -> None:
    # The fast path in C and the grammar agree on every value.
    assert (host_problem(value) is None) == (_HOST.fullmatch(value.strip(OWS)) is not None)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    codings=st.lists(st.sampled_from(["chunked", "CHUNKED", "gzip", "identity", "x", ""]), max_size=4),
    space=st.sampled_from(["", " ", "\t", " \t "]),
)
def test_transfer_codings_other_than_chunked_alone_are_refused(codings: list[str], space: str) -> None:
    value = ",".join(f"{space}{c}{space}" for c in codings).encode()
    named = [c.lower() for c in codings if c]
    problem = transfer_coding_problem(value)
    if named == ["chunked"]:
        assert problem is None
    elif named[-1:] == ["chunked"] and named.count("chunked") == 1:
        assert problem is not None and problem[0] == 501
    else:
        assert problem is not None and problem[0] == 400
