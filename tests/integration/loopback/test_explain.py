"""
C{amp explain} live: one Pod (or a workload's Pod template) through amp's
own review pipeline against endpoints on 127.0.0.1 (the example endpoints,
L{tests.support.helpers.start_example}, or a small twisted.web endpoint),
the namespace read from a cluster (the fake API server on loopback,
L{tests.support.fake_apiserver}), and the installed C{amp} console script.
With recorded replies and in-memory connectors, on a L{Clock}, the rest of
C{amp explain} is tested in tests/unit/cli/test_explain.py, whose helpers
these tests share.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from typing import Any

import yaml
from twisted.internet import reactor, utils
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from amp.cli.explain import EXIT_ADMITTED, EXIT_DENIED, EXIT_FAILURE_POLICY, EXIT_NOT_IDEMPOTENT, EXIT_USAGE, run
from tests.support.fake_apiserver import FakeKube
from tests.support.helpers import ENABLED_LABEL, EP_ANNOTATION, pod, start_example
from tests.unit.cli.test_explain import DEPLOYMENT, ENV_OP, STATUS, Files, Ran, config_text, ns


@inlineCallbacks
def run_live(argv: list[str]) -> Any:
    out, err = io.StringIO(), io.StringIO()
    status = yield run(argv, reactor, stdout=out, stderr=err)
    return Ran(status, out.getvalue(), err.getvalue())


class _Appending(Resource):
    """
    An endpoint that appends an env var on every call: not idempotent.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def render_POST(self, request: Any) -> bytes:
        self.calls += 1
        request.setHeader(b"content-type", b"application/json")
        return json.dumps([ENV_OP]).encode()


# ---------------------------------------------------------------- live endpoints


class LiveTests(TestCase):
    """
    Against the example endpoints on a loopback port, with the real reactor.
    """

    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.files = Files(self)
        self.example = yield start_example(reactor)
        self.addCleanup(self.example.stop)
        url = self.example.url
        self.config = self.files.write(
            "amp.yaml",
            config_text(
                {
                    "team-a": ns(url("/user-env")),
                    "mesh": ns(url("/sidecar")),
                    "broken": ns(url("/bad-patch")),
                    "strict": ns(url("/bad-patch"), **{"amp.txn2.com/failure-policy": "Fail"}),
                    "denying": ns(url("/deny")),
                    "down": ns(url("/error")),
                    "off": {"labels": {}, "annotations": {EP_ANNOTATION: url("/user-env")}},
                    "chain": ns(f"{url('/error')} {url('/user-env')}"),
                }
            ),
        )
        self.pod = self.files.write(
            "pod.yaml", yaml.safe_dump(pod("web", annotations={"hub.jupyter.org/username": "alice"}))
        )

    @inlineCallbacks
    def test_deployment_is_patched_live(self) -> Any:
        """
        A Deployment's template is reviewed as the Pod its ReplicaSet would
        create, the example endpoint is called, and the trace and the diff
        show what amp would do: exit 0.
        """
        deployment = self.files.write("deploy.yaml", DEPLOYMENT)
        ran = yield run_live(["--config", self.config, deployment])
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.out + ran.err)
        self.assertEqual(ran.err, "")
        out = ran.out
        self.assertIn("Pod notebook-", out.splitlines()[0])
        self.assertIn("(from Deployment notebook) in namespace team-a", out.splitlines()[0])
        self.assertIn(f"POST {self.example.url('/user-env')}: ok in ", out)
        self.assertIn("answer     patched", out)
        self.assertIn("+--- Pod (as sent)"[1:], out)
        self.assertIn("+    - name: AMP_USER\n+      value: alice\n", out)
        self.assertIn("result: patched -> exit 0", out)

    @inlineCallbacks
    def test_json_fields(self) -> Any:
        """
        -o json: one object with the result, reason, message, the patch amp
        would send, warnings, the resulting Pod and the trace.
        """
        ran = yield run_live(["--config", self.config, "-n", "team-a", "-o", "json", self.pod])
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.err)
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"], doc["message"]), ("patched", "", ""))
        self.assertEqual(doc["warnings"], [])
        self.assertEqual(doc["exit_status"], 0)
        self.assertEqual(doc["endpoint"], self.example.url(""))
        self.assertNotIn("idempotent", doc)
        env = doc["pod"]["spec"]["containers"][0]["env"]
        self.assertIn({"name": "AMP_USER", "value": "alice"}, env)
        self.assertTrue(all(op["op"] in ("add", "replace") for op in doc["patch"]))
        steps = [e["step"] for e in doc["trace"]]
        self.assertEqual(steps[0], "namespace")
        self.assertIn("call", steps)
        self.assertEqual(steps[-1], "answer")
        call = next(e for e in doc["trace"] if e["step"] == "call")
        self.assertEqual(call["outcome"], "ok")
        # The review's own W3C trace (its traceparent sent to the endpoint).
        self.assertRegex(doc["trace_id"], "^[0-9a-f]{32}$")
        self.assertNotEqual(doc["trace_id"], "0" * 32)

    @inlineCallbacks
    def test_refused_patch_under_ignore_shows_the_exact_message(self) -> Any:
        """
        A patch amp refuses, under Ignore: exit 1, and the trace shows the
        whole message, not just the short reason, plus the status stamp.
        """
        ran = yield run_live(["--config", self.config, "-n", "broken", self.pod])
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY, ran.out)
        self.assertIn(
            "refused    apply-failed: operation 0 (remove /spec/ampExampleDoesNotExist): "
            "/spec/ampExampleDoesNotExist does not exist\n",
            ran.out,
        )
        self.assertIn("answer     ignored (apply-failed)", ran.out)
        self.assertIn(
            "operation 0 (remove /spec/ampExampleDoesNotExist): /spec/ampExampleDoesNotExist does not exist", ran.out
        )
        self.assertIn("stamp      amp.txn2.com/status: skipped apply-failed http://127.0.0.1:", ran.out)
        self.assertIn("+    amp.txn2.com/status: skipped apply-failed http://127.0.0.1:", ran.out)
        self.assertIn("-> exit 1: the failure policy decided", ran.out)

    @inlineCallbacks
    def test_failure_under_fail_policy_exits_1(self) -> Any:
        ran = yield run_live(["--config", self.config, "-n", "strict", "-o", "json", self.pod])
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY)
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("failed", "apply-failed"))
        self.assertIn("failure policy Fail denies the Pod", doc["message"])
        self.assertIsNone(doc["pod"])

    @inlineCallbacks
    def test_endpoint_failure_exits_1(self) -> Any:
        ran = yield run_live(["--config", self.config, "-n", "down", "-o", "json", self.pod])
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY)
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("ignored", "http-5xx"))
        call = next(e for e in doc["trace"] if e["step"] == "call")
        self.assertEqual(call["outcome"], "http-5xx")

    @inlineCallbacks
    def test_chain_with_a_failing_step_under_ignore(self) -> Any:
        """
        An endpoint chain: each call has its own budget, call and reply
        steps; the failing first endpoint is skipped under Ignore and the
        second one's patch is applied.
        """
        ran = yield run_live(["--config", self.config, "-n", "chain", "-o", "json", self.pod])
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("patched", "http-5xx"))
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY)
        trace = doc["trace"]
        route = trace[1]
        self.assertEqual(len(route["steps"]), 2)
        calls = [(e["url"].rsplit("/", 1)[1], e["outcome"]) for e in trace if e["step"] == "call"]
        self.assertEqual(calls, [("error", "http-5xx"), ("user-env", "ok")])
        budgets = [(e["position"], e["chain_length"]) for e in trace if e["step"] == "budget"]
        self.assertEqual(budgets, [(1, 2), (2, 2)])
        [skip] = [e for e in trace if e["step"] == "skip"]
        self.assertEqual((skip["reason"], skip["message"]), ("http-5xx", "HTTP 500"))
        self.assertIn({"name": "AMP_USER", "value": "alice"}, doc["pod"]["spec"]["containers"][0]["env"])
        text = (yield run_live(["--config", self.config, "-n", "chain", self.pod])).out
        self.assertIn("endpoints  ", text)
        self.assertIn("a chain of 2", text)
        self.assertIn("budget     endpoint 2 of 2: ", text)

    @inlineCallbacks
    def test_endpoint_deny_exits_3(self) -> Any:
        ran = yield run_live(["--config", self.config, "-n", "denying", self.pod])
        self.assertEqual(ran.status, EXIT_DENIED, ran.out)
        self.assertIn("answer     denied (endpoint-denied)", ran.out)
        self.assertIn("denied by example policy", ran.out)
        self.assertIn("The Pod is not admitted.", ran.out)

    @inlineCallbacks
    def test_namespace_not_enabled_is_skipped_with_exit_0(self) -> Any:
        ran = yield run_live(["--config", self.config, "-n", "off", "-o", "json", self.pod])
        self.assertEqual(ran.status, EXIT_ADMITTED)
        doc = ran.json
        self.assertEqual(doc["result"], "skipped")
        self.assertEqual(doc["patch"], [])
        self.assertNotIn("call", [e["step"] for e in doc["trace"]])

    @inlineCallbacks
    def test_twice_idempotent_live(self) -> Any:
        """
        The sidecar example checks what is there already: a second review of
        the admitted Pod changes nothing.
        """
        ran = yield run_live(["--config", self.config, "-n", "mesh", "--twice", "-o", "json", self.pod])
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.out)
        doc = ran.json
        self.assertIs(doc["idempotent"], True)
        self.assertEqual(doc["result"], "patched")
        self.assertEqual(doc["second"]["result"], "allowed")
        # The second review changes nothing, not even the stamp: it still
        # says the endpoint mutated the Pod (in the first review), and the
        # second answer has no patch.
        first, second = doc["pod"], doc["second"]["pod"]
        self.assertTrue(first["metadata"]["annotations"][STATUS].startswith("mutated "))
        self.assertEqual(second, first)
        self.assertFalse(doc["second"]["patch"])

    @inlineCallbacks
    def test_twice_appending_endpoint_is_not_idempotent(self) -> Any:
        """
        An endpoint that appends on every call: the second review adds the
        env var again; exit 4 and the diff of the second round shows it.
        """
        appending = _Appending()
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(appending))
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/append"
        config = self.files.write("append.yaml", config_text({"team-b": ns(url)}))
        ran = yield run_live(["--config", config, "-n", "team-b", "--twice", self.pod])
        self.assertEqual(ran.status, EXIT_NOT_IDEMPOTENT, ran.out)
        self.assertEqual(appending.calls, 2)
        second = ran.out.split("Second review")[1]
        self.assertIn("+      value: a\n", second)
        self.assertIn("NOT idempotent -> exit 4", ran.out)


# ---------------------------------------------------------------- the namespace from a cluster


def write_kubeconfig(path: str, url: str) -> None:
    with open(path, "w") as f:
        f.write(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": url}}],
                    "users": [{"name": "amp", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "amp"}}],
                }
            )
        )


class ClusterTests(TestCase):
    """
    The namespace from a (fake) API server through a kubeconfig: one GET, no
    watch, amp's own Kubernetes source.
    """

    timeout = 30

    def setUp(self) -> None:
        self.fake = FakeKube().start()
        self.addCleanup(self.fake.stop)
        self.files = Files(self)
        self.kubeconfig = os.path.join(self.files.dir, "kubeconfig")
        write_kubeconfig(self.kubeconfig, self.fake.url)
        self.pod = self.files.write("pod.yaml", yaml.safe_dump(pod("web")))
        self.reply = self.files.write("reply.json", [ENV_OP])

    def config(self, **extra: Any) -> str:
        raw = {
            "kubernetes": {"source": "kubeconfig", "kubeconfig": self.kubeconfig, **extra},
            "endpoints": {"allow": ["http://*.svc:*/*"]},
        }
        return self.files.write("amp.yaml", yaml.safe_dump(raw))

    @inlineCallbacks
    def test_namespace_is_read_with_one_get(self) -> Any:
        self.fake.add_namespace(
            "team-a",
            labels={ENABLED_LABEL: "true"},
            annotations={
                EP_ANNOTATION: "http://injector.tools.svc:8080/mutate",
                "amp.txn2.com/failure-policy": "Ignore",
            },
        )
        ran = yield run_live(
            ["--config", self.config(), "-n", "team-a", "--reply", self.reply, "--twice", "-o", "json", self.pod]
        )
        self.assertEqual(ran.status, EXIT_NOT_IDEMPOTENT, ran.out + ran.err)
        doc = ran.json
        self.assertEqual(doc["result"], "patched")
        namespace = doc["trace"][0]
        self.assertEqual(namespace["step"], "namespace")
        self.assertIn(f"kubeconfig {self.kubeconfig}", namespace["source"])
        self.assertEqual(namespace["annotations"][EP_ANNOTATION], "http://injector.tools.svc:8080/mutate")
        self.assertEqual(self.fake.count("/api/v1/namespaces/team-a"), 1)
        self.assertEqual(self.fake.count("/api/v1/namespaces", watch=True), 0)

    @inlineCallbacks
    def test_missing_namespace_is_skipped(self) -> Any:
        ran = yield run_live(["--config", self.config(), "-n", "nowhere", "--reply", self.reply, self.pod])
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.err)
        self.assertIn("namespace  nowhere: not found in the cluster", ran.out)
        self.assertIn("answer     skipped", ran.out)

    @inlineCallbacks
    def test_auto_failure_policy_follows_the_webhook_configuration(self) -> Any:
        self.fake.add_namespace(
            "team-a",
            labels={ENABLED_LABEL: "true"},
            annotations={EP_ANNOTATION: "http://injector.tools.svc:8080/mutate"},
        )
        self.fake.put_webhook_configuration("amp", [{"name": "mutate.amp.txn2.com", "failurePolicy": "Ignore"}])
        garbage = self.files.write("garbage.json", "{not json")
        ran = yield run_live(
            [
                "--config",
                self.config(webhook_configuration="amp"),
                "-n",
                "team-a",
                "--reply",
                garbage,
                "-o",
                "json",
                self.pod,
            ]
        )
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("ignored", "invalid-json"))
        self.assertEqual(doc["cluster_failure_policy_source"], "MutatingWebhookConfiguration amp")

    @inlineCallbacks
    def test_unusable_kubeconfig_is_bad_usage(self) -> Any:
        config = self.files.write(
            "amp.yaml",
            yaml.safe_dump(
                {"kubernetes": {"source": "kubeconfig", "kubeconfig": os.path.join(self.files.dir, "missing")}}
            ),
        )
        ran = yield run_live(["--config", config, "-n", "team-a", "--reply", self.reply, self.pod])
        self.assertEqual(ran.status, EXIT_USAGE)
        self.assertEqual(ran.err.count("\n"), 1)
        self.assertIn("cannot load the Kubernetes client configuration", ran.err)


# ---------------------------------------------------------------- the installed console script


class ConsoleScriptTests(TestCase):
    timeout = 60

    @inlineCallbacks
    def test_installed_amp_script_live(self) -> Any:
        """
        The C{amp} script that C{pip install} puts beside the interpreter
        runs C{amp explain} against a live loopback endpoint.
        """
        script = shutil.which("amp", path=os.path.dirname(sys.executable))
        self.assertIsNotNone(script, "the amp console script is not installed beside the interpreter")
        example = yield start_example(reactor)
        self.addCleanup(example.stop)
        files = Files(self)
        config = files.write("amp.yaml", config_text({"team-a": ns(example.url("/user-env"))}))
        deployment = files.write("deploy.yaml", DEPLOYMENT)
        out, err, code = yield utils.getProcessOutputAndValue(
            script, ["explain", "--config", config, "-o", "json", deployment], env=dict(os.environ), reactor=reactor
        )
        self.assertEqual(code, 0, err)
        doc = json.loads(out)
        self.assertEqual(doc["result"], "patched")
        self.assertTrue(doc["pod"]["metadata"]["generateName"].startswith("notebook-"))
        out, err, code = yield utils.getProcessOutputAndValue(
            script,
            ["explain", "--config", config, os.path.join(files.dir, "missing.yaml")],
            env=dict(os.environ),
            reactor=reactor,
        )
        self.assertEqual((code, out), (2, b""))
        self.assertEqual(err.count(b"\n"), 1, err)
