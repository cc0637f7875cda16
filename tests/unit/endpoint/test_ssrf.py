"""
Hostile endpoint annotations (SSRF): whatever a namespace's annotation names,
amp reaches only what the allow-list and C{endpoints.deny_networks} permit,
and says why it refused.

Every case goes through the L{Admitter} and checks the answer the API
server would get: under C{Ignore} the warning, the audit annotation and the
C{amp.txn2.com/status} annotation; under C{Fail} the deny message.
Addresses outside loopback are never connected to: these cases run on a
L{MemoryReactorClock}, whose connect attempts are only recorded.  The cases
that need a real server (127.0.0.0/8, and C{/mutate} over TLS) are in
tests/integration/loopback/test_ssrf.py.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IHostnameResolver
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from amp.admission import STATUS_ANNOTATION, Admitter
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.config import ConfigError, parse_config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.endpoint._connect import Resolution
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.urls import NAMED_NETWORKS, denied_network, parse_endpoint_url, parse_networks, shown_url, step_names
from tests.support.helpers import decode_answer, make_config, namespace, review_bytes

EVERYWHERE = ["http://*:*/*", "https://*:*/*"]


# ---------------------------------------------------------------- helpers


@implementer(IHostnameResolver)
class ScriptedResolver:
    """
    Answers the n-th query with C{answers[n]} (the last answer again once
    they run out), whatever the name; records the names asked.
    """

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.queries: list[str] = []

    def resolveHostName(
        self,
        receiver: Any,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,
        transportSemantics: str = "TCP",
    ) -> Any:
        answer = self.answers[min(len(self.queries), len(self.answers) - 1)]
        self.queries.append(hostName)
        resolution = Resolution(hostName)
        receiver.resolutionBegan(resolution)
        for address in answer:
            cls = IPv6Address if ":" in address else IPv4Address
            receiver.addressResolved(cls("TCP", address, portNumber))
        receiver.resolutionComplete()
        return resolution


class Reviewer:
    """
    An L{Admitter} with its own L{EndpointClient} on C{reactor_}, for the
    namespace C{team-a} annotated with C{endpoint}.
    """

    def __init__(
        self,
        reactor_: Any,
        endpoint: str,
        *,
        policy: str = "Ignore",
        allow: Any = None,
        deny: Any = None,
        resolver: Any = None,
        **endpoints: Any,
    ) -> None:
        section: dict[str, Any] = dict(endpoints)
        if allow is not None:
            section["allow"] = allow
        if deny is not None:
            section["deny_networks"] = deny
        self.config = make_config({"team-a": namespace(endpoint, failure_policy=policy)}, endpoints=section)
        self.metrics = Metrics()
        self.breakers = BreakerRegistry(reactor_, lambda origin, state: None)
        self.reactor = reactor_
        self.client = EndpointClient(reactor_, self.metrics, self.breakers, resolver=resolver)
        self.admitter = Admitter(
            self.config, StaticNamespaceSource(self.config.kubernetes), self.client, reactor_, self.metrics
        )

    def review(self) -> Deferred:
        """Resolves to C{(response, outcome)}: the AdmissionReview's response, decoded."""
        d = self.admitter.review(parse_review(review_bytes()), Deadline.after(self.reactor.seconds(), 5.0))
        return d.addCallback(lambda result: (decode_answer(result[0])["response"], result[1]))

    def count(self, origin: str, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "amp_endpoint_requests_total", {"endpoint": origin, "outcome": outcome}
        )
        return value or 0.0


class Answers:
    """Assertions on what the API server is told."""

    def assertIgnored(self, response: dict, reason: str, where: str, message: str) -> None:
        self.assertTrue(response["allowed"], response)  # type: ignore[attr-defined]
        self.assertEqual(
            response["warnings"],  # type: ignore[attr-defined]
            [f"amp: {where} {reason}; admitted without the endpoint's patch"],
        )
        audit = response["auditAnnotations"]["error"]
        self.assertIn(f"endpoint {where} failed ({reason}): ", audit)  # type: ignore[attr-defined]
        self.assertIn(message, audit)  # type: ignore[attr-defined]
        [op] = response["_patch"]
        self.assertEqual(
            op["value"],
            {STATUS_ANNOTATION: f"skipped {reason} {where}"}  # type: ignore[attr-defined]
            if op["path"] == "/metadata/annotations"
            else f"skipped {reason} {where}",
        )

    def assertDenied(self, response: dict, reason: str, message: str) -> None:
        self.assertFalse(response["allowed"], response)  # type: ignore[attr-defined]
        text = response["status"]["message"]
        self.assertIn(f"({reason}): ", text)  # type: ignore[attr-defined]
        self.assertIn(message, text)  # type: ignore[attr-defined]
        self.assertTrue(text.endswith("; failure policy Fail denies the Pod"), text)  # type: ignore[attr-defined]
        self.assertIsNone(response["_patch"])  # type: ignore[attr-defined]


# ---------------------------------------------------------------- addresses that are never connected to


class NeverConnectedTests(SynchronousTestCase, Answers):
    """
    Metadata, link-local and mapped addresses on a memory reactor: the
    check must refuse them before any connect is even attempted.
    """

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()

    def review(self, endpoint: str, **kw: Any) -> tuple[dict, Any, Reviewer]:
        r = Reviewer(self.reactor, endpoint, **kw)
        response, outcome = self.successResultOf(r.review())
        self.assertEqual(self.reactor.tcpClients, [], "amp tried to connect")
        return response, outcome, r

    def test_metadata_address_denied_by_deny_networks(self) -> None:
        url = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
        response, outcome, r = self.review(url, allow=EVERYWHERE, deny=["link-local"])
        self.assertEqual(outcome.reason, "denied-address")
        self.assertIgnored(
            response,
            "denied-address",
            "http://169.254.169.254:80",
            "address 169.254.169.254 is in endpoints.deny_networks (169.254.0.0/16)",
        )
        self.assertEqual(r.count("http://169.254.169.254:80", "denied-address"), 1)

    def test_metadata_address_denied_under_fail(self) -> None:
        response, outcome, r = self.review(
            "http://169.254.169.254/", policy="Fail", allow=EVERYWHERE, deny=["metadata"]
        )
        self.assertEqual(outcome.result, "failed")
        self.assertDenied(
            response, "denied-address", "address 169.254.169.254 is in endpoints.deny_networks (169.254.169.254/32)"
        )

    def test_metadata_address_refused_by_the_allow_list(self) -> None:
        """Without a deny list, the default allow-list (in-cluster Services only) refuses it."""
        config_allow = list(parse_config({}).endpoints.allow)
        response, outcome, _ = self.review(
            "http://169.254.169.254/latest/meta-data/", allow=[p.text for p in config_allow]
        )
        self.assertEqual(outcome.reason, "not-allowed")
        self.assertIgnored(
            response,
            "not-allowed",
            "http://169.254.169.254:80",
            "endpoint http://169.254.169.254:80 is not in endpoints.allow",
        )

    def test_ipv4_mapped_ipv6_literal_is_checked_as_ipv4(self) -> None:
        for literal in ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe", "64:ff9b::a9fe:a9fe"):
            response, outcome, _ = self.review(f"http://[{literal}]:80/", allow=EVERYWHERE, deny=["link-local"])
            self.assertEqual(outcome.reason, "denied-address", literal)
            self.assertIn(
                f"address {literal} is in endpoints.deny_networks (169.254.0.0/16)",
                response["auditAnnotations"]["error"],
            )

    def test_ipv6_link_local_and_loopback_literals(self) -> None:
        for literal, net in (("fe80::1", "fe80::/10"), ("::1", "::1/128"), ("fd00:ec2::254", "fd00:ec2::254/128")):
            response, outcome, _ = self.review(
                f"https://[{literal}]:8443/", allow=EVERYWHERE, deny=["link-local", "loopback", "metadata"]
            )
            self.assertEqual(outcome.reason, "denied-address", literal)
            self.assertIn(f"({net})", response["auditAnnotations"]["error"])

    def test_zero_address_reaches_this_host_and_is_loopback(self) -> None:
        response, outcome, _ = self.review("http://0.0.0.0:9090/metrics", allow=EVERYWHERE, deny=["loopback"])
        self.assertEqual(outcome.reason, "denied-address")

    def test_host_name_resolving_to_the_metadata_address(self) -> None:
        resolver = ScriptedResolver(["169.254.169.254"])
        response, outcome, r = self.review(
            "http://metadata.google.internal/computeMetadata/v1/",
            allow=EVERYWHERE,
            deny=["link-local"],
            resolver=resolver,
        )
        self.assertEqual(resolver.queries, ["metadata.google.internal"])
        self.assertIgnored(
            response,
            "denied-address",
            "http://metadata.google.internal:80",
            "host metadata.google.internal resolves to 169.254.169.254, which is in "
            "endpoints.deny_networks (169.254.0.0/16)",
        )

    def test_host_name_resolving_to_a_mapped_address(self) -> None:
        resolver = ScriptedResolver(["::ffff:169.254.169.254"])
        response, outcome, _ = self.review(
            "http://evil.team-a.svc:80/", allow=EVERYWHERE, deny=["169.254.169.254/32"], resolver=resolver
        )
        self.assertEqual(outcome.reason, "denied-address")
        self.assertIn("resolves to ::ffff:169.254.169.254", response["auditAnnotations"]["error"])

    def test_denied_calls_do_not_open_the_breaker(self) -> None:
        r = Reviewer(
            self.reactor,
            "http://169.254.169.254/",
            allow=EVERYWHERE,
            deny=["link-local"],
            breaker={"consecutive_failures": 1},
        )
        for _ in range(3):
            _, outcome = self.successResultOf(r.review())
            self.assertEqual(outcome.reason, "denied-address")
        self.assertEqual(
            r.breakers.get("http://169.254.169.254:80", r.config.endpoints.defaults.breaker).state, "closed"
        )
        self.assertEqual(self.reactor.tcpClients, [])

    def test_a_resolution_that_never_ends_times_out_and_its_late_answer_is_dropped(self) -> None:
        held: list[Any] = []

        @implementer(IHostnameResolver)
        class Slow:
            def resolveHostName(
                self,
                receiver: Any,
                hostName: str,
                portNumber: int = 0,
                addressTypes: Any = None,
                transportSemantics: str = "TCP",
            ) -> Any:
                held.append((receiver, portNumber))
                receiver.resolutionBegan(Resolution(hostName))
                return Resolution(hostName)

        r = Reviewer(self.reactor, "http://slow-dns.team-a.svc:8080/", allow=EVERYWHERE, timeout="2s", resolver=Slow())
        d = r.review()
        self.reactor.advance(1.999)
        self.assertNoResult(d)
        self.reactor.advance(0.001)
        response, outcome = self.successResultOf(d)
        self.assertEqual(outcome.reason, "timeout")
        [(receiver, port)] = held
        receiver.addressResolved(IPv4Address("TCP", "10.0.0.1", port))
        receiver.resolutionComplete()
        self.assertEqual(self.reactor.tcpClients, [])

    def test_allowed_resolution_connects_to_the_checked_address(self) -> None:
        """The control case: an allowed answer is connected to, at that address."""
        resolver = ScriptedResolver(["10.96.0.10"], ["169.254.169.254"])
        r = Reviewer(
            self.reactor, "http://user-env.platform.svc:8080/", allow=EVERYWHERE, deny=["link-local"], resolver=resolver
        )
        r.review()
        [(host, port, *_)] = self.reactor.tcpClients
        self.assertEqual((host, port), ("10.96.0.10", 8080))
        self.assertEqual(resolver.queries, ["user-env.platform.svc"])


# ---------------------------------------------------------------- URLs refused before anything is resolved


class BadURLTests(SynchronousTestCase, Answers):
    """
    URLs refused by the parser: the allow-list here admits every scheme,
    host and port, so the refusal is the parser's.
    """

    def review(self, endpoint: str, policy: str = "Ignore") -> tuple[dict, Any]:
        reactor_ = MemoryReactorClock()
        r = Reviewer(reactor_, endpoint, policy=policy, allow=["*://*:*/*"])
        response, outcome = self.successResultOf(r.review())
        self.assertEqual(outcome.reason, "bad-url")
        self.assertEqual(reactor_.tcpClients, [], "amp tried to connect")
        return response, outcome

    def test_non_http_schemes(self) -> None:
        for url, scheme in (
            ("file:///etc/passwd", "file"),
            ("gopher://127.0.0.1:6379/_SET%20x", "gopher"),
            ("ftp://127.0.0.1/", "ftp"),
            ("dict://127.0.0.1:11211/stat", "dict"),
            ("HTTPS+unix://%2Fvar%2Frun%2Fdocker.sock/", "https+unix"),
        ):
            response, _ = self.review(url, policy="Fail")
            self.assertDenied(response, "bad-url", f"endpoint URL scheme {scheme!r} is not http or https")

    def test_credentials(self) -> None:
        for url in (
            "http://user:secret@127.0.0.1:8080/mutate",
            "http://127.0.0.1:80@evil.example/",
            "http://:secret@127.0.0.1/",
        ):
            response, _ = self.review(url)
            self.assertIn("endpoint URL must not contain credentials", response["auditAnnotations"]["error"])
            self.assertTrue(response["allowed"])

    def test_cr_lf(self) -> None:
        for url in (
            "http://127.0.0.1:8080/mutate\r\nX-Injected: 1",
            "http://127.0.0.1:8080/a\rb",
            "http://127.0.0.1:8080/a\tb",
            "http://127.0.0.1:8080/\x00",
        ):
            response, _ = self.review(url, policy="Fail")
            self.assertDenied(response, "bad-url", "endpoint URL contains whitespace or control characters")
            self.assertNotIn("\r", response["status"]["message"])
            self.assertNotIn("\n", response["status"]["message"])
        # A newline separates the URLs of a chain: every piece is checked
        # before any call, and "Host:" is no URL.
        response, _ = self.review("http://127.0.0.1:8080/\nHost: evil", policy="Fail")
        self.assertDenied(response, "bad-url", "endpoint URL")
        self.assertNotIn("\n", response["status"]["message"])

    def test_control_characters(self) -> None:
        response, _ = self.review("http://127.0.0.1:8080/\x00", policy="Fail")
        self.assertDenied(response, "bad-url", "endpoint URL contains whitespace or control characters")
        self.assertNotIn("\x00", response["status"]["message"])


class ShownURLTests(SynchronousTestCase):
    """L{shown_url}: how a refused annotation may be repeated."""

    def test_credentials_are_masked_and_query_and_fragment_left_out(self) -> None:
        self.assertEqual(shown_url("http://user:secret@127.0.0.1:8080/x?a=b"), "http://***@127.0.0.1:8080/x")
        self.assertEqual(shown_url("http://127.0.0.1:80@evil.example/"), "http://***@evil.example/")
        self.assertEqual(shown_url("user:secret@host/x"), "***@host/x")
        self.assertEqual(shown_url("http://h/x#token=abc"), "http://h/x")
        self.assertEqual(shown_url("http://h?token=abc"), "http://h")

    def test_at_sign_outside_the_authority_is_kept(self) -> None:
        self.assertEqual(shown_url("http://h/a@b?c=d@e"), "http://h/a@b")

    def test_each_url_of_a_chain_is_shown(self) -> None:
        self.assertEqual(shown_url("http://a/x?t=1 \n http://u:p@b/y#f"), "http://a/x http://***@b/y")

    def test_control_and_non_ascii_characters_are_escaped(self) -> None:
        self.assertEqual(shown_url("http://h/a\rX:\t1"), "http://h/a\\x0dX:\\x091")
        self.assertEqual(shown_url("http://caf\u00e9/\u2028x"), "http://caf\\xe9/\\u2028x")

    def test_long_urls_are_clipped(self) -> None:
        shown = shown_url("http://h/" + "a" * 500)
        self.assertEqual(len(shown), 200)
        self.assertTrue(shown.endswith("..."))

    def test_a_checked_url_is_its_origin_and_path(self) -> None:
        self.assertEqual(shown_url(parse_endpoint_url("http://h/m?token=abc")), "http://h:80/m")


class StepNameTests(SynchronousTestCase):
    """L{step_names}: chain steps told apart without their queries."""

    def names(self, *urls: str) -> tuple[str, ...]:
        return step_names([parse_endpoint_url(u) for u in urls])

    def test_origin_when_alone_path_when_shared_position_when_only_the_query_differs(self) -> None:
        self.assertEqual(self.names("http://a/m?t=1", "http://b/m?t=2"), ("http://a:80", "http://b:80"))
        self.assertEqual(self.names("http://a/m?t=1", "http://a/n?t=2"), ("http://a:80/m", "http://a:80/n"))
        self.assertEqual(
            self.names("http://a/m?t=1", "http://a/m?t=2", "http://a/n"),
            ("http://a:80/m#1", "http://a:80/m#2", "http://a:80/n"),
        )


# ---------------------------------------------------------------- the deny list itself


class DenyListTests(SynchronousTestCase):
    def test_names_expand_to_their_ranges(self) -> None:
        self.assertEqual(
            parse_networks(["link-local"]), (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
        )
        for name, ranges in NAMED_NETWORKS.items():
            self.assertEqual(parse_networks([name]), tuple(ipaddress.ip_network(r) for r in ranges))

    def test_cidrs_bare_addresses_and_repeats(self) -> None:
        self.assertEqual(
            parse_networks(["10.0.0.0/8", "192.0.2.7", "fd00::/8", "10.0.0.0/8"]),
            (
                ipaddress.ip_network("10.0.0.0/8"),
                ipaddress.ip_network("192.0.2.7/32"),
                ipaddress.ip_network("fd00::/8"),
            ),
        )

    def test_config_names_the_key_and_the_item(self) -> None:
        with self.assertRaises(ConfigError) as e:
            parse_config({"endpoints": {"deny_networks": ["loopback", "metdata"]}})
        self.assertEqual(
            str(e.exception),
            "endpoints.deny_networks: item 1: 'metdata' is not a CIDR (like 10.0.0.0/8 or fd00::/8) "
            "or one of loopback, link-local, metadata, private, cgnat",
        )

    def test_config_carries_the_list_into_every_override(self) -> None:
        config = parse_config(
            {
                "endpoints": {
                    "deny_networks": ["link-local"],
                    "overrides": [{"match": "http://slow.svc:80/*", "timeout": "8s"}],
                }
            }
        )
        expected = parse_networks(["link-local"])
        self.assertEqual(config.endpoints.deny_networks, expected)
        self.assertEqual(config.endpoints.defaults.deny_networks, expected)
        self.assertEqual(config.endpoints.overrides[0].settings.deny_networks, expected)

    def test_an_override_cannot_loosen_it(self) -> None:
        with self.assertRaises(ConfigError) as e:
            parse_config(
                {
                    "endpoints": {
                        "deny_networks": ["link-local"],
                        "overrides": [{"match": "http://x.svc:80/*", "deny_networks": []}],
                    }
                }
            )
        self.assertTrue(str(e.exception).startswith("endpoints.overrides[0].deny_networks: unknown key"))

    def test_default_denies_nothing(self) -> None:
        self.assertEqual(parse_config({}).endpoints.deny_networks, ())

    def test_mapped_and_nat64_addresses(self) -> None:
        nets = parse_networks(["link-local", "loopback"])
        for address, expected in (
            ("169.254.169.254", "169.254.0.0/16"),
            ("::ffff:169.254.169.254", "169.254.0.0/16"),
            ("::ffff:127.0.0.1", "127.0.0.0/8"),
            ("64:ff9b::7f00:1", "127.0.0.0/8"),
            ("fe80::1%eth0", "fe80::/10"),
            ("::", "::/128"),
            ("0.0.0.0", "0.0.0.0/8"),
            ("10.0.0.1", None),
            ("::ffff:10.0.0.1", None),
            ("2001:db8::1", None),
        ):
            net = denied_network(address, nets)
            self.assertEqual(str(net) if net is not None else None, expected, address)

    def test_ipv6_range_in_the_list_matches_ipv6_only(self) -> None:
        nets = parse_networks(["::ffff:0:0/96"])
        self.assertIsNotNone(denied_network("::ffff:1.2.3.4", nets))
        self.assertIsNone(denied_network("1.2.3.4", nets))
