"""
C{amp explain}: one Pod (or a workload's Pod template) through amp's own
review pipeline with a recorded reply or an in-memory endpoint, and what the
command prints and exits with.

Every test calls L{amp.cli.explain.run} in-process.  With C{--reply} (or an
in-memory connector) nothing touches the network and a L{Clock} is the whole
reactor: the review completes synchronously.  Live endpoints on 127.0.0.1,
the namespace from a cluster and the installed C{amp} console script are in
tests/integration/loopback/test_explain.py.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from amp.cli import dispatch
from amp.cli.explain import (
    EXIT_ADMITTED,
    EXIT_DENIED,
    EXIT_FAILURE_POLICY,
    EXIT_NOT_IDEMPOTENT,
    EXIT_USAGE,
    run,
)
from amp.cli.recorded_reply import recorded_reply
from amp.cli.workloads import InputError, load_documents, pod_for, select_object
from amp.trace import Step
from tests.support.endpoint_harness import ResourceConnector
from tests.support.helpers import ENABLED_LABEL, EP_ANNOTATION, pod

STATUS = "amp.txn2.com/status"
ENV_OP = {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "TEAM", "value": "a"}}

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: notebook
  namespace: team-a
spec:
  replicas: 3
  selector: {matchLabels: {app: notebook}}
  template:
    metadata:
      labels: {app: notebook}
      annotations: {hub.jupyter.org/username: alice}
    spec:
      containers:
      - name: notebook
        image: jupyter/base-notebook:2024-01-01
"""


def config_text(namespaces: dict[str, Any], **extra: Any) -> str:
    """
    amp's config with static C{namespaces} and loopback endpoints allowed.
    """
    raw = {
        "kubernetes": {"source": "static", "namespaces": namespaces},
        "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
        "failure_policy": "Ignore",
        **extra,
    }
    return yaml.safe_dump(raw)


def ns(url: str, **annotations: str) -> dict[str, Any]:
    return {"labels": {ENABLED_LABEL: "true"}, "annotations": {EP_ANNOTATION: url, **annotations}}


class Files:
    """
    A temporary directory for inputs, configs and replies.
    """

    def __init__(self, case: SynchronousTestCase) -> None:
        self.dir = tempfile.mkdtemp(prefix="amp-explain-")
        case.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, name: str, content: Any) -> str:
        path = os.path.join(self.dir, name)
        if not isinstance(content, (str, bytes)):
            content = json.dumps(content)
        with open(path, "wb") as f:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
        return path


class Ran:
    def __init__(self, status: int, out: str, err: str) -> None:
        self.status = status
        self.out = out
        self.err = err

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.out)


def run_sync(case: SynchronousTestCase, argv: list[str], stdin: str | bytes = "", connector: Any = None) -> Ran:
    """
    Run C{amp explain ARGV} on a L{Clock}: everything must complete
    without a real reactor.
    """
    out, err = io.StringIO(), io.StringIO()
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    d = run(argv, Clock(), stdin=io.BytesIO(data), stdout=out, stderr=err, connector=connector)
    return Ran(case.successResultOf(d), out.getvalue(), err.getvalue())


class _AddOnce(Resource):
    """
    An endpoint that adds the env var only when the Pod does not have it.
    """

    isLeaf = True

    def render_POST(self, request: Any) -> bytes:
        sent = json.loads(request.content.read())
        env = sent["spec"]["containers"][0].get("env") or []
        request.setHeader(b"content-type", b"application/json")
        if any(e.get("name") == "TEAM" for e in env):
            return b"[]"
        return json.dumps([ENV_OP]).encode()


class _SecondAnswer(Resource):
    """
    Patches on the first call; answers the second with C{status} and C{body}.
    """

    isLeaf = True

    def __init__(self, status: int, body: Any) -> None:
        super().__init__()
        self.second = (status, json.dumps(body).encode())
        self.calls = 0

    def render_POST(self, request: Any) -> bytes:
        self.calls += 1
        request.setHeader(b"content-type", b"application/json")
        if self.calls == 1:
            return json.dumps([ENV_OP]).encode()
        request.setResponseCode(self.second[0])
        return self.second[1]


# ---------------------------------------------------------------- recorded replies, no network


class ReplyTests(SynchronousTestCase):
    """
    --reply: the recorded reply goes through the endpoint client's reading and
    parsing; a Clock is the whole reactor.
    """

    def setUp(self) -> None:
        self.files = Files(self)
        self.config = self.files.write(
            "amp.yaml",
            config_text(
                {
                    "team-a": ns("http://injector.example:8080/mutate"),
                },
                endpoints={"allow": ["http://*.example:*/*"], "max_response": "1KiB"},
            ),
        )
        self.pod = self.files.write("pod.json", pod("web"))

    def explain(self, reply: Any, *extra: str) -> Ran:
        path = self.files.write("reply.json", reply)
        return run_sync(self, ["--config", self.config, "-n", "team-a", "--reply", path, *extra, self.pod])

    def test_recorded_patch(self) -> None:
        ran = self.explain([ENV_OP], "-o", "json")
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.err)
        doc = ran.json
        self.assertEqual(doc["result"], "patched")
        # amp's repair: the env list is created before the append; then
        # amp's status stamp.
        self.assertEqual(
            doc["patch"],
            [
                {"op": "add", "path": "/spec/containers/0/env", "value": []},
                ENV_OP,
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {STATUS: "mutated http://injector.example:8080"},
                },
            ],
        )
        self.assertEqual(doc["pod"]["spec"]["containers"][0]["env"], [{"name": "TEAM", "value": "a"}])
        self.assertTrue(doc["recorded_reply"].endswith("reply.json"))
        trace = doc["trace"]
        self.assertEqual(
            [e["step"] for e in trace],
            [
                "namespace",
                "route",
                "allow",
                "policy",
                "budget",
                "call",
                "reply",
                "repair",
                "operation",
                "operation",
                "stamp",
                "answer",
            ],
        )
        route, allow, policy, budget, call, reply, repair, inserted, own, stamp, answer = trace[1:]
        self.assertEqual((stamp["key"], stamp["value"]), (STATUS, "mutated http://injector.example:8080"))
        self.assertEqual(
            (route["enabled"], route["annotation"], route["url"]),
            (True, EP_ANNOTATION, "http://injector.example:8080/mutate"),
        )
        self.assertEqual((allow["allowed"], allow["pattern"]), (True, "http://*.example:*/*"))
        self.assertEqual(policy["policy"], "Ignore")
        self.assertIn("the config's failure_policy Ignore", policy["why"])
        self.assertEqual((budget["seconds"], budget["timeout"]), (9.5, 5.0))
        self.assertEqual((call["url"], call["outcome"]), ("http://injector.example:8080/mutate", "ok"))
        self.assertEqual((reply["allowed"], reply["operations"]), (True, 1))
        self.assertEqual(
            repair["message"],
            "operation 0 (add /spec/containers/0/env/-): /spec/containers/0/env "
            "does not exist; amp inserted add /spec/containers/0/env",
        )
        self.assertEqual(
            (inserted["path"], inserted["repair"], inserted["index"]), ("/spec/containers/0/env", True, None)
        )
        self.assertEqual((own["path"], own["repair"], own["index"]), (ENV_OP["path"], False, 0))
        self.assertEqual((answer["result"], answer["reason"]), ("patched", ""))
        text = self.explain([ENV_OP]).out
        self.assertIn("answered with the recorded reply", text)
        self.assertIn(
            "past 64 calls at once to the endpoint (endpoints.max_concurrent), a review waits for a slot"
            " until 0.25s before its deadline (queue-timeout)",
            text,
        )
        self.assertNotIn("latency budget", text)

    def test_the_endpoints_latency_budget_is_shown(self) -> None:
        config = self.files.write(
            "budget.yaml",
            config_text(
                {
                    "team-a": ns("http://injector.example:8080/mutate"),
                },
                endpoints={"allow": ["http://*.example:*/*"], "latency_budget": "250ms"},
            ),
        )
        path = self.files.write("reply.json", [ENV_OP])
        ran = run_sync(self, ["--config", config, "-n", "team-a", "--reply", path, "-o", "json", self.pod])
        [budget] = [e for e in ran.json["trace"] if e["step"] == "budget"]
        self.assertEqual((budget["latency_budget"], budget["max_concurrent"]), (0.25, 64))
        text = run_sync(self, ["--config", config, "-n", "team-a", "--reply", path, self.pod]).out
        self.assertIn(
            "latency budget 0.25s: while the p90 of the endpoint's recent calls is over it, reviews are "
            "shed (latency-budget), but for one probe at a time",
            text,
        )
        self.assertIn(
            "operation  + add /spec/containers/0/env  (inserted by amp: repair)\n"
            "operation  0 add /spec/containers/0/env/-\n",
            text,
        )

    def test_recorded_object_reply_with_warnings_and_deny(self) -> None:
        ran = self.explain(
            {"allowed": False, "status": {"code": 403, "message": "no GPUs for team-a"}, "warnings": ["quota"]},
            "-o",
            "json",
        )
        self.assertEqual(ran.status, EXIT_DENIED)
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("denied", "endpoint-denied"))
        self.assertIn("no GPUs for team-a", doc["message"])
        self.assertEqual(doc["warnings"], ["amp: quota"])

    def test_recorded_reply_is_checked_like_a_live_one(self) -> None:
        """
        The recorded reply passes the same size limit, parsing and patch
        checks: too large, not JSON, and a refused path each end in the
        failure policy with amp's own reason.
        """
        too_large = self.explain([ENV_OP] * 40, "-o", "json")
        self.assertEqual((too_large.status, too_large.json["reason"]), (EXIT_FAILURE_POLICY, "response-too-large"))
        garbage = self.explain("{not json", "-o", "json")
        self.assertEqual((garbage.status, garbage.json["reason"]), (EXIT_FAILURE_POLICY, "invalid-json"))
        refused = self.explain([{"op": "replace", "path": "/metadata/name", "value": "x"}], "-o", "json")
        self.assertEqual(refused.json["reason"], "refused-path")
        self.assertIn("operation 0 (replace /metadata/name): path is refused by amp", refused.json["message"])

    def test_twice_with_recorded_appending_reply_is_not_idempotent(self) -> None:
        ran = self.explain([ENV_OP], "--twice", "-o", "json")
        self.assertEqual(ran.status, EXIT_NOT_IDEMPOTENT)
        doc = ran.json
        self.assertIs(doc["idempotent"], False)
        self.assertEqual(len(doc["second"]["pod"]["spec"]["containers"][0]["env"]), 2)

    def test_twice_with_an_endpoint_that_checks_first_is_idempotent(self) -> None:
        connector = ResourceConnector(_AddOnce())
        ran = run_sync(
            self, ["--config", self.config, "-n", "team-a", "--twice", "-o", "json", self.pod], connector=connector
        )
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.out)
        doc = ran.json
        self.assertIs(doc["idempotent"], True)
        self.assertEqual((doc["result"], doc["second"]["result"]), ("patched", "allowed"))

    def test_twice_tells_the_second_review_keeps_the_first_reviews_stamp(self) -> None:
        """As after the API server reinvokes amp: the stamp still says mutated, and is not written again."""
        connector = ResourceConnector(_AddOnce())
        ran = run_sync(self, ["--config", self.config, "-n", "team-a", "--twice", self.pod], connector=connector)
        first, second = ran.out.split("Second review")
        stamp = next(line for line in first.splitlines() if line.startswith("stamp "))
        self.assertIn("amp.txn2.com/status: mutated ", stamp)
        self.assertIn(f"{stamp} (the Pod has it already: not written again)\n", second)
        self.assertIn("The Pod is admitted unchanged.", second)

    def test_twice_with_a_failed_second_review_says_so(self) -> None:
        # Not a verdict on idempotency: the failure, with its reason and status.
        argv = ["--config", self.config, "-n", "team-a", "--twice", self.pod]
        ran = run_sync(self, argv, connector=ResourceConnector(_SecondAnswer(503, "overloaded")))
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY, ran.out)
        self.assertNotIn("idempotent ->", ran.out)
        self.assertTrue(
            ran.out.endswith(
                "result: patched; the second review failed (http-5xx), so idempotency is not known"
                " -> exit 1: the failure policy decided in the second review\n"
            ),
            ran.out,
        )
        doc = run_sync(self, [*argv, "-o", "json"], connector=ResourceConnector(_SecondAnswer(503, "x"))).json
        self.assertIsNone(doc["idempotent"])
        self.assertEqual(
            (doc["exit_status"], doc["second"]["result"], doc["second"]["reason"]),
            (EXIT_FAILURE_POLICY, "ignored", "http-5xx"),
        )

    def test_twice_with_a_denied_second_review_says_so(self) -> None:
        deny = {"allowed": False, "status": {"code": 403, "message": "once is enough"}}
        ran = run_sync(
            self,
            ["--config", self.config, "-n", "team-a", "--twice", self.pod],
            connector=ResourceConnector(_SecondAnswer(200, deny)),
        )
        self.assertEqual(ran.status, EXIT_DENIED, ran.out)
        self.assertIn(
            "result: patched; the second review was denied by the endpoint, so idempotency is not known"
            " -> exit 3: the endpoint denied the Pod in the second review\n",
            ran.out,
        )

    def test_twice_after_a_deny_is_not_checked(self) -> None:
        ran = self.explain({"allowed": False}, "--twice", "-o", "json")
        self.assertEqual(ran.status, EXIT_DENIED)
        self.assertIsNone(ran.json["idempotent"])
        self.assertNotIn("second", ran.json)

    def test_namespace_from_the_command_line_only(self) -> None:
        """
        No config: --set-label and --set-annotation describe the namespace
        and no cluster is needed; amp's default allow-list applies.
        """
        reply = self.files.write("r.json", [ENV_OP])
        argv = [
            "-n",
            "team-z",
            "--reply",
            reply,
            "--set-label",
            f"{ENABLED_LABEL}=true",
            "--set-annotation",
            f"{EP_ANNOTATION}=http://injector.tools.svc:8080/mutate",
            self.pod,
        ]
        ran = run_sync(self, argv)
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.out + ran.err)
        self.assertIn("namespace  team-z (from the command line)", ran.out)
        outside = run_sync(self, argv[:-2] + [f"{EP_ANNOTATION}=http://10.0.0.1:8080/mutate", self.pod])
        self.assertEqual(outside.status, EXIT_FAILURE_POLICY)
        self.assertIn("not-allowed", outside.out)

    def test_set_annotation_overrides_the_config(self) -> None:
        path = self.files.write("reply.json", [ENV_OP])
        ran = run_sync(
            self,
            [
                "--config",
                self.config,
                "-n",
                "team-a",
                "--reply",
                path,
                "-o",
                "json",
                "--set-annotation",
                "amp.txn2.com/failure-policy=Fail",
                "--set-annotation",
                f"{EP_ANNOTATION}=http://elsewhere.test:80/",
                self.pod,
            ],
        )
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"]), ("failed", "not-allowed"))
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY)
        self.assertEqual(doc["trace"][0]["annotations"][EP_ANNOTATION], "http://elsewhere.test:80/")

    def test_failure_policy_typo_is_named(self) -> None:
        """
        A typo in the failure-policy annotation falls back to the config's
        policy, and the trace says so.
        """
        ran = run_sync(
            self,
            [
                "--config",
                self.config,
                "-n",
                "team-a",
                "--reply",
                self.files.write("r.json", "{"),
                "--set-annotation",
                "amp.txn2.com/failure-policy=fail",
                self.pod,
            ],
        )
        self.assertEqual(ran.status, EXIT_FAILURE_POLICY)
        self.assertIn(
            "policy     Ignore: no label amp.txn2.com/failure-class, so the annotation "
            "amp.txn2.com/failure-policy='fail' is not Ignore or Fail, so the config's failure_policy Ignore "
            "(problem failure-policy: ",
            ran.out,
        )
        self.assertIn(
            "fix: kubectl label namespace team-a amp.txn2.com/failure-class=Fail (or =Ignore) "
            "&& kubectl annotate namespace team-a amp.txn2.com/failure-policy-)\n",
            ran.out,
        )

    def test_not_enabled_says_why(self) -> None:
        ran = run_sync(
            self,
            [
                "-n",
                "team-q",
                "--set-label",
                f"{ENABLED_LABEL}=yes",
                "--set-annotation",
                f"{EP_ANNOTATION}=http://user:secret@injector.tools.svc:8080/",
                "-o",
                "json",
                self.pod,
            ],
        )
        self.assertEqual(ran.status, EXIT_ADMITTED)
        doc = ran.json
        self.assertEqual(doc["result"], "skipped")
        route = doc["trace"][1]
        self.assertEqual((route["step"], route["enabled"], route["got"]), ("route", False, "yes"))
        self.assertNotIn("secret", json.dumps(doc["trace"][1:]))

    def test_typos_in_amps_keys_are_named_with_the_key_meant(self) -> None:
        """
        The issue's typos: label amp.txn2.com/enable and annotation
        amp.txn2.com/endpoint on the namespace, a misspelt stamp on the Pod;
        and without -n, that the namespace default was assumed.
        """
        typo_pod = self.files.write("typo.json", pod("web", annotations={"amp.txn2.com/stauts": "x"}))
        ran = run_sync(
            self,
            [
                "--set-label",
                "amp.txn2.com/enable=true",
                "--set-annotation",
                "amp.txn2.com/endpoint=http://injector.tools.svc:8080/",
                typo_pod,
            ],
        )
        self.assertIn("note: no --namespace and Pod web names none: explained in namespace default\n", ran.out)
        self.assertIn(
            "note: Pod: annotation amp.txn2.com/stauts is not read by amp (did you mean amp.txn2.com/status?)\n",
            ran.out,
        )
        self.assertIn(
            "           annotation amp.txn2.com/endpoint is not read by amp (did you mean amp.txn2.com/ep?)\n"
            "           label amp.txn2.com/enable is not read by amp (did you mean amp.txn2.com/enabled?)\n",
            ran.out,
        )
        doc = run_sync(self, ["-o", "json", "-n", "team-a", "--set-label", "amp.txn2.com/enable=true", self.pod]).json
        self.assertNotIn("notes", doc, "the namespace was given and the Pod has no unknown key")
        self.assertEqual(
            doc["trace"][0]["near_misses"],
            ["label amp.txn2.com/enable is not read by amp (did you mean amp.txn2.com/enabled?)"],
        )

    def test_hints_of_a_static_namespace_in_the_config(self) -> None:
        config = self.files.write(
            "typo.yaml",
            config_text(
                {
                    "team-t": {
                        "labels": {ENABLED_LABEL: "true"},
                        "annotations": {"amp.txn2.com/endpiont": "http://x.example:8080/"},
                    }
                }
            ),
        )
        ran = run_sync(self, ["--config", config, "-n", "team-t", self.pod])
        self.assertIn("annotation amp.txn2.com/endpiont is not read by amp (did you mean amp.txn2.com/ep?)", ran.out)
        self.assertNotIn("explained in namespace default", ran.out)

    def test_opted_out_pod_is_left_alone(self) -> None:
        opted = self.files.write("opted.json", pod("web", labels={ENABLED_LABEL: "false"}))
        ran = run_sync(
            self,
            [
                "--config",
                self.config,
                "-n",
                "team-a",
                "--reply",
                self.files.write("r.json", [ENV_OP]),
                "-o",
                "json",
                opted,
            ],
        )
        self.assertEqual(ran.status, EXIT_ADMITTED)
        doc = ran.json
        self.assertEqual((doc["result"], doc["reason"], doc["patch"]), ("skipped", "opted-out", []))
        self.assertEqual([e["step"] for e in doc["trace"]], ["answer"])

    def test_stdin(self) -> None:
        path = self.files.write("reply.json", "[]")
        ran = run_sync(
            self,
            ["--config", self.config, "-n", "team-a", "--reply", path, "-"],
            stdin=yaml.safe_dump(pod("from-stdin")),
        )
        self.assertEqual(ran.status, EXIT_ADMITTED, ran.err)
        self.assertIn("Pod from-stdin in namespace team-a", ran.out)
        self.assertIn("Only amp's status stamp changes:", ran.out)
        self.assertIn("+    amp.txn2.com/status: unchanged http://injector.example:8080\n", ran.out)


# ---------------------------------------------------------------- bad usage and input


class UsageTests(SynchronousTestCase):
    """
    Bad usage or input: exit 2 and exactly one line on stderr, nothing on stdout.
    """

    def setUp(self) -> None:
        self.files = Files(self)
        self.pod = self.files.write("pod.yaml", yaml.safe_dump(pod("web")))

    def bad(self, argv: list[str], *expected: str, stdin: str | bytes = "") -> None:
        ran = run_sync(self, argv, stdin=stdin)
        self.assertEqual(ran.status, EXIT_USAGE, ran.out + ran.err)
        self.assertEqual(ran.out, "")
        self.assertEqual(ran.err.count("\n"), 1, ran.err)
        self.assertTrue(ran.err.startswith("amp explain: "), ran.err)
        for text in expected:
            self.assertIn(text, ran.err)

    def test_no_file(self) -> None:
        self.bad([], "FILE")

    def test_unknown_option(self) -> None:
        self.bad(["--frobnicate", self.pod], "--frobnicate")

    def test_bad_output_format(self) -> None:
        self.bad(["-o", "xml", self.pod], "xml")

    def test_missing_file(self) -> None:
        self.bad([os.path.join(self.files.dir, "nope.yaml")], "input ", "nope.yaml: file not found")

    def test_not_yaml(self) -> None:
        self.bad([self.files.write("bad.yaml", "kind: Pod\n  spec: [\n")], "is not valid YAML", "line")

    def test_not_json(self) -> None:
        self.bad([self.files.write("bad.json", '{"kind": "Pod",')], "is not valid JSON")

    def test_no_pod(self) -> None:
        self.bad([self.files.write("svc.yaml", "kind: Service\nmetadata: {name: s}\n")], "no Pod, workload", "Service")

    def test_two_pods(self) -> None:
        two = yaml.safe_dump_all([pod("a"), pod("b")])
        self.bad([self.files.write("two.yaml", two)], "2 objects", "Pod a", "Pod b")

    def test_namespace_mismatch(self) -> None:
        self.bad(["-n", "other", self.files.write("d.yaml", DEPLOYMENT)], "(team-a) does not match --namespace other")

    def test_bad_set_label(self) -> None:
        self.bad(["--set-label", "novalue", self.pod], "--set-label: expected KEY=VALUE")

    def test_bad_config(self) -> None:
        config = self.files.write("amp.yaml", "endpoints: {timeout: soon}\n")
        self.bad(["--config", config, self.pod], "config", "endpoints.timeout")

    def test_workload_without_template(self) -> None:
        self.bad(
            [self.files.write("d.yaml", "kind: Deployment\nmetadata: {name: d}\nspec: {}\n")],
            "spec.template is missing",
        )

    def test_stdin_not_text(self) -> None:
        self.bad(["-"], "stdin, line 2: not UTF-8 text", stdin=b"kind: Pod\nmetadata: {name: \xff}\n")

    def test_help_exits_0(self) -> None:
        ran = run_sync(self, ["--help"])
        self.assertEqual(ran.status, 0)
        self.assertIn("exit status:", ran.out)
        self.assertIn("--set-annotation", ran.out)

    def test_unknown_command(self) -> None:
        out, err = io.StringIO(), io.StringIO()
        status = self.successResultOf(dispatch(["explian"], Clock(), stdout=out, stderr=err))
        self.assertEqual(status, 2)
        self.assertEqual(err.getvalue(), "amp: unknown command 'explian' (try 'amp explain --help')\n")


# ---------------------------------------------------------------- workloads -> Pods (pure)


class WorkloadTests(SynchronousTestCase):
    def one(self, text: str, namespace: Optional[str] = None, now: float = 0.0) -> Any:
        return pod_for(select_object(load_documents(text.encode(), "f"), "f"), namespace, now=now)

    def test_deployment(self) -> None:
        got = self.one(DEPLOYMENT)
        meta = got.pod["metadata"]
        self.assertEqual((got.namespace, got.source), ("team-a", "Deployment notebook"))
        self.assertEqual(meta["namespace"], "team-a")
        h = meta["labels"]["pod-template-hash"]
        self.assertEqual(meta["generateName"], f"notebook-{h}-")
        self.assertNotIn("name", meta)
        self.assertEqual(meta["labels"]["app"], "notebook")
        self.assertEqual(meta["annotations"], {"hub.jupyter.org/username": "alice"})
        owner = meta["ownerReferences"][0]
        self.assertEqual((owner["kind"], owner["name"], owner["controller"]), ("ReplicaSet", f"notebook-{h}", True))
        self.assertEqual(got.pod["spec"]["containers"][0]["name"], "notebook")
        self.assertEqual((got.pod["apiVersion"], got.pod["kind"]), ("v1", "Pod"))
        # The same template gives the same hash; another template another one.
        self.assertEqual(self.one(DEPLOYMENT).pod, got.pod)
        other = self.one(DEPLOYMENT.replace("base-notebook", "scipy-notebook"))
        self.assertNotEqual(other.pod["metadata"]["labels"]["pod-template-hash"], h)

    def test_statefulset(self) -> None:
        got = self.one(
            """
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db-headless
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: pg, image: postgres:16}], volumes: [{name: data, emptyDir: {}}]}
  volumeClaimTemplates:
  - metadata: {name: data}
""",
            "prod",
        )
        meta, spec = got.pod["metadata"], got.pod["spec"]
        self.assertEqual(meta["name"], "db-0")
        self.assertEqual(meta["labels"]["statefulset.kubernetes.io/pod-name"], "db-0")
        self.assertTrue(meta["labels"]["controller-revision-hash"].startswith("db-"))
        self.assertEqual((spec["hostname"], spec["subdomain"]), ("db-0", "db-headless"))
        self.assertEqual(spec["volumes"], [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}])
        self.assertEqual(got.namespace, "prod")

    def test_daemonset_tolerations(self) -> None:
        got = self.one("""
kind: DaemonSet
metadata: {name: agent}
spec:
  template:
    spec:
      containers: [{name: a, image: agent:1}]
      tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute}]
""")
        meta, spec = got.pod["metadata"], got.pod["spec"]
        self.assertEqual(meta["generateName"], "agent-")
        keys = [(t["key"], t["effect"]) for t in spec["tolerations"]]
        self.assertEqual(keys.count(("node.kubernetes.io/not-ready", "NoExecute")), 1)
        self.assertIn(("node.kubernetes.io/unschedulable", "NoSchedule"), keys)
        self.assertEqual(got.namespace, "default")

    def test_job_and_cronjob(self) -> None:
        job = self.one(
            """
kind: Job
metadata: {name: report}
spec: {template: {spec: {containers: [{name: r, image: r:1}], restartPolicy: Never}}}
""",
            "batch",
        )
        labels = job.pod["metadata"]["labels"]
        self.assertEqual((labels["job-name"], labels["batch.kubernetes.io/job-name"]), ("report", "report"))
        self.assertEqual(labels["controller-uid"], labels["batch.kubernetes.io/controller-uid"])
        self.assertEqual(job.pod["metadata"]["generateName"], "report-")
        self.assertIn("batch.kubernetes.io/job-tracking", job.pod["metadata"]["finalizers"])
        cron = self.one(
            """
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate: {spec: {template: {spec: {containers: [{name: n, image: n:1}]}}}}
""",
            now=1_700_000_000.0,
        )
        minutes = 1_700_000_000 // 60
        self.assertEqual(cron.pod["metadata"]["generateName"], f"nightly-{minutes}-")
        self.assertEqual(cron.pod["metadata"]["labels"]["job-name"], f"nightly-{minutes}")
        self.assertEqual(cron.source, "CronJob nightly")

    def test_replicaset(self) -> None:
        got = self.one("""
kind: ReplicaSet
metadata: {name: web-5d4f}
spec: {template: {metadata: {labels: {app: web}}, spec: {containers: [{name: w, image: w:1}]}}}
""")
        self.assertEqual(got.pod["metadata"]["generateName"], "web-5d4f-")
        self.assertEqual(got.pod["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet")

    def test_pod_from_kubectl_get_loses_server_fields(self) -> None:
        got = self.one("""
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: team-a, uid: 1234, resourceVersion: "99",
           creationTimestamp: 2024-01-01T00:00:00Z, annotations: {when: 2024-01-01}}
spec: {containers: [{name: w, image: w:1}]}
status: {phase: Running}
""")
        self.assertEqual(
            got.pod["metadata"], {"name": "web", "namespace": "team-a", "annotations": {"when": "2024-01-01"}}
        )
        self.assertNotIn("status", got.pod)

    def test_list_json_and_other_kinds(self) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [{"kind": "Service", "metadata": {"name": "s"}}, pod("only")],
        }
        got = pod_for(select_object(load_documents(json.dumps(doc).encode(), "f"), "f"), "team-a")
        self.assertEqual(got.pod["metadata"]["name"], "only")
        multi = "kind: ConfigMap\nmetadata: {name: c}\n---\n" + DEPLOYMENT
        self.assertEqual(self.one(multi).source, "Deployment notebook")

    def test_admission_review(self) -> None:
        review = json.loads((Path(__file__).parents[3] / "etc" / "reviews" / "pod-create.json").read_text())
        got = self.one(json.dumps(review))
        self.assertEqual(got.namespace, review["request"]["namespace"])
        self.assertEqual(got.pod["spec"], review["request"]["object"]["spec"])
        self.assertIn("AdmissionReview", got.source)
        with self.assertRaises(InputError) as e:
            self.one(json.dumps(review), "elsewhere")
        self.assertIn("does not match --namespace elsewhere", str(e.exception))

    def test_a_document_without_kind_is_named_so(self) -> None:
        with self.assertRaises(InputError) as e:
            self.one("metadata: {name: web}\nspec: {containers: []}\n")
        self.assertIn("found a mapping without kind", str(e.exception))
        self.assertNotIn("None", str(e.exception))

    def test_errors_name_the_problem(self) -> None:
        with self.assertRaises(InputError) as e:
            self.one("kind: Deployment\nmetadata: {name: d}\nspec: {template: {metadata: {}}}\n")
        self.assertIn("Deployment d: spec.template.spec is missing", str(e.exception))
        with self.assertRaises(InputError) as e:
            load_documents(b"", "empty.yaml")
        self.assertIn("empty.yaml holds no document", str(e.exception))


# ---------------------------------------------------------------- the docs


class DocsTests(SynchronousTestCase):
    def test_documented_command_lines_parse(self) -> None:
        """
        Every C{amp explain} command line in the README and the endpoint
        guide uses options the command has.
        """
        from amp.cli.explain import command_line_parser as _parser

        root = Path(__file__).parents[3]
        found = 0
        for page in (root / "README.md", root / "docs" / "endpoints.md"):
            text = page.read_text().replace("\\\n", " ")
            for line in text.splitlines():
                line = line.strip().removeprefix("$ ")
                if not line.startswith(("amp explain", ".venv/bin/amp explain")):
                    continue
                found += 1
                argv = shlex.split(line.split("#")[0])[2:]
                _parser(io.StringIO()).parse_args(argv)
        self.assertGreaterEqual(found, 3)


# ---------------------------------------------------------------- the trace in the pipeline


class TraceInPipelineTests(SynchronousTestCase):
    """
    The review path tells a trace each decision, and the trace never
    changes the answer.
    """

    def admitter(self, config: Any, connector: Any) -> Any:
        from amp.admission import Admitter
        from amp.breaker import BreakerRegistry
        from amp.endpoint import EndpointClient
        from amp.metrics import Metrics
        from amp.namespaces import StaticNamespaceSource

        clock = Clock()
        metrics = Metrics()
        client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=connector)
        return Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics), clock

    def test_trace_observes_without_changing_the_answer(self) -> None:
        from amp.admission_review import parse_review
        from amp.config import parse_config
        from amp.deadline import Deadline
        from amp.trace import RecordedTrace
        from tests.support.helpers import review_bytes

        for reply, policy in (
            ([ENV_OP], "Ignore"),
            ([{"op": "remove", "path": "/spec/nope"}], "Ignore"),
            ([{"op": "remove", "path": "/spec/nope"}], "Fail"),
            ({"allowed": False}, "Ignore"),
            ("{", "Ignore"),
        ):
            config = parse_config(
                yaml.safe_load(config_text({"team-a": ns("http://127.0.0.1:9/x")}, failure_policy=policy))
            )
            answers = []
            for trace in (None, RecordedTrace()):
                admitter, clock = self.admitter(
                    config, recorded_reply(reply.encode() if isinstance(reply, str) else json.dumps(reply).encode())
                )
                req = parse_review(review_bytes())
                answers.append(
                    self.successResultOf(admitter.review(req, Deadline.after(clock.seconds(), 5.0), trace=trace))
                )
            self.assertEqual(answers[0], answers[1])
            self.assertEqual(trace.steps(Step.ANSWER)[-1]["result"], answers[1].outcome.result)

    def test_failure_policy_why(self) -> None:
        from amp.config import parse_config
        from amp.namespaces import NamespaceInfo
        from amp.policy import failure_policy, failure_policy_why

        key = "amp.txn2.com/failure-policy"
        for notes, configured, cluster, want in (
            ({key: "Ignore"}, "Fail", None, "the namespace's annotation"),
            ({key: "fail"}, "Ignore", None, "'fail' is not Ignore or Fail, so the config's failure_policy Ignore"),
            ({}, "auto", "Ignore", "failurePolicy of amp's MutatingWebhookConfiguration"),
            ({}, "auto", None, "is not known: Fail"),
        ):
            config = parse_config({"failure_policy": configured})
            info = NamespaceInfo("n", {}, notes)
            policy, why = failure_policy_why(info, config, cluster)
            self.assertEqual(policy, failure_policy(info, config, cluster))
            self.assertIn(want, why)
