"""
Tests for the example endpoints over HTTP: amp_examples.serving (reading
the Pod, answering, logging, the body cap) and amp_examples.server (every
program on one port, ``twistd amp-example``), driven through treq.testing,
StringTransport and a loopback socket.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import test_poddefault
from podfixtures import apply, bare_pod, env_of, jupyter_pod, mesh_pod
from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.logger import capturedLogs
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from amp_examples import failures, poddefault, registry, server, serving


class HTTPTests(SynchronousTestCase):
    """The resource tree, driven through StubTreq."""

    def setUp(self) -> None:
        self.root = server.build_root(max_body=64 * 1024)
        self.client = StubTreq(self.root)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None, raw: bool = False):
        data = body if raw else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", "User-Agent": "amp/0.1.0"}
        hdrs.update(headers or {})
        response = self.successResultOf(self.client.post("http://amp-example" + path, data=data, headers=hdrs))
        content = self.successResultOf(self.client.content(response))
        return response, content

    def post_json(self, path: str, body: Any, headers: dict[str, str] | None = None):
        response, content = self.post(path, body, headers)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        return response.code, json.loads(content)

    def test_user_env_is_a_bare_array_that_applies(self) -> None:
        pod = jupyter_pod()
        code, reply = self.post_json("/user-env", pod, {"X-Amp-Namespace": "hub"})
        self.assertEqual(code, 200)
        self.assertIsInstance(reply, list)
        out = apply(pod, reply)
        self.assertEqual(env_of(out["spec"]["containers"][0])["AMP_USER"], "jovyan")

    def test_registry_object_form_with_warning(self) -> None:
        pod = bare_pod({"name": "nginx", "image": "gcr.io/nginx:latest"})
        code, reply = self.post_json("/registry", pod)
        self.assertEqual(code, 200)
        self.assertEqual(
            reply["patch"], [{"op": "replace", "path": "/spec/containers/0/image", "value": "asia.gcr.io/nginx:latest"}]
        )
        self.assertTrue(reply["allowed"])
        self.assertIn("asia.gcr.io/nginx:latest", reply["warnings"][0])

    def test_registry_uses_the_configured_map(self) -> None:
        client = StubTreq(server.build_root(registry_map={"gcr.io": "eu.gcr.io"}))
        response = self.successResultOf(
            client.post("http://x/registry", data=json.dumps(bare_pod({"name": "a", "image": "gcr.io/a"})).encode())
        )
        reply = json.loads(self.successResultOf(client.content(response)))
        self.assertEqual(reply["patch"][0]["value"], "eu.gcr.io/a")

    def test_sidecar_and_audit_annotation(self) -> None:
        code, reply = self.post_json("/sidecar", mesh_pod())
        self.assertEqual(code, 200)
        self.assertEqual(reply["auditAnnotations"], {"sidecar-injected": "true"})
        self.assertEqual(apply(mesh_pod(), reply["patch"])["spec"]["containers"][-1]["name"], "amp-proxy")

    def test_poddefault_conflict_is_a_denial_in_a_200_reply(self) -> None:
        pod = bare_pod({"name": "a", "image": "x"}, labels={"add-gcp-secret": "true"})
        pod["spec"]["volumes"] = [{"name": "secret-volume", "emptyDir": {}}]
        code, reply = self.post_json("/poddefault", pod)
        self.assertEqual(code, 200)
        self.assertFalse(reply["allowed"])
        self.assertEqual(reply["status"]["code"], 403)

    def test_poddefault_uses_configured_presets(self) -> None:
        presets = poddefault.parse_presets(
            "- name: p\n  selector: {matchLabels: {p: 'y'}}\n  env: [{name: P, value: '1'}]\n"
        )
        client = StubTreq(server.build_root(presets=presets))
        pod = bare_pod({"name": "a"}, labels={"p": "y", "add-gcp-secret": "true"})
        response = self.successResultOf(client.post("http://x/poddefault", data=json.dumps(pod).encode()))
        reply = json.loads(self.successResultOf(client.content(response)))
        self.assertEqual(reply["auditAnnotations"], {"poddefaults": "p"})

    def test_deny_noop_bad_patch_and_validate(self) -> None:
        self.assertEqual(
            self.post_json("/deny", jupyter_pod()),
            (200, {"allowed": False, "status": {"code": 403, "message": "denied by example policy"}}),
        )
        self.assertEqual(self.post_json("/noop", jupyter_pod()), (200, []))
        self.assertEqual(self.post_json("/bad-patch", jupyter_pod()), (200, failures.bad_patch()))
        self.assertEqual(self.post_json("/validate-labels", jupyter_pod()), (200, {"patch": [], "allowed": True}))
        code, reply = self.post_json("/validate-labels", bare_pod({"name": "a"}))
        self.assertEqual(reply["status"], {"code": 403, "message": "pod has no app label"})

    def test_error_and_garbage(self) -> None:
        response, _ = self.post("/error", jupyter_pod())
        self.assertEqual(response.code, 500)
        response, content = self.post("/garbage", jupyter_pod())
        self.assertEqual(response.code, 200)
        self.assertRaises(ValueError, json.loads, content)

    def test_hang_never_answers(self) -> None:
        d = self.client.post("http://x/hang", data=json.dumps(jupyter_pod()).encode())
        self.client.flush()
        self.assertNoResult(d)
        self.assertEqual(len(self.root.children[b"hang"].handler.pending), 1)

    def test_non_json_and_non_object_bodies_get_400(self) -> None:
        for body in (b"not json", b"\xff\xfe", b"[1, 2]", b'"pod"', b""):
            response, content = self.post("/user-env", body, raw=True)
            self.assertEqual(response.code, 400, body)
            self.assertIn("error", json.loads(content))

    def test_oversized_body_gets_413(self) -> None:
        pod = jupyter_pod()
        pod["metadata"]["annotations"]["big"] = "x" * (64 * 1024)
        response, _ = self.post("/user-env", pod)
        self.assertEqual(response.code, 413)

    def test_malformed_pod_shape_gets_400(self) -> None:
        pod = bare_pod({"name": "a", "env": {"not": "a list"}})
        response, content = self.post("/user-env", pod)
        self.assertEqual(response.code, 400)
        self.assertIn("/spec/containers/0/env", json.loads(content)["error"])

    def test_get_is_not_allowed_and_healthz_is_ok(self) -> None:
        response = self.successResultOf(self.client.get("http://x/deny"))
        self.assertEqual(response.code, 405)
        self.assertEqual(response.headers.getRawHeaders("allow"), ["POST"])
        response = self.successResultOf(self.client.get("http://x/healthz"))
        self.assertEqual(response.code, 200)
        self.assertEqual(self.successResultOf(self.client.content(response)), b"ok\n")

    def test_requests_are_logged_with_fields_but_without_the_pod(self) -> None:
        pod = jupyter_pod()
        pod["metadata"]["annotations"]["secret-token"] = "s3cr3t-value"
        with capturedLogs() as events:
            self.post_json(
                "/user-env", pod, {"X-Amp-Namespace": "team-a", "X-Amp-Uid": "u-1", "X-Amp-Operation": "CREATE"}
            )
            self.post_json("/deny", pod, {"X-Amp-Namespace": "team-b"})
            self.post("/user-env", b"{", raw=True)
        ours = [e for e in events if e.get("log_namespace") == "amp_examples.serving"]
        self.assertEqual(
            [(e["path"], e["namespace"], e["result"], e["status"]) for e in ours],
            [
                ("/user-env", "team-a", "patched", 200),
                ("/deny", "team-b", "denied", 200),
                ("/user-env", "", "bad-request", 400),
            ],
        )
        self.assertEqual(ours[0]["uid"], "u-1")
        self.assertEqual(ours[0]["operation"], "CREATE")
        self.assertEqual(ours[0]["ops"], 5)
        for event in events:
            self.assertNotIn("s3cr3t-value", repr(event))


class TapTests(SynchronousTestCase):
    """twistd glue: options and the service."""

    def test_defaults(self) -> None:
        options = server.Options()
        options.parseOptions([])
        self.assertEqual(options["port"], 8090)
        self.assertEqual(options["interface"], "127.0.0.1")
        self.assertEqual(options["registry_map"], dict(registry.DEFAULT_REGISTRY_MAP))
        self.assertEqual([p.name for p in options["preset_list"]], ["add-gcp-secret"])

    def test_registry_map_is_repeatable_and_replaces_default(self) -> None:
        options = server.Options()
        options.parseOptions(["--registry-map", "gcr.io=asia.gcr.io", "--registry-map", "quay.io=q.local"])
        self.assertEqual(options["registry_map"], {"gcr.io": "asia.gcr.io", "quay.io": "q.local"})

    def test_bad_options(self) -> None:
        for argv in (
            ["--registry-map", "nonsense"],
            ["--port", "70000"],
            ["--presets", "/nonexistent/p.yaml"],
            ["--max-body", "0"],
        ):
            self.assertRaises(usage.UsageError, server.Options().parseOptions, argv)

    def test_make_service_listens_where_told(self) -> None:
        options = server.Options()
        options.parseOptions(["--port", "18091", "--interface", "::1"])
        reactor = MemoryReactor()
        service = server.makeService(options, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        ((port, factory, _, interface),) = reactor.tcpServers
        self.assertEqual((port, interface), (18091, "::1"))
        client = StubTreq(factory.resource)
        response = self.successResultOf(client.post("http://x/noop", data=b"{}"))
        self.assertEqual(self.successResultOf(client.content(response)), b"[]")


class CappedRequestTests(SynchronousTestCase):
    """The request class stops buffering an oversized body instead of storing it."""

    def _serve(self, head: bytes, body_parts: list[bytes]):
        seen: list[serving.CappedRequest] = []

        class Recording(serving.capped_request_factory(1000)):  # type: ignore[misc]
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                seen.append(self)

        site = server.build_site(max_body=1000, reactor=Clock())
        site.requestFactory = Recording
        protocol = site.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(head)
        for part in body_parts:
            protocol.dataReceived(part)
        return seen, transport

    def test_declared_length_over_the_cap_is_not_buffered(self) -> None:
        seen, transport = self._serve(b"POST /noop HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", [b"x" * 500])
        (request,) = seen
        self.assertTrue(request.body_too_large)
        self.assertEqual(request.content.tell(), 0)
        self.assertEqual(transport.value(), b"", "no answer before the body has arrived")

    def test_chunked_body_stops_buffering_past_the_cap(self) -> None:
        chunk = b"800\r\n" + b"x" * 0x800 + b"\r\n"
        seen, transport = self._serve(
            b"POST /noop HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", [chunk, chunk, b"0\r\n\r\n"]
        )
        self.assertTrue(seen[0].body_too_large)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 413 "))

    def test_body_within_the_cap_is_served(self) -> None:
        seen, transport = self._serve(b"POST /noop HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n", [b"{}"])
        self.assertFalse(seen[0].body_too_large)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 "))
        self.assertTrue(transport.value().endswith(b"\r\n\r\n[]"))


def test_presets_file_option(tmp_path):
    path = tmp_path / "presets.yaml"
    path.write_text(test_poddefault.PRESETS_YAML)
    options = server.Options()
    options.parseOptions(["--presets", str(path)])
    assert [p.name for p in options["preset_list"]] == ["add-gcp-secret", "mount-datasets", "proxy-env"]
    path.write_text("- name: x\n")
    with pytest.raises(usage.UsageError) as info:
        server.Options().parseOptions(["--presets", str(path)])
    assert "selector is required" in str(info.value)


@implementer(IBodyProducer)
class _ChunkedBody:
    """A body of unknown length, so the client sends it chunked."""

    length = UNKNOWN_LENGTH

    def __init__(self, data: bytes) -> None:
        self.data = data

    def startProducing(self, consumer):
        for i in range(0, len(self.data), 4096):
            consumer.write(self.data[i : i + 4096])
        return defer.succeed(None)

    def stopProducing(self) -> None:
        pass

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


class LoopbackTests(TestCase):
    """The real Site on a loopback socket: the body cap holds for real uploads."""

    def setUp(self):
        import treq
        from twisted.internet import reactor

        self.reactor = reactor
        self.treq = treq
        self.port = reactor.listenTCP(0, server.build_site(max_body=1000), interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.url = f"http://127.0.0.1:{self.port.getHost().port}"

    @defer.inlineCallbacks
    def _post(self, path, body):
        response = yield self.treq.post(
            self.url + path, data=body, pool=self.pool, headers={"Content-Type": "application/json"}
        )
        content = yield self.treq.content(response)
        return response.code, content

    @defer.inlineCallbacks
    def test_small_pod_is_served(self):
        code, content = yield self._post("/sidecar", json.dumps(bare_pod({"name": "a", "image": "x"})).encode())
        self.assertEqual(code, 200)
        self.assertTrue(json.loads(content)["patch"])

    @defer.inlineCallbacks
    def test_body_over_the_cap_with_content_length(self):
        code, _ = yield self._post("/noop", b"{" + b" " * 2000 + b"}")
        self.assertEqual(code, 413)

    @defer.inlineCallbacks
    def test_chunked_body_over_the_cap(self):
        code, _ = yield self._post("/noop", _ChunkedBody(b"{" + b" " * 20000 + b"}"))
        self.assertEqual(code, 413)

    @defer.inlineCallbacks
    def test_chunked_body_under_the_cap(self):
        code, content = yield self._post("/noop", _ChunkedBody(b"{}"))
        self.assertEqual((code, content), (200, b"[]"))


class HandlerTests(SynchronousTestCase):
    """What serving.PodEndpoint does with what a handler returns or raises."""

    def serve(self, handler: serving.Handler) -> tuple[Any, StringTransport]:
        site = serving.build_site(serving.build_root({"h": handler}), reactor=Clock())
        protocol = site.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        body = b'{"metadata": {"name": "p"}}'
        protocol.dataReceived(
            b"POST /h HTTP/1.1\r\nHost: x\r\nX-Amp-Namespace: team-a\r\nX-Amp-Uid: u-7\r\n"
            b"X-Amp-Dry-Run: true\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return protocol, transport

    def test_the_handler_gets_the_pod_and_amps_headers(self) -> None:
        seen: list[tuple[Any, serving.Call]] = []
        self.serve(lambda pod, call: seen.append((pod, call)) or [])
        self.assertEqual(
            seen,
            [({"metadata": {"name": "p"}}, serving.Call(namespace="team-a", operation="", uid="u-7", dry_run=True))],
        )

    def test_a_deferred_reply_is_sent_when_it_fires(self) -> None:
        d: defer.Deferred[Any] = defer.Deferred()
        _, transport = self.serve(lambda pod, call: d)
        self.assertEqual(transport.value(), b"")
        d.callback([{"op": "add", "path": "/metadata/labels", "value": {}}])
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 "))
        self.assertTrue(transport.value().endswith(b'[{"op":"add","path":"/metadata/labels","value":{}}]'))

    def test_a_pending_reply_is_cancelled_when_the_client_hangs_up(self) -> None:
        cancelled: list[object] = []
        protocol, transport = self.serve(lambda pod, call: defer.Deferred(cancelled.append))
        with capturedLogs() as events:
            protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(cancelled), 1)
        self.assertEqual(transport.value(), b"")
        self.assertEqual([e["result"] for e in events if "result" in e], ["client-gone"])

    def test_a_handler_that_raises_gets_a_500_and_a_logged_traceback(self) -> None:
        with capturedLogs() as events:
            _, transport = self.serve(lambda pod, call: 1 / 0)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 500 "))
        self.assertTrue(transport.value().endswith(b'{"error":"endpoint failed"}'))
        self.assertTrue([e for e in events if e.get("log_failure") is not None])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_a_deferred_value_error_is_a_400(self) -> None:
        _, transport = self.serve(lambda pod, call: defer.fail(ValueError("no spec")))
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 400 "))
        self.assertIn(b"cannot handle this pod: no spec", transport.value())


class ProgramTests(SynchronousTestCase):
    """Every program stands alone and the server is exactly their sum."""

    def test_the_server_serves_every_programs_paths(self) -> None:
        served = {name.decode() for name in server.build_root().children if name != b"healthz"}
        expected = {path for program in server.PROGRAMS for path in program.endpoints({})}
        self.assertEqual(served, expected)
        self.assertEqual(len(expected), sum(len(program.endpoints({})) for program in server.PROGRAMS))

    def test_the_server_parses_every_programs_options(self) -> None:
        options = server.Options()
        options.parseOptions([])
        for program in server.PROGRAMS:
            own = program.Options()
            own.parseOptions([])
            self.assertLessEqual(set(own), set(options), program.__name__)
