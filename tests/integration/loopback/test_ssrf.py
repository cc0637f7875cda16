"""
Hostile endpoint annotations (SSRF) against real servers on 127.0.0.0/8,
with scripted name resolution where the answer matters: amp reaches only
what the allow-list and C{endpoints.deny_networks} permit, through the
L{Admitter} and through C{/mutate} over TLS, and says why it refused.
Addresses outside loopback, never connected to, are checked on a
L{MemoryReactorClock} in tests/unit/endpoint/test_ssrf.py, whose helpers
these tests share.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.support.endpoint_harness import ConnectionCounter
from tests.support.helpers import WebhookClient, decode_answer, make_config, namespace, review_bytes, start_amp
from tests.unit.endpoint.test_ssrf import EVERYWHERE, Answers, Reviewer, ScriptedResolver

PATCH = [{"op": "add", "path": "/metadata/labels", "value": {"via": "endpoint"}}]


class Patcher(Resource):
    """An endpoint: answers every POST with L{PATCH}; remembers request paths and headers."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes, Any]] = []

    def render_POST(self, request: Any) -> bytes:
        self.seen.append((request.uri, request.requestHeaders))
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(PATCH).encode()


class Redirector(Resource):
    isLeaf = True

    def __init__(self, location: bytes) -> None:
        super().__init__()
        self.location = location

    def render_POST(self, request: Any) -> bytes:
        request.setResponseCode(302)
        request.setHeader(b"location", self.location)
        return b""


class LoopbackTestCase(TestCase, Answers):
    timeout = 15

    def serve(self, resource: Resource, interface: str = "127.0.0.1", port: int = 0) -> tuple[ConnectionCounter, int]:
        site = Site(resource)
        site.log = lambda request: None  # type: ignore[method-assign]
        factory = ConnectionCounter(site)
        listening = reactor.listenTCP(port, factory, interface=interface)
        self.addCleanup(self._stop, listening, factory)
        return factory, listening.getHost().port

    @inlineCallbacks
    def _stop(self, listening: Any, factory: ConnectionCounter) -> Any:
        yield listening.stopListening()
        # Until every connection is gone, not only told to go.
        yield factory.close_all()

    def reviewer(self, endpoint: str, **kw: Any) -> Reviewer:
        r = Reviewer(reactor, endpoint, **kw)
        self.addCleanup(r.client.close)
        return r


class LoopbackSSRFTests(LoopbackTestCase):
    @inlineCallbacks
    def test_loopback_port_not_in_the_allow_list(self) -> Any:
        allowed, allowed_port = self.serve(Patcher())
        other, other_port = self.serve(Patcher())
        r = self.reviewer(f"http://127.0.0.1:{other_port}/metrics", allow=[f"http://127.0.0.1:{allowed_port}/*"])
        response, outcome = yield r.review()
        self.assertEqual(outcome.reason, "not-allowed")
        self.assertIgnored(
            response,
            "not-allowed",
            f"http://127.0.0.1:{other_port}",
            f"endpoint http://127.0.0.1:{other_port} is not in endpoints.allow",
        )
        self.assertEqual(other.accepted, 0)
        # The allowed port is called.
        r = self.reviewer(f"http://127.0.0.1:{allowed_port}/mutate", allow=[f"http://127.0.0.1:{allowed_port}/*"])
        response, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")

    @inlineCallbacks
    def test_host_in_etc_hosts_resolving_to_loopback(self) -> Any:
        """The system resolver (/etc/hosts: localhost is 127.0.0.1) with loopback denied."""
        server, port = self.serve(Patcher())
        r = self.reviewer(f"http://localhost:{port}/mutate", policy="Fail", allow=EVERYWHERE, deny=["loopback"])
        response, outcome = yield r.review()
        self.assertDenied(
            response,
            "denied-address",
            "host localhost resolves to 127.0.0.1, which is in endpoints.deny_networks (127.0.0.0/8)",
        )
        self.assertEqual(server.accepted, 0)
        # Not denied: the same name is called.
        r = self.reviewer(f"http://localhost:{port}/mutate", allow=EVERYWHERE, deny=["link-local"])
        response, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")
        self.assertEqual(server.accepted, 1)

    @inlineCallbacks
    def test_numeric_host_forms_are_resolved_and_checked(self) -> Any:
        """2130706433 and 0x7f000001 are 127.0.0.1 to the system resolver; the check sees that."""
        server, port = self.serve(Patcher())
        for host in ("2130706433", "0x7f000001", "127.1"):
            r = self.reviewer(f"http://{host}:{port}/mutate", allow=EVERYWHERE, deny=["127.0.0.0/8"])
            response, outcome = yield r.review()
            self.assertEqual(outcome.reason, "denied-address", host)
            self.assertIn(f"host {host} resolves to 127.0.0.1", response["auditAnnotations"]["error"])
        self.assertEqual(server.accepted, 0)

    @inlineCallbacks
    def test_one_denied_address_among_several_refuses_the_call(self) -> Any:
        server, port = self.serve(Patcher())
        for answer in (["127.0.0.1", "127.0.0.2"], ["127.0.0.2", "127.0.0.1"], ["127.0.0.1", "::ffff:127.0.0.2"]):
            resolver = ScriptedResolver(answer)
            r = self.reviewer(
                f"http://endpoint.team-a.svc:{port}/mutate", allow=EVERYWHERE, deny=["127.0.0.2/32"], resolver=resolver
            )
            response, outcome = yield r.review()
            self.assertEqual(outcome.reason, "denied-address", answer)
            self.assertIn(
                "127.0.0.2, which is in endpoints.deny_networks (127.0.0.2/32)", response["auditAnnotations"]["error"]
            )
            self.assertEqual(resolver.queries, ["endpoint.team-a.svc"])
        self.assertEqual(server.accepted, 0)

    @inlineCallbacks
    def test_dns_rebinding_cannot_move_the_connection(self) -> Any:
        """
        The resolver answers an allowed address the first time and a denied
        one after that.  The connection goes to the address that was
        checked; the pooled connection keeps going there; a new connection
        resolves again and is refused.
        """
        good, port = self.serve(Patcher())
        try:
            evil, _ = self.serve(Patcher(), interface="127.0.0.2", port=port)
        except Exception as e:  # pragma: no cover - the port is taken on 127.0.0.2
            raise SkipTest(f"cannot listen on 127.0.0.2:{port}: {e}") from e
        resolver = ScriptedResolver(["127.0.0.1"], ["127.0.0.2"])
        r = self.reviewer(
            f"http://rebind.team-a.svc:{port}/mutate", allow=EVERYWHERE, deny=["127.0.0.2/32"], resolver=resolver
        )
        response, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")
        self.assertEqual((good.accepted, evil.accepted), (1, 0))
        self.assertEqual(resolver.queries, ["rebind.team-a.svc"])
        # The kept-alive connection goes to the checked address, without a lookup.
        response, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")
        self.assertEqual((good.accepted, evil.accepted), (1, 0))
        self.assertEqual(len(resolver.queries), 1)
        # A new connection looks the name up again: now it is denied.
        yield r.client.close_idle_connections()
        response, outcome = yield r.review()
        self.assertEqual(outcome.reason, "denied-address")
        self.assertEqual(len(resolver.queries), 2)
        self.assertEqual((good.accepted, evil.accepted), (1, 0))

    @inlineCallbacks
    def test_rebinding_to_another_allowed_address_also_waits_for_a_new_connection(self) -> Any:
        """Without a deny list the checked-and-connected address is still the one resolved once."""
        first, port = self.serve(Patcher())
        try:
            second, _ = self.serve(Patcher(), interface="127.0.0.2", port=port)
        except Exception as e:  # pragma: no cover
            raise SkipTest(f"cannot listen on 127.0.0.2:{port}: {e}") from e
        resolver = ScriptedResolver(["127.0.0.1"], ["127.0.0.2"])
        r = self.reviewer(f"http://moving.team-a.svc:{port}/mutate", allow=EVERYWHERE, resolver=resolver)
        yield r.review()
        self.assertEqual((first.accepted, second.accepted), (1, 0))
        yield r.client.close_idle_connections()
        _, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")
        self.assertEqual((first.accepted, second.accepted), (1, 1))

    @inlineCallbacks
    def test_redirect_is_not_followed(self) -> Any:
        target, target_port = self.serve(Patcher())
        location = f"http://127.0.0.1:{target_port}/steal".encode()
        redirector, port = self.serve(Redirector(location))
        r = self.reviewer(f"http://127.0.0.1:{port}/mutate", policy="Fail")
        response, outcome = yield r.review()
        self.assertDenied(
            response, "redirect", f"HTTP 302 redirect to http://127.0.0.1:{target_port}/steal not followed"
        )
        self.assertEqual(redirector.accepted, 1)
        self.assertEqual(target.accepted, 0)

    @inlineCallbacks
    def test_encoded_cr_lf_in_the_path_stays_encoded(self) -> Any:
        resource = Patcher()
        server, port = self.serve(resource)
        r = self.reviewer(f"http://127.0.0.1:{port}/mutate%0D%0AX-Injected:%201")
        _, outcome = yield r.review()
        self.assertEqual(outcome.result, "patched")
        [(uri, headers)] = resource.seen
        self.assertEqual(uri, b"/mutate%0D%0AX-Injected:%201")
        self.assertFalse(headers.hasHeader(b"x-injected"))


class MutateTests(LoopbackTestCase):
    @inlineCallbacks
    def test_denied_address_through_mutate(self) -> Any:
        server, port = self.serve(Patcher())
        config = make_config(
            {
                "team-a": namespace(f"http://localhost:{port}/mutate", failure_policy="Fail"),
                "team-b": namespace(f"http://[::ffff:127.0.0.1]:{port}/mutate"),
            },
            endpoints={"allow": EVERYWHERE, "deny_networks": ["loopback", "link-local"]},
        )
        amp = yield start_amp(config, reactor)
        self.addCleanup(amp.stop)
        client = WebhookClient(reactor)
        self.addCleanup(client.close)

        _, body = yield client.post(amp.url("/mutate"), review_bytes(namespace="team-a"))
        response = decode_answer(body)["response"]
        self.assertDenied(
            response,
            "denied-address",
            "host localhost resolves to 127.0.0.1, which is in endpoints.deny_networks (127.0.0.0/8)",
        )

        _, body = yield client.post(amp.url("/mutate"), review_bytes(namespace="team-b"))
        response = decode_answer(body)["response"]
        self.assertIgnored(
            response,
            "denied-address",
            f"http://[::ffff:127.0.0.1]:{port}",
            "address ::ffff:127.0.0.1 is in endpoints.deny_networks (127.0.0.0/8)",
        )
        self.assertEqual(server.accepted, 0)
        self.assertEqual(
            amp.metrics.registry.get_sample_value(
                "amp_endpoint_requests_total", {"endpoint": f"http://localhost:{port}", "outcome": "denied-address"}
            ),
            1,
        )
