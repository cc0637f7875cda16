"""
Integration tests: the real amp service on a loopback TLS port, the real
example endpoint server on another loopback port, and a client that
verifies amp's certificate against the development CA and its IP address.

Every path a review can take goes over the wire here: patched, unchanged,
validated, denied, each kind of endpoint failure under Ignore and under
Fail, and a hung endpoint answered by the policy inside the API server's
C{?timeout=} budget.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, inlineCallbacks
from twisted.trial.unittest import TestCase
from twisted.web._newclient import ResponseNeverReceived
from zope.interface import implementer

from amp.admission import STATUS_ANNOTATION
from amp.namespaces import UNKNOWN, INamespaceSource, StaticNamespaceSource
from tests.support.helpers import (
    UID,
    V1BETA1,
    WebhookClient,
    apply_patch,
    closed_port,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    start_amp,
    start_example,
    wait_all,
)


class IntegrationTestCase(TestCase):
    timeout = 15

    @inlineCallbacks
    def setUp(self) -> Any:
        self.example = yield start_example(reactor)
        self.addCleanup(self.example.stop)
        self.refused_port = yield closed_port(reactor)

    @inlineCallbacks
    def start(self, **config: Any) -> Any:
        """
        amp with namespaces named after example paths (C{user-env},
        C{error}, ...) plus a few special ones; C{config} goes to make_config.
        """
        ex = self.example
        namespaces = {
            name: namespace(ex.url("/" + name))
            for name in (
                "user-env",
                "registry",
                "sidecar",
                "poddefault",
                "deny",
                "noop",
                "bad-patch",
                "error",
                "garbage",
                "hang",
            )
        }
        namespaces.update(
            {
                "team-a": namespace(ex.url("/user-env")),
                "strict": namespace(ex.url("/error"), failure_policy="Fail"),
                "strict-hang": namespace(ex.url("/hang"), failure_policy="Fail"),
                "refused": namespace(f"http://127.0.0.1:{self.refused_port}/user-env"),
                "outside": namespace("http://10.0.0.1:8090/user-env"),
                "validated": namespace(validation=ex.url("/validate-labels")),
                "opted-out": namespace(ex.url("/user-env"), enabled=False),
            }
        )
        amp = yield start_amp(make_config(namespaces, **config), reactor)
        self.addCleanup(amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)
        return amp

    @inlineCallbacks
    def post(self, amp: Any, body: bytes, path: str = "/mutate", query: str = "timeout=10s", uid: str = UID) -> Any:
        response, content = yield self.client.post(amp.url(path, query), body)
        self.assertEqual(response.code, 200, content)
        self.assertFalse(response.headers.hasHeader(b"retry-after"))
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"application/json"])
        doc = decode_answer(content)
        self.assertEqual(doc["response"]["uid"], uid)
        return doc


class PatchedTests(IntegrationTestCase):
    @inlineCallbacks
    def test_user_env_patch_applies(self) -> Any:
        amp = yield self.start()
        the_pod = pod(annotations={"hub.jupyter.org/username": "alice"})
        doc = yield self.post(amp, review_bytes(the_pod, namespace="team-a"))
        response = doc["response"]
        self.assertTrue(response["allowed"])
        patched = apply_patch(the_pod, response["_patch"])
        self.assertIn({"name": "AMP_USER", "value": "alice"}, patched["spec"]["containers"][0]["env"])
        self.assertEqual(patched["spec"]["initContainers"][0]["name"], "new-init-container")
        self.assertEqual(
            amp.metrics.registry.get_sample_value(
                "amp_admission_requests_total",
                {"kind": "Pod", "operation": "CREATE", "result": "patched", "reason": ""},
            ),
            1,
        )

    @inlineCallbacks
    def test_v1beta1_round_trip(self) -> Any:
        amp = yield self.start()
        doc = yield self.post(amp, review_bytes(namespace="sidecar", api_version=V1BETA1))
        self.assertEqual(doc["apiVersion"], V1BETA1)
        self.assertEqual(doc["response"]["auditAnnotations"], {"sidecar-injected": "true"})
        patched = apply_patch(pod(), doc["response"]["_patch"])
        self.assertEqual([c["name"] for c in patched["spec"]["containers"]], ["app", "amp-proxy"])

    @inlineCallbacks
    def test_every_example_use_case_patches(self) -> Any:
        amp = yield self.start()
        the_pod = pod(
            labels={"add-gcp-secret": "true"},
            containers=[{"name": "app", "image": "gcr.io/team/app:1", "ports": [{"containerPort": 80}]}],
        )
        for ns in ("user-env", "registry", "sidecar", "poddefault"):
            doc = yield self.post(amp, review_bytes(the_pod, namespace=ns))
            self.assertTrue(doc["response"]["allowed"], ns)
            self.assertTrue(doc["response"]["_patch"], ns)
            apply_patch(the_pod, doc["response"]["_patch"])

    @inlineCallbacks
    def test_concurrent_reviews_each_get_their_own_answer(self) -> Any:
        amp = yield self.start()
        users = [f"user{i}" for i in range(20)]
        docs = yield wait_all(
            self.post(
                amp,
                review_bytes(pod(annotations={"hub.jupyter.org/username": u}), namespace="team-a", uid=f"uid-{u}"),
                uid=f"uid-{u}",
            )
            for u in users
        )
        for user, doc in zip(users, docs):
            patched = apply_patch(pod(annotations={"hub.jupyter.org/username": user}), doc["response"]["_patch"])
            self.assertIn({"name": "AMP_USER", "value": user}, patched["spec"]["containers"][0]["env"])

    @inlineCallbacks
    def test_endpoint_connections_are_reused(self) -> Any:
        amp = yield self.start()
        for _ in range(5):
            yield self.post(amp, review_bytes(namespace="team-a"))
        self.assertEqual(self.example.connections.accepted, 1)
        self.assertEqual(amp.connections.accepted, 1)


class UnchangedTests(IntegrationTestCase):
    @inlineCallbacks
    def test_unchanged_answers(self) -> Any:
        amp = yield self.start()
        cases = [
            review_bytes(namespace="opted-out"),
            review_bytes(namespace="no-such-namespace"),
            review_bytes(namespace="noop"),
            review_bytes(namespace="team-a", operation="UPDATE"),
            review_bytes({"kind": "Secret"}, namespace="team-a", kind={"group": "", "version": "v1", "kind": "Secret"}),
        ]
        for body in cases:
            doc = yield self.post(amp, body)
            response = doc["response"]
            self.assertTrue(response["allowed"])
            self.assertNotIn("warnings", response)
            if body == cases[2]:
                # Reviewed, no change: only amp's status stamp.
                self.assertEqual(
                    apply_patch(pod(), response["_patch"])["metadata"]["annotations"],
                    {STATUS_ANNOTATION: f"unchanged http://127.0.0.1:{self.example.port}"},
                )
            else:
                self.assertNotIn("patch", response)
        # only the noop namespace reached the example server
        self.assertEqual(self.example.connections.accepted, 1)


class ValidateTests(IntegrationTestCase):
    @inlineCallbacks
    def test_validate_allows_and_denies(self) -> Any:
        amp = yield self.start()
        doc = yield self.post(amp, review_bytes(pod(labels={"app": "web"}), namespace="validated"), "/validate")
        self.assertTrue(doc["response"]["allowed"])
        self.assertNotIn("patch", doc["response"])
        doc = yield self.post(amp, review_bytes(pod(), namespace="validated"), "/validate")
        self.assertFalse(doc["response"]["allowed"])
        self.assertEqual(doc["response"]["status"]["code"], 403)
        self.assertIn("pod has no app label", doc["response"]["status"]["message"])

    @inlineCallbacks
    def test_deny_endpoint_on_mutate(self) -> Any:
        amp = yield self.start()
        doc = yield self.post(amp, review_bytes(namespace="deny"))
        self.assertFalse(doc["response"]["allowed"])
        self.assertIn("denied by example policy", doc["response"]["status"]["message"])


class FailureTests(IntegrationTestCase):
    @inlineCallbacks
    def test_failures_under_ignore(self) -> Any:
        amp = yield self.start(failure_policy="Ignore")
        ex_origin = f"http://127.0.0.1:{self.example.port}"
        cases = {
            "error": ("http-5xx", ex_origin),
            "garbage": ("invalid-json", ex_origin),
            "bad-patch": ("apply-failed", ex_origin),
            "refused": ("connection-refused", f"http://127.0.0.1:{self.refused_port}"),
            "outside": ("not-allowed", "http://10.0.0.1:8090"),
        }
        for ns, (reason, where) in cases.items():
            the_pod = pod()
            doc = yield self.post(amp, review_bytes(the_pod, namespace=ns))
            response = doc["response"]
            self.assertTrue(response["allowed"], ns)
            self.assertIn(reason, response["warnings"][0])
            self.assertIn(where, response["auditAnnotations"]["error"])
            patched = apply_patch(the_pod, response["_patch"])
            self.assertEqual(patched["metadata"]["annotations"][STATUS_ANNOTATION], f"skipped {reason} {where}")
            self.assertEqual(patched["spec"], the_pod["spec"])

    @inlineCallbacks
    def test_failures_under_fail(self) -> Any:
        amp = yield self.start(failure_policy="Fail")
        for ns, reason in (
            ("error", "http-5xx"),
            ("garbage", "invalid-json"),
            ("bad-patch", "apply-failed"),
            ("refused", "connection-refused"),
            ("outside", "not-allowed"),
        ):
            doc = yield self.post(amp, review_bytes(namespace=ns))
            response = doc["response"]
            self.assertFalse(response["allowed"], ns)
            self.assertEqual(response["status"]["code"], 500)
            self.assertIn(f"({reason})", response["status"]["message"])
            self.assertNotIn("patch", response)

    @inlineCallbacks
    def test_namespace_annotation_overrides_the_config(self) -> Any:
        amp = yield self.start(failure_policy="Ignore")
        doc = yield self.post(amp, review_bytes(namespace="strict"))
        self.assertFalse(doc["response"]["allowed"])
        self.assertIn("failure policy Fail", doc["response"]["status"]["message"])


class DeadlineTests(IntegrationTestCase):
    @inlineCallbacks
    def test_hung_endpoint_is_answered_by_the_policy_within_the_budget(self) -> Any:
        # ?timeout=1s less the 0.5s margin: amp gives the endpoint 0.5s,
        # far less than its own 2s endpoint timeout.  The 200ms request
        # timeout covers reading the request only, not the review.
        amp = yield self.start(deadline={"margin": "500ms"}, listen={"request_timeout": "200ms"})
        started = reactor.seconds()
        doc = yield self.post(amp, review_bytes(namespace="hang"), query="timeout=1s")
        elapsed = reactor.seconds() - started
        response = doc["response"]
        self.assertTrue(response["allowed"])
        self.assertIn("timeout", response["warnings"][0])
        # 0.5s less the few milliseconds amp spent before the call
        self.assertRegex(response["auditAnnotations"]["error"], r"no reply within 0\.(5|4\d*)s$")
        self.assertEqual(
            apply_patch(pod(), response["_patch"])["metadata"]["annotations"][STATUS_ANNOTATION],
            f"skipped timeout http://127.0.0.1:{self.example.port}",
        )
        self.assertLess(elapsed, 5.0)

    @inlineCallbacks
    def test_hung_endpoint_under_fail_is_denied_in_time(self) -> Any:
        amp = yield self.start(deadline={"margin": "500ms"})
        doc = yield self.post(amp, review_bytes(namespace="strict-hang"), query="timeout=1s")
        response = doc["response"]
        self.assertFalse(response["allowed"])
        self.assertEqual(response["status"]["code"], 500)
        self.assertIn("(timeout)", response["status"]["message"])

    @inlineCallbacks
    def test_api_server_hanging_up_cancels_the_endpoint_call(self) -> Any:
        yield self.hang_up_and_check((yield self.start()))

    @inlineCallbacks
    def test_hanging_up_after_a_namespace_fetch_cancels_the_endpoint_call(self) -> Any:
        """The same when the namespace came from a fetch that answered at once."""
        source = FetchOnly(self.example.url("/hang"))
        amp = yield start_amp(make_config(failure_policy="Ignore"), reactor, namespaces=source)
        self.addCleanup(amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)
        yield self.hang_up_and_check(amp)
        self.assertEqual(source.fetched, ["hang"])

    @inlineCallbacks
    def hang_up_and_check(self, amp: Any) -> Any:
        endpoint = self.example.root.children[b"hang"]
        hang = endpoint.handler
        arrived: Deferred = Deferred()

        def hang_and_tell(pod: Any, call: Any) -> Any:
            result = hang(pod, call)
            arrived.callback(None)
            return result

        endpoint.handler = hang_and_tell
        started = reactor.seconds()
        call = self.client.post(amp.url("/mutate", "timeout=10s"), review_bytes(namespace="hang"))
        call.addErrback(lambda f: f.trap(CancelledError, ResponseNeverReceived))
        yield arrived.addTimeout(5, reactor)
        self.assertEqual(len(hang.pending), 1)
        call.cancel()
        yield call
        # amp drops its call to the endpoint at once, not at the 2s endpoint timeout
        yield self.example.connections.wait_idle()
        self.assertEqual(hang.pending, set())
        self.assertLess(reactor.seconds() - started, 2.0)


@implementer(INamespaceSource)
class FetchOnly(StaticNamespaceSource):
    """A source with an empty cache whose fetch answers at once (a Deferred already fired)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(make_config({"hang": namespace(endpoint)}).kubernetes)
        self.fetched: list[str] = []

    def cached(self, name: str) -> Any:
        return UNKNOWN

    def fetch(self, name: str, timeout: float) -> Any:
        self.fetched.append(name)
        return super().fetch(name, timeout)
