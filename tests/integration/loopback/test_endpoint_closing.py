"""
Endpoints that end their connections, as C{http.server} endpoints on
loopback (L{tests.support.stdlib_endpoints}) do, the smallest endpoint an
author can write: through the client, a running amp and C{amp explain},
every call succeeds however the endpoint ends or keeps its connections.
Which replies keep their connection and the one resend, byte by byte on a
L{MemoryReactorClock}, are in tests/unit/endpoint/test_endpoint_closing.py.
"""

from __future__ import annotations

import io
import os
from typing import Any

import yaml
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from amp.cli.explain import EXIT_ADMITTED, run
from tests.support.endpoint_harness import RealHarness
from tests.support.helpers import (
    ENABLED_LABEL,
    EP_ANNOTATION,
    WebhookClient,
    apply_patch,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    start_amp,
)
from tests.support.stdlib_endpoints import IdleClose, StdlibEndpoint, Style


class StdlibEndpointTests(TestCase):
    """
    The client against C{http.server} endpoints: every call succeeds.
    """

    timeout = 60

    def endpoint(self, style: Style, idle_close: Any = None) -> StdlibEndpoint:
        server = StdlibEndpoint(style, idle_close).start()
        self.addCleanup(server.stop_later)
        return server

    @inlineCallbacks
    def calls_in_a_row(self, server: StdlibEndpoint, n: int = 100) -> Any:
        h = RealHarness(self)
        url = server.url()
        for i in range(n):
            decision = yield h.call(url)
            self.assertEqual(decision.patch[0]["value"], {"team": "payments"}, i)
        self.assertEqual(h.count(url, "ok"), n)
        self.assertEqual(server.requests, n)
        return h

    @inlineCallbacks
    def test_endpoints_that_close_every_connection(self) -> Any:
        # HTTP/1.0 with a Content-Length, HTTP/1.0 with the body ending at
        # the close, HTTP/1.1 with Connection: close.
        for style in (Style.HTTP10, Style.HTTP10_UNTIL_CLOSE, Style.CLOSE):
            server = self.endpoint(style)
            yield self.calls_in_a_row(server)
            self.assertEqual(server.connections, 100, style)

    @inlineCallbacks
    def test_keep_alive(self) -> Any:
        server = self.endpoint(Style.KEEP_ALIVE)
        yield self.calls_in_a_row(server)
        self.assertEqual(server.connections, 1)

    @inlineCallbacks
    def test_keep_alive_closed_after_a_random_idle_time(self) -> Any:
        server = self.endpoint(Style.KEEP_ALIVE, IdleClose(seed=23, most=0.004))
        h = yield self.calls_in_a_row(server)
        # The endpoint did close kept connections along the way.
        self.assertGreater(server.connections, 1)
        self.assertGreater(server.idle_closed, 0)
        self.assertEqual(h.count(server.url(), "connection-reset"), 0)

    @inlineCallbacks
    def test_a_kept_connection_dropped_as_the_request_arrives(self) -> Any:
        server = self.endpoint(Style.DROPS_SECOND)
        h = RealHarness(self)
        url = server.url()
        for _ in range(2):
            decision = yield h.call(url)
            self.assertEqual(decision.patch[0]["value"], {"team": "payments"})
        # The second went out on the kept connection, which dropped it, then
        # on a new one.
        self.assertEqual((server.requests, server.connections), (3, 2))
        self.assertEqual((h.count(url, "ok"), h.count(url, "connection-reset")), (2, 0))

    @inlineCallbacks
    def test_a_new_connection_dropped_is_not_sent_again(self) -> Any:
        server = self.endpoint(Style.DROPS_ALL)
        h = RealHarness(self)
        url = server.url()
        try:
            yield h.call(url)
        except Exception as e:
            self.assertEqual(getattr(e, "reason", None), "connection-reset", e)
        else:
            self.fail("the call succeeded")
        self.assertEqual((server.requests, server.connections), (1, 1))
        self.assertEqual(h.count(url, "connection-reset"), 1)


class RunningAmpTests(TestCase):
    """
    A running amp with a chain of two steps on one C{http.server} origin.
    """

    timeout = 60

    @inlineCallbacks
    def test_chain_of_two_steps_on_one_origin(self) -> Any:
        for style in (Style.HTTP10, Style.CLOSE, Style.KEEP_ALIVE):
            server = StdlibEndpoint(style).start()
            self.addCleanup(server.stop_later)
            chain = f"{server.url('/label/team/payments')} {server.url('/label/tier/web')}"
            amp = yield start_amp(make_config({"payments": namespace(chain, failure_policy="Fail")}), reactor)
            self.addCleanup(amp.stop)
            client = WebhookClient(reactor)
            self.addCleanup(client.close)
            for i in range(5):
                the_pod = pod()
                response, content = yield client.post(
                    amp.url("/mutate", "timeout=10s"), review_bytes(the_pod, namespace="payments")
                )
                answer = decode_answer(content)["response"]
                self.assertTrue(answer["allowed"], (style, i, answer))
                labels = apply_patch(the_pod, answer["_patch"])["metadata"]["labels"]
                self.assertEqual((labels["team"], labels["tier"]), ("payments", "web"), (style, i))
            self.assertEqual(server.requests, 10, style)


class ExplainTwiceTests(TestCase):
    """
    C{amp explain --twice} against an C{http.server} endpoint, as the
    newcomer ran it.
    """

    timeout = 30

    @inlineCallbacks
    def test_idempotent_endpoint_is_idempotent(self) -> Any:
        for style in (Style.HTTP10, Style.HTTP10_UNTIL_CLOSE, Style.CLOSE, Style.KEEP_ALIVE):
            server = StdlibEndpoint(style).start()
            self.addCleanup(server.stop_later)
            directory = self.mktemp()
            os.makedirs(directory)
            pod_path = os.path.join(directory, "pod.yaml")
            config_path = os.path.join(directory, "cfg.yaml")
            with open(pod_path, "w") as f:
                yaml.safe_dump(pod("web"), f)
            with open(config_path, "w") as f:
                yaml.safe_dump(
                    {"kubernetes": {"source": "static"}, "endpoints": {"allow": ["http://127.0.0.1:*/*"]}}, f
                )
            out, err = io.StringIO(), io.StringIO()
            status = yield run(
                [
                    pod_path,
                    "-n",
                    "payments",
                    "--config",
                    config_path,
                    "--set-label",
                    f"{ENABLED_LABEL}=true",
                    "--set-annotation",
                    f"{EP_ANNOTATION}={server.url()}",
                    "--twice",
                ],
                reactor,
                stdout=out,
                stderr=err,
            )
            last = out.getvalue().rstrip("\n").splitlines()[-1]
            self.assertEqual(
                last,
                "result: patched; idempotent -> exit 0: admitted as the endpoint intended",
                out.getvalue() + err.getvalue(),
            )
            self.assertEqual(status, EXIT_ADMITTED)
            self.assertEqual(server.requests, 2)
