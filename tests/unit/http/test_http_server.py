"""
Tests for amp's own HTTP/1.1 listener (amp.http) in memory, beyond the
limits test_channel.py covers: keep-alive, HTTP/1.0, pipelined requests
answered in order and read no further ahead than one read, C{Expect:
100-continue} in a request's turn, request smuggling refused, upgrades not
followed, a client that does not read its answers, a client that goes away
cancelling its review; and, for any bytes split anywhere, a well-formed
answer or a close, never an exception.
"""

from __future__ import annotations

from typing import Any

import httptools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from amp import http
from amp.metrics import Metrics
from tests.support.helpers import UID, decode_answer, parse_raw_response, review_bytes
from tests.unit.http.test_channel import HEALTHZ, ChannelTestCase, Connection, post_head


def responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """
    Every response in C{data}, parsed by llhttp's response parser: a
    response cut short or malformed fails the test.
    """

    class Collect:
        def __init__(self) -> None:
            self.done: list[tuple[int, dict[bytes, bytes], bytes]] = []
            self.begun = 0

        def on_message_begin(self) -> None:
            self.begun += 1
            self.headers: dict[bytes, bytes] = {}
            self.body = b""

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.lower()] = value

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            self.done.append((parser.get_status_code(), self.headers, self.body))

    collect = Collect()
    parser = httptools.HttpResponseParser(collect)
    parser.feed_data(data)
    assert collect.begun == len(collect.done), f"a response cut short in {data[-300:]!r}"
    return collect.done


class ServerTestCase(ChannelTestCase):
    def uids(self, c: Connection) -> list[str]:
        return [
            decode_answer(body)["response"]["uid"]
            for status, headers, body in responses(c.received())
            if headers.get(b"content-type") == b"application/json"
        ]


class KeepAliveTests(ServerTestCase):
    def test_a_connection_serves_request_after_request(self) -> None:
        site = self.site()
        c = self.connect(site)
        for n in range(1, 4):
            body = review_bytes(uid=f"r{n}")
            c.send(post_head(len(body)) + body)
            self.assertEqual(self.uids(c), [f"r{i}" for i in range(1, n + 1)])
        for _, headers, _ in responses(c.received()):
            self.assertNotIn(b"connection", headers)
        self.assertFalse(c.transport.disconnecting)

    def test_connection_close_is_answered_then_closed(self) -> None:
        c = self.connect(self.site())
        c.send(b"GET /healthz HTTP/1.1\r\nHost: amp\r\nConnection: close\r\n\r\n")
        [(status, headers, body)] = responses(c.received())
        self.assertEqual((status, headers[b"connection"], body), (200, b"close", b"ok\n"))
        self.assertTrue(c.transport.disconnecting)

    def test_http_10_closes_unless_it_asks_for_keep_alive(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        [(status, headers, body)] = responses(c.received())
        self.assertEqual((status, headers[b"connection"], body), (200, b"close", b"ok\n"))
        self.assertTrue(c.transport.disconnecting)
        kept = self.connect(site)
        kept.send(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        answers = responses(kept.received())
        self.assertEqual([(s, h[b"connection"]) for s, h, _ in answers], [(200, b"keep-alive")] * 2)
        self.assertFalse(kept.transport.disconnecting)

    def test_a_review_over_http_10_is_answered(self) -> None:
        c = self.connect(self.site())
        body = review_bytes()
        c.send(post_head(len(body)).replace(b"HTTP/1.1", b"HTTP/1.0") + body)
        self.assertEqual(self.uids(c), [UID])
        self.assertTrue(c.transport.disconnecting)

    def test_head_gets_the_head_of_get(self) -> None:
        c = self.connect(self.site())
        c.send(b"HEAD /healthz HTTP/1.1\r\nHost: amp\r\n\r\n")
        status, headers, body = parse_raw_response(c.received())
        self.assertEqual((status, headers[b"content-length"], body), (200, b"3", b""))

    def test_other_versions_are_400(self) -> None:
        for line in (b"GET /healthz HTTP/2.0\r\n\r\n", b"GET /healthz\r\n\r\n"):
            self.metrics = Metrics()
            c = self.connect(self.site())
            c.send(line)
            self.assertRefused(c, 400, b"is not supported")


class StretchTests(ServerTestCase):
    """
    Bytes that begin no request (llhttp skips blank lines between
    requests) move neither deadline.
    """

    def test_blank_lines_do_not_stretch_the_first_requests_read_deadline(self) -> None:
        c = self.connect(self.site(request_timeout="2s", idle_timeout="60s"))
        for _ in range(3):
            c.send(b"\r\n")
            self.clock.advance(0.5)
        self.assertEqual(c.transport.aborted_times, 0)
        self.clock.advance(0.5)
        self.assertEqual(c.transport.aborted_times, 1)

    def test_blank_lines_do_not_stretch_the_idle_timeout(self) -> None:
        c = self.connect(self.site(request_timeout="2s", idle_timeout="10s"))
        c.send(HEALTHZ)
        for _ in range(9):
            self.clock.advance(1)
            c.send(b"\r\n")
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(c.transport.disconnecting)

    def test_the_idle_timeout_runs_from_the_last_answer(self) -> None:
        c = self.connect(self.site(request_timeout="2s", idle_timeout="10s"))
        for _ in range(5):
            c.send(HEALTHZ)
            self.clock.advance(9)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(1)
        self.assertTrue(c.transport.disconnecting)


class PipelineTests(ServerTestCase):
    def test_pipelined_reviews_are_answered_in_order_and_reading_waits(self) -> None:
        service = self.held()
        c = self.connect(service.webhook_server)
        batch = b"".join(post_head(len(b)) + b for b in (review_bytes(uid=u) for u in ("a", "b", "c")))
        c.send(batch + HEALTHZ)
        # One review in flight, the rest wait their turn, and amp stops
        # reading: what waits is what that one read brought.
        self.assertEqual(len(self.source.lookups), 1)
        self.assertEqual(c.transport.producerState, "paused")
        self.assertEqual(c.received(), b"")
        while self.source.lookups:
            self.source.answer()
        answers = responses(c.received())
        self.assertEqual([s for s, _, _ in answers], [200, 200, 200, 200])
        self.assertEqual(self.uids(c), ["a", "b", "c"])
        self.assertEqual(answers[-1][2], b"ok\n")
        self.assertEqual(c.transport.producerState, "producing")

    def test_many_small_pipelined_requests_are_all_answered_in_order(self) -> None:
        c = self.connect(self.site())
        c.send(b"".join(b"GET /healthz?n=%d HTTP/1.1\r\nHost: amp\r\n\r\n" % n for n in range(3000)))
        self.assertEqual(len(responses(c.received())), 3000)
        self.assertFalse(c.transport.disconnecting)

    def test_a_refusal_behind_a_review_in_flight_comes_after_its_answer(self) -> None:
        service = self.held()
        c = self.connect(service.webhook_server)
        body = review_bytes(uid="first")
        c.send(post_head(len(body)) + body + b"BOGUS\x00 / HTTP/1.1\r\n\r\n")
        self.assertEqual(c.received(), b"")
        self.source.answer()
        [(s1, h1, b1), (s2, h2, b2)] = responses(c.received())
        self.assertEqual((s1, decode_answer(b1)["response"]["uid"]), (200, "first"))
        self.assertNotIn(b"connection", h1)
        self.assertEqual((s2, h2[b"connection"]), (400, b"close"))
        self.assertIn(b"request is not valid HTTP/1.1", b2)
        self.assertTrue(c.transport.disconnecting)

    def test_a_client_that_does_not_read_is_not_answered_further_until_it_does(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(HEALTHZ)
        # The transport's buffer is full: amp stops reading and answering.
        c.channel.pauseProducing()
        self.assertEqual(c.transport.producerState, "paused")
        c.send(HEALTHZ * 2)
        self.assertEqual(len(responses(c.received())), 1)
        c.channel.resumeProducing()
        self.assertEqual(len(responses(c.received())), 3)
        self.assertEqual(c.transport.producerState, "producing")


class DrainTests(ServerTestCase):
    def test_every_pipelined_request_received_is_answered_the_last_with_close(self) -> None:
        service = self.held()
        c = self.connect(service.webhook_server)
        batch = b"".join(post_head(len(b)) + b for b in (review_bytes(uid=u) for u in ("a", "b")))
        c.send(batch + HEALTHZ)
        stopped = service.stopService()
        self.assertFalse(c.transport.disconnecting)
        while self.source.lookups:
            self.source.answer()
        answers = responses(c.received())
        self.assertEqual(self.uids(c), ["a", "b"])
        self.assertEqual([h.get(b"connection") for _, h, _ in answers], [None, None, b"close"])
        self.assertTrue(c.transport.disconnecting)
        c.lose()
        self.successResultOf(stopped)


class ContinueTests(ServerTestCase):
    def test_expect_continue_gets_100_then_the_answer(self) -> None:
        c = self.connect(self.site())
        body = review_bytes()
        c.send(post_head(len(body), extra=b"Expect: 100-continue\r\n"))
        self.assertEqual(c.received(), b"HTTP/1.1 100 Continue\r\n\r\n")
        c.send(body)
        [(s1, _, _), (s2, _, b2)] = responses(c.received())
        self.assertEqual((s1, s2, decode_answer(b2)["response"]["uid"]), (100, 200, UID))

    def test_100_waits_for_the_answer_before_it(self) -> None:
        service = self.held()
        c = self.connect(service.webhook_server)
        first, second = review_bytes(uid="first"), review_bytes(uid="second")
        c.send(post_head(len(first)) + first + post_head(len(second), extra=b"Expect: 100-continue\r\n"))
        self.assertEqual(c.received(), b"")
        self.source.answer()
        self.assertTrue(c.received().endswith(b"HTTP/1.1 100 Continue\r\n\r\n"), c.received()[-60:])
        c.send(second)
        self.source.answer()
        self.assertEqual([s for s, _, _ in responses(c.received())], [200, 100, 200])
        self.assertEqual(self.uids(c), ["first", "second"])

    def test_no_100_over_http_10(self) -> None:
        c = self.connect(self.site())
        c.send(
            b"POST /mutate HTTP/1.0\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: 10\r\n\r\n"
        )
        self.assertEqual(c.received(), b"")


#: Requests that smuggle a second request past a proxy that frames them
#: differently, each refused with a 400 naming what is wrong.
SMUGGLING = {
    "Content-Length and Transfer-Encoding": (
        b"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "Transfer-Encoding and Content-Length": (
        b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"
    ),
    "two Content-Lengths": b"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "two equal Content-Lengths": b"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "a Content-Length list": b"POST /mutate HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
    "a negative Content-Length": b"POST /mutate HTTP/1.1\r\nContent-Length: -5\r\n\r\nhello",
    "a signed Content-Length": b"POST /mutate HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
    "a non-numeric Content-Length": b"POST /mutate HTTP/1.1\r\nContent-Length: five\r\n\r\nhello",
    "a Content-Length past 2**64": b"POST /mutate HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    "obsolete line folding": b"POST /mutate HTTP/1.1\r\nHost: amp\r\nX-A: b\r\n c\r\nContent-Length: 0\r\n\r\n",
    "folding with a tab": b"POST /mutate HTTP/1.1\r\nHost: amp\r\nX-A: b\r\n\tc\r\nContent-Length: 0\r\n\r\n",
    "a Transfer-Encoding not ending in chunked": b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    "Transfer-Encoding: identity": b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n",
    "Transfer-Encoding: gzip": b"POST /mutate HTTP/1.1\r\nHost: amp\r\nTransfer-Encoding: gzip\r\n\r\n",
    "two Transfer-Encodings": (
        b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "bare LF line ends": b"POST /mutate HTTP/1.1\nContent-Length: 0\n\n",
    "a space before the colon": b"POST /mutate HTTP/1.1\r\nContent-Length : 0\r\n\r\n",
    "a NUL in a header value": b"POST /mutate HTTP/1.1\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
}


class SmugglingTests(ServerTestCase):
    def test_each_ambiguous_framing_is_400_and_closed(self) -> None:
        for name, request in SMUGGLING.items():
            with self.subTest(name):
                self.metrics = Metrics()
                c = self.connect(self.site())
                c.send(request + HEALTHZ)
                self.assertRefused(c, 400, b"request is not valid HTTP/1.1: ")
                self.assertEqual(len(responses(c.received())), 1)

    def test_the_refusal_names_what_llhttp_found(self) -> None:
        c = self.connect(self.site())
        c.send(SMUGGLING["two Content-Lengths"])
        self.assertRefused(c, 400, b"Duplicate Content-Length")


class ChunkedTests(ServerTestCase):
    CHUNKED = (
        b"POST /mutate HTTP/1.1\r\nHost: amp\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )

    def test_a_chunked_review_with_trailers_is_answered(self) -> None:
        c = self.connect(self.site())
        body = review_bytes()
        c.send(self.CHUNKED + b"%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n" % (len(body), body))
        self.assertEqual(self.uids(c), [UID])

    def test_a_trailer_is_not_read_as_a_header(self) -> None:
        c = self.connect(self.site())
        body = review_bytes()
        head = self.CHUNKED.replace(b"application/json", b"text/plain")
        c.send(head + b"%x\r\n%s\r\n0\r\nContent-Type: application/json\r\n\r\n" % (len(body), body))
        self.assertEqual(responses(c.received())[0][0], 415)

    def test_a_trailer_that_never_ends_is_431_as_it_arrives(self) -> None:
        c = self.connect(self.site())
        c.send(self.CHUNKED + b"5\r\nhello\r\n0\r\nX-Trailer: ")
        for _ in range(4):
            c.send(b"t" * 8192)
        self.assertRefused(c, 431, b"chunk extensions and trailers are over 16384 bytes")

    def test_chunk_extensions_without_end_are_431(self) -> None:
        c = self.connect(self.site())
        c.send(self.CHUNKED + b"5;")
        for _ in range(4):
            c.send(b"e" * 8192)
        self.assertRefused(c, 431, b"chunk extensions and trailers are over")

    def test_small_chunks_are_not_framing_abuse(self) -> None:
        c = self.connect(self.site())
        body = review_bytes()
        c.send(self.CHUNKED)
        for i in range(0, len(body), 7):
            c.send(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]))
        c.send(b"0\r\n\r\n")
        self.assertEqual(self.uids(c), [UID])


class UpgradeTests(ServerTestCase):
    def test_an_upgrade_is_answered_and_closed_and_what_follows_is_not_parsed(self) -> None:
        c = self.connect(self.site())
        c.send(
            b"GET /healthz HTTP/1.1\r\nHost: amp\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\n\r\n"
        )
        [(status, headers, body)] = responses(c.received())
        self.assertEqual((status, headers[b"connection"], body), (200, b"close", b"ok\n"))
        self.assertTrue(c.transport.disconnecting)

    def test_connect_is_not_followed(self) -> None:
        c = self.connect(self.site())
        c.send(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n\x16\x03\x01")
        [(status, headers, _)] = responses(c.received())
        self.assertEqual((status, headers[b"connection"]), (404, b"close"))
        self.assertTrue(c.transport.disconnecting)


class DisconnectTests(ServerTestCase):
    def test_a_client_that_goes_away_cancels_its_review_and_the_ones_waiting(self) -> None:
        service = self.held()
        c = self.connect(service.webhook_server)
        body = review_bytes()
        c.send(post_head(len(body)) + body + post_head(len(body)) + body)
        [lookup] = self.source.lookups
        c.lose()
        self.assertTrue(lookup.called)
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual(c.received(), b"")
        self.assertEqual(self.source.lookups, [lookup])
        self.assertEqual(service.webhook_server.open_connections, 0)


# ---------------------------------------------------------------- any bytes, split anywhere

#: Pieces of real requests, so that generated streams reach past the first
#: line as often as they fail on it.
PIECES = [
    b"POST /mutate?timeout=10s HTTP/1.1\r\n",
    b"GET /healthz HTTP/1.1\r\n",
    b"GET /readyz HTTP/1.0\r\n",
    b"POST /validate HTTP/1.1\r\n",
    b"Host: amp\r\n",
    b"Content-Type: application/json\r\n",
    b"Content-Length: 10\r\n",
    b"Content-Length: 999999\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: close\r\n",
    b"Connection: keep-alive\r\n",
    b"Connection: Upgrade\r\nUpgrade: h2c\r\n",
    b"\r\n",
    b"5\r\nhello\r\n",
    b"0\r\n\r\n",
    b"{}",
    b" ",
    b"\t",
    b"\n",
    review_bytes(),
]

#: Whole requests, for the streams that pipeline them.
WHOLE = [
    post_head(len(review_bytes())) + review_bytes(),
    HEALTHZ,
    post_head(len(review_bytes()), extra=b"Expect: 100-continue\r\n"),
    review_bytes(),
]

streams = st.one_of(
    st.binary(max_size=4096),
    st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=16)), max_size=24).map(b"".join),
)


class AnyBytesTests(ServerTestCase):
    """
    Whatever bytes arrive, however split: every answer amp writes is a
    well-formed HTTP/1.1 response, in the end the connection is closed or
    every request it sent is answered, and nothing raises or logs an error.
    """

    def setUp(self) -> None:
        self.logged: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)
        self.server = self.site(max_body="4KiB", request_timeout="2s", idle_timeout="5s")

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(streams, st.lists(st.integers(min_value=0, max_value=4096), max_size=8))
    def test_any_stream_split_anywhere(self, data: bytes, cuts: list[int]) -> None:
        c = self.connect(self.server)
        points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
        for start, end in zip(points, points[1:]):
            c.send(data[start:end])
            self.clock.advance(0.25)
        answered = responses(c.received())
        for status, headers, _ in answered:
            self.assertIn(status, {100, 200, 400, 404, 405, 408, 413, 414, 415, 431, 503})
            if status != 100:
                self.assertIn(headers[b"content-type"], (b"text/plain; charset=utf-8", b"application/json"))
        # Time enough for every deadline and grace: the connection is closed.
        self.clock.advance(2 + 5 + http.CLOSE_GRACE)
        self.assertTrue(c.transport.disconnecting or c.transport.aborted_times, c.received()[-200:])
        responses(c.received())
        c.lose()
        self.assertEqual(self.server.open_connections, 0)
        failures = [
            e for e in self.logged if "log_failure" in e or e.get("log_level") in (LogLevel.error, LogLevel.critical)
        ]
        self.assertEqual(failures, [], [formatEvent(e) for e in failures])
        self.logged.clear()

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["send", "answer", "tick", "pause", "resume"]),
                st.one_of(st.lists(st.sampled_from(WHOLE), min_size=1, max_size=4).map(b"".join), streams),
            ),
            min_size=1,
            max_size=12,
        )
    )
    def test_any_stream_while_reviews_wait_and_the_client_stops_reading(self, steps: list[tuple[str, bytes]]) -> None:
        """The same with reviews in flight (answered at any point) and the
        transport's buffer filling and emptying at any point."""
        service = self.held()
        c = self.connect(service.webhook_server)
        for action, data in steps:
            if action == "send":
                c.send(data)
            elif action == "answer":
                self.source.answer()
            elif action == "tick":
                self.clock.advance(1)
            elif action == "pause":
                c.channel.pauseProducing()
            else:
                c.channel.resumeProducing()
        c.channel.resumeProducing()
        while self.source.lookups:
            self.source.answer()
        for status, _headers, _ in responses(c.received()):
            self.assertIn(status, {100, 200, 400, 404, 405, 408, 413, 414, 415, 431, 503})
        self.clock.advance(
            service.config.listen.request_timeout + service.config.listen.idle_timeout + http.CLOSE_GRACE
        )
        self.assertTrue(c.transport.disconnecting or c.transport.aborted_times, c.received()[-200:])
        c.lose()
        self.assertEqual(service.webhook_server.open_connections, 0)
        failures = [
            e for e in self.logged if "log_failure" in e or e.get("log_level") in (LogLevel.error, LogLevel.critical)
        ]
        self.assertEqual(failures, [], [formatEvent(e) for e in failures])
        self.logged.clear()
