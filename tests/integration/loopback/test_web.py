"""
Tests for amp.web over real loopback TLS: the bad-input errors (415, 413,
400), /healthz and /readyz, a real 408 and connections that never finish
their TLS handshake, and that no answer ever carries Retry-After.  Every
limit of the channel is tested to the second in memory in
test_channel.py.

amp runs in-process (L{tests.support.helpers.start_amp}) with the development
certificate; the client verifies the CA and the IP address.  Real-time
waits are short (a 0.2s request timeout) and bounded.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from OpenSSL import SSL
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.trial.unittest import TestCase
from twisted.web._newclient import RequestTransmissionFailed, ResponseNeverReceived
from zope.interface import implementer

from amp.namespaces import INamespaceSource, StaticNamespaceSource
from amp_dev.devcert import make_ca, pem_cert
from tests.support.helpers import (
    UID,
    WebhookClient,
    decode_answer,
    make_config,
    namespace,
    parse_raw_response,
    review,
    review_bytes,
    start_amp,
    tls_exchange,
)


def raw_post(path: bytes, body: bytes, *, headers: bytes = b"", content_length: Optional[int] = None) -> bytes:
    length = len(body) if content_length is None else content_length
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: %d\r\n\r\n" % length
        + body
    )


class WebTestCase(TestCase):
    timeout = 15

    @inlineCallbacks
    def start(self, config: Any = None, **kwargs: Any) -> Any:
        """amp with team-a enabled but no endpoint (nothing is called), and a client."""
        if config is None:
            config = make_config({"team-a": namespace(enabled=False)})
        amp = yield start_amp(config, reactor, **kwargs)
        self.addCleanup(amp.stop)
        client = WebhookClient(reactor)
        self.addCleanup(client.close)
        return amp, client

    def assertNoRetryAfter(self, response: Any) -> None:
        self.assertFalse(response.headers.hasHeader(b"retry-after"))


class BadInputTests(WebTestCase):
    @inlineCallbacks
    def test_wrong_content_type_is_415(self) -> Any:
        amp, client = yield self.start()
        for content_type in (b"text/plain", b"application/x-www-form-urlencoded", None):
            response, body = yield client.post(amp.url("/mutate"), review_bytes(), content_type=content_type)
            self.assertEqual(response.code, 415)
            self.assertIn(b"Content-Type must be application/json", body)
            self.assertNoRetryAfter(response)

    @inlineCallbacks
    def test_content_type_parameters_are_accepted(self) -> Any:
        amp, client = yield self.start()
        response, body = yield client.post(
            amp.url("/mutate"), review_bytes(), content_type=b"Application/JSON; charset=utf-8"
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(decode_answer(body)["response"]["uid"], UID)

    @inlineCallbacks
    def test_invalid_json_is_400(self) -> Any:
        amp, client = yield self.start()
        response, body = yield client.post(amp.url("/mutate"), b'{"apiVersion": ')
        self.assertEqual(response.code, 400)
        self.assertIn(b"request body is not valid JSON", body)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"text/plain; charset=utf-8"])
        self.assertNoRetryAfter(response)

    @inlineCallbacks
    def test_missing_uid_is_400(self) -> Any:
        amp, client = yield self.start()
        doc = review()
        del doc["request"]["uid"]
        for path in ("/mutate", "/validate"):
            response, body = yield client.post(amp.url(path), json.dumps(doc).encode())
            self.assertEqual(response.code, 400)
            self.assertIn(b"request.uid is missing", body)

    @inlineCallbacks
    def test_body_over_the_limit_with_treq_is_413(self) -> Any:
        config = make_config(listen={"max_body": 1024})
        amp, client = yield self.start(config)
        body = json.dumps(review()).encode()
        body = body[:-1] + b', "padding": "' + b"x" * 2048 + b'"}'
        response, content = yield client.post(amp.url("/mutate"), body)
        self.assertEqual(response.code, 413)
        self.assertIn(b"listen.max_body", content)

    @inlineCallbacks
    def test_chunked_body_under_the_limit_is_reviewed(self) -> Any:
        amp, client = yield self.start()
        body = review_bytes()
        half = len(body) // 2
        request = (
            b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        parts = [body[:half], body[half:]]
        chunks = [request] + [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
        data = yield tls_exchange(reactor, amp.port, *chunks)
        status, headers, content = parse_raw_response(data)
        self.assertEqual(status, 200)
        self.assertEqual(decode_answer(content)["response"]["uid"], UID)

    @inlineCallbacks
    def test_get_on_mutate_is_405(self) -> Any:
        amp, client = yield self.start()
        response, _ = yield client.get(amp.url("/mutate"))
        self.assertEqual(response.code, 405)


class HealthTests(WebTestCase):
    @inlineCallbacks
    def test_healthz(self) -> Any:
        amp, client = yield self.start()
        response, body = yield client.get(amp.url("/healthz"))
        self.assertEqual((response.code, body), (200, b"ok\n"))
        self.assertNoRetryAfter(response)

    @inlineCallbacks
    def test_readyz_ready(self) -> Any:
        amp, client = yield self.start()
        response, body = yield client.get(amp.url("/readyz"))
        self.assertEqual(response.code, 200)
        self.assertIn(b"[+] certificate: certificate serial", body)
        self.assertIn(b"[+] namespaces: static namespaces: 1", body)
        self.assertTrue(body.endswith(b"\nready\n"))

    @inlineCallbacks
    def test_readyz_not_ready_while_the_source_has_not_synced(self) -> Any:
        config = make_config()
        source = NotSynced(config)
        amp, client = yield self.start(config, namespaces=source)
        response, body = yield client.get(amp.url("/readyz"))
        self.assertEqual(response.code, 503)
        self.assertIn(b"[-] namespaces: first list not done", body)
        self.assertIn(b"[+] certificate", body)
        self.assertTrue(body.endswith(b"\nnot ready\n"))
        self.assertNoRetryAfter(response)
        source.synced = True
        response, body = yield client.get(amp.url("/readyz"))
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_readyz_check_that_raises_is_not_ready(self) -> Any:
        config = make_config()
        source = NotSynced(config)
        source.explode = True
        amp, client = yield self.start(config, namespaces=source)
        response, body = yield client.get(amp.url("/readyz"))
        self.assertEqual(response.code, 503)
        self.assertIn(b"[-] namespaces: check failed: watch thread gone", body)


@implementer(INamespaceSource)
class NotSynced(StaticNamespaceSource):
    """A static source that reports it has not synced (like a watch before its first list)."""

    synced = False
    explode = False

    def __init__(self, config: Any) -> None:
        super().__init__(config.kubernetes)

    def readiness(self) -> tuple[bool, str]:
        if self.explode:
            raise RuntimeError("watch thread gone")
        return (True, "synced") if self.synced else (False, "first list not done")


class TLSTests(WebTestCase):
    @inlineCallbacks
    def test_client_that_does_not_trust_the_ca_is_refused(self) -> Any:
        amp, _ = yield self.start()
        other_ca, _ = make_ca("some other CA")
        stranger = WebhookClient(reactor, ca=pem_cert(other_ca))
        self.addCleanup(stranger.close)
        with self.assertRaises((ResponseNeverReceived, RequestTransmissionFailed)) as e:
            yield stranger.post(amp.url("/mutate"), review_bytes())
        self.assertTrue(e.exception.reasons[0].check(SSL.Error))
        self.assertIn("certificate verify failed", str(e.exception.reasons[0].value))


class SlowClientTests(WebTestCase):
    @inlineCallbacks
    def test_headers_then_nothing_gets_408(self) -> Any:
        config = make_config(listen={"request_timeout": "200ms"})
        amp, _ = yield self.start(config)
        started = reactor.seconds()
        data = yield tls_exchange(reactor, amp.port, raw_post(b"/mutate", b"", content_length=100), timeout=5)
        elapsed = reactor.seconds() - started
        status, headers, body = parse_raw_response(data)
        self.assertEqual(status, 408)
        self.assertIn(b"request not received within 0.2s (listen.request_timeout)", body)
        self.assertEqual(headers[b"connection"], b"close")
        self.assertNotIn(b"retry-after", headers)
        self.assertGreaterEqual(elapsed, 0.2)
        self.assertLess(elapsed, 5)

    @inlineCallbacks
    def test_connection_that_never_sends_a_request_is_closed(self) -> Any:
        """
        A client that connects and sends nothing (not even a TLS handshake)
        must not hold one of listen.max_connections for the idle timeout.
        """
        config = make_config(listen={"request_timeout": "200ms"})
        amp, _ = yield self.start(config)
        lost: Deferred = Deferred()

        class Silent(Protocol):
            def connectionLost(self, reason: Any) -> None:
                lost.callback(None)

        started = reactor.seconds()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", amp.port), Silent())
        yield lost.addTimeout(5, reactor)
        self.assertGreaterEqual(reactor.seconds() - started, 0.2)
        yield amp.connections.wait_idle()
        self.assertEqual(amp.service.webhook_server.open_connections, 0)

    @inlineCallbacks
    def test_handshake_then_nothing_is_closed(self) -> Any:
        config = make_config(listen={"request_timeout": "200ms"})
        amp, _ = yield self.start(config)
        started = reactor.seconds()
        data = yield tls_exchange(reactor, amp.port, timeout=5)
        self.assertEqual(data, b"")
        self.assertGreaterEqual(reactor.seconds() - started, 0.2)

    @inlineCallbacks
    def test_keep_alive_connection_serves_several_reviews(self) -> Any:
        config = make_config(listen={"request_timeout": "200ms"})
        amp, client = yield self.start(config)
        for _ in range(3):
            response, body = yield client.post(amp.url("/mutate"), review_bytes())
            self.assertEqual(response.code, 200)
        self.assertEqual(amp.connections.accepted, 1)


def test_each_request_gets_the_timeout_of_its_own_query() -> None:
    """
    The C{timeout} of a request's query decides its deadline, whatever
    queries came before: remembered per query, and past the number of
    queries remembered, found again.
    """
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from amp.http import HTTPServerFactory
    from amp.metrics import Metrics
    from amp.web import _QUERIES_KEPT, ReviewHandler
    from tests.support.helpers import review_bytes

    asked: list[Optional[str]] = []

    class Admitter:
        def deadline(self, timeout: Optional[str], started: float) -> Any:
            asked.append(timeout)
            return None

        def review_into(self, answered: Any, *args: Any, **kwargs: Any) -> None:
            return None

    clock = Clock()
    resource = ReviewHandler(Admitter(), clock, Metrics(), validation=False)  # type: ignore[arg-type]
    factory = HTTPServerFactory(
        {b"/mutate": resource},
        reactor=clock,
        metrics=Metrics(),
        max_body=1 << 20,
        max_connections=1000,
        request_timeout=10.0,
        idle_timeout=60.0,
    )
    body = review_bytes()
    queries = [b"timeout=10s", b"timeout=3s", b"", b"a=1&timeout=5s", b"timeout=10s", b"timeout=7s&x=%41"]
    queries += [b"timeout=%ds" % n for n in range(_QUERIES_KEPT + 5)] + [b"timeout=3s", b"timeout=10s"]
    for query in queries:
        protocol = factory.buildProtocol(None)
        protocol.makeConnection(StringTransport())
        target = b"/mutate" + (b"?" + query if query else b"")
        protocol.dataReceived(
            b"POST %s HTTP/1.1\r\nHost: amp\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (target, len(body), body)
        )
    expected = ["10s", "3s", None, "5s", "10s", "7s"] + [f"{n}s" for n in range(_QUERIES_KEPT + 5)] + ["3s", "10s"]
    assert asked == expected
