"""
C{amp audit}: the places the endpoints decide and a running Pod compared
with them, each Pod's state, owners and restart commands, the outputs, and
whole audits of an in-memory cluster (paged lists) with an in-memory
endpoint, on a L{Clock}: states, differences, endpoint calls per template,
pacing, errors per workload, the exit status.
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any, Optional
from urllib.parse import parse_qs

import yaml
from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from amp.cli import dispatch
from amp.cli.audit import run
from amp.cli.audit_cluster import PagedLists
from amp.cli.audit_judge import PodState, Prediction, judge_pod
from amp.cli.audit_output import render_table
from amp.cli.audit_owners import Owners, WorkloadKey, restart_command
from amp.cli.audit_paths import compare, touched_places
from amp.cli.audit_pipeline import Pacer
from amp.config import KubernetesConfig, parse_config
from amp.poddiff import MISSING
from amp.text import terminal
from tests.support.endpoint_harness import ResourceConnector

STATUS = "amp.txn2.com/status"
EP = "http://127.0.0.1:8090/sidecar"
KUBE = KubernetesConfig()


# ---------------------------------------------------------------- an endpoint


class Sidecar(Resource):
    """
    A sidecar injector whose image can change: adds the C{proxy} container,
    a shared volume mounted in the first container, an init container and a
    toleration.  Counts its calls.
    """

    isLeaf = True

    def __init__(self, image: str = "envoy:1.27") -> None:
        super().__init__()
        self.image = image
        self.calls = 0
        self.fail = False

    def render_POST(self, request: Any) -> bytes:
        self.calls += 1
        if self.fail:
            request.setResponseCode(500)
            return b"down"
        pod = json.loads(request.content.read())
        spec = pod["spec"]
        ops: list[dict[str, Any]] = []
        mount = {"name": "shared", "mountPath": "/var/run/proxy"}
        ops.append(
            {
                "op": "add",
                "path": "/spec/volumes" + ("/-" if spec.get("volumes") else ""),
                "value": {"name": "shared", "emptyDir": {}}
                if spec.get("volumes")
                else [{"name": "shared", "emptyDir": {}}],
            }
        )
        first = spec["containers"][0]
        ops.append(
            {
                "op": "add",
                "path": "/spec/containers/0/volumeMounts" + ("/-" if first.get("volumeMounts") else ""),
                "value": mount if first.get("volumeMounts") else [mount],
            }
        )
        ops.append(
            {
                "op": "add",
                "path": "/spec/containers/-",
                "value": {"name": "proxy", "image": self.image, "args": ["--port", "15001"]},
            }
        )
        ops.append(
            {
                "op": "add",
                "path": "/spec/tolerations",
                "value": [{"key": "proxy", "operator": "Exists", "effect": "NoSchedule"}],
            }
        )
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(ops).encode()


# ---------------------------------------------------------------- a cluster


def template(app: str, image: str = "app:1") -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "app", "image": image}]}}


def admitted_pod(
    tmpl: dict[str, Any],
    name: str,
    owner: Optional[tuple[str, str, str]],
    sidecar: Optional[str],
    stamp: Optional[str] = None,
    **extra_labels: str,
) -> dict[str, Any]:
    """
    A Pod as the API server stores it: the template, the API server's
    defaults and service account volume (before amp), the sidecar of image
    C{sidecar} (None: no mutation), a label another admission plugin added
    after amp, and the stamp.
    """
    pod = copy.deepcopy(tmpl)
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = pod["metadata"]
    meta["name"] = name
    meta["uid"] = f"uid-{name}"
    meta["labels"] = {**meta.get("labels", {}), "policy.example/added": "yes", **extra_labels}
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "uid": "x", "controller": True}
        ]
    spec = pod["spec"]
    for c in spec["containers"]:
        c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        c["volumeMounts"] = [{"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io"}]
    spec["volumes"] = [{"name": "kube-api-access-abcde", "projected": {"sources": []}}]
    spec["tolerations"] = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]
    spec["restartPolicy"] = "Always"
    if sidecar is not None:
        spec["volumes"].append({"name": "shared", "emptyDir": {}})
        spec["containers"][0]["volumeMounts"].append({"name": "shared", "mountPath": "/var/run/proxy"})
        spec["containers"].append(
            {"name": "proxy", "image": sidecar, "args": ["--port", "15001"], "imagePullPolicy": "IfNotPresent"}
        )
        spec["tolerations"].append({"key": "proxy", "operator": "Exists", "effect": "NoSchedule"})
        stamp = stamp or f"mutated {EP}"
    if stamp is not None:
        meta["annotations"] = {STATUS: stamp}
    pod["status"] = {"phase": "Pending"}
    return pod


class FakeCluster:
    """
    The lists of an API server, in memory, in pages of the size asked
    (C{limit}, C{continue}); every request is kept (method GET only: the
    getter has no other).
    """

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, dict[str, list[str]]]] = []

    def add(self, resource: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("metadata", {})["namespace"] = namespace
        self.objects.setdefault((resource, namespace), []).append(obj)
        return obj

    def namespace(self, name: str, *, enabled: bool = True, **annotations: str) -> None:
        labels = {"amp.txn2.com/enabled": "true"} if enabled else {}
        self.objects.setdefault(("namespaces", ""), []).append(
            {"metadata": {"name": name, "labels": labels, "annotations": {"amp.txn2.com/ep": EP, **annotations}}}
        )

    def get(self, path: str, query: list[tuple[str, str]]) -> bytes:
        q = parse_qs("&".join(f"{k}={v}" for k, v in query))
        self.requests.append((path, q))
        parts = path.strip("/").split("/")
        if path == "/api/v1/namespaces":
            items = self.objects.get(("namespaces", ""), [])
            selector = q.get("labelSelector", [""])[0]
            if selector:
                k, _, v = selector.partition("=")
                items = [i for i in items if i["metadata"]["labels"].get(k) == v]
        else:
            ns, resource = parts[parts.index("namespaces") + 1], parts[-1]
            items = self.objects.get((resource, ns), [])
        limit = int(q["limit"][0])
        start = int(q.get("continue", ["0"])[0])
        page = items[start : start + limit]
        more = start + limit < len(items)
        return json.dumps({"items": page, "metadata": {"continue": str(start + limit) if more else ""}}).encode()


def deployment(cluster: FakeCluster, ns: str, name: str, tmpl: dict[str, Any]) -> str:
    """A Deployment and its ReplicaSet; the ReplicaSet's name."""
    cluster.add(
        "deployments",
        ns,
        {"apiVersion": "apps/v1", "metadata": {"name": name}, "spec": {"selector": {}, "template": tmpl}},
    )
    rs = f"{name}-5d8f9"
    cluster.add(
        "replicasets",
        ns,
        {
            "metadata": {
                "name": rs,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "controller": True}],
            },
            "spec": {"template": tmpl},
        },
    )
    return rs


class Ran:
    def __init__(self, status: int, out: str, err: str) -> None:
        self.status, self.out, self.err = status, out, err

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.out)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def audit_sync(
    case: SynchronousTestCase,
    cluster: FakeCluster,
    endpoint: Resource,
    argv: list[str],
    page_size: int = 500,
    stderr: Optional[io.StringIO] = None,
) -> Ran:
    """C{amp audit ARGV} on a L{Clock}, against C{cluster} and C{endpoint} in memory."""
    clock = Clock()
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    config = case.mktemp()
    with open(config, "w") as f:
        yaml.safe_dump(
            {
                "kubernetes": {"source": "kubeconfig", "kubeconfig": "/nonexistent"},
                "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
                "failure_policy": "Ignore",
            },
            f,
        )
    d = run(
        ["--config", config, *argv],
        clock,
        stdout=out,
        stderr=err,
        connector=ResourceConnector(endpoint),
        lists=PagedLists(cluster.get, page_size),
        blocking=lambda f, *a: succeed(f(*a)),
    )
    for _ in range(1000):
        if d.called:
            break
        clock.advance(0.1)
    return Ran(case.successResultOf(d), out.getvalue(), err.getvalue())


# ---------------------------------------------------------------- the comparison


class PlacesTests(SynchronousTestCase):
    def places(self) -> Any:
        tmpl = template("web")
        admitted = copy.deepcopy(tmpl)
        admitted["metadata"]["annotations"] = {STATUS: f"mutated {EP}"}
        admitted["spec"]["volumes"] = [{"name": "shared", "emptyDir": {}}]
        admitted["spec"]["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": "/var/run/proxy"}]
        admitted["spec"]["containers"].append({"name": "proxy", "image": "envoy:1.28", "args": ["--port", "15001"]})
        admitted["spec"]["tolerations"] = [{"key": "proxy", "operator": "Exists", "effect": "NoSchedule"}]
        return touched_places(admitted_from_template(tmpl), admitted), admitted

    def test_places_name_list_elements_and_leave_out_the_stamp(self) -> None:
        places, _ = self.places()
        self.assertEqual(
            sorted(str(p) for p in places),
            [
                "/spec/containers[name=app]/volumeMounts",
                "/spec/containers[name=proxy]",
                "/spec/tolerations",
                "/spec/volumes",
            ],
        )

    def test_defaults_and_other_plugins_do_not_count(self) -> None:
        places, admitted = self.places()
        running = admitted_pod(template("web"), "web-1", None, "envoy:1.28")
        running["spec"]["containers"].append({"name": "other-injector", "image": "x"})
        self.assertEqual(compare(running, admitted, places), ())

    def test_a_changed_image_is_one_difference_at_the_running_pods_pointer(self) -> None:
        places, admitted = self.places()
        running = admitted_pod(template("web"), "web-1", None, "envoy:1.27")
        [d] = compare(running, admitted, places)
        self.assertEqual((d.path, d.before, d.after), ("/spec/containers/1/image", "envoy:1.27", "envoy:1.28"))

    def test_a_missing_element_and_a_changed_scalar_list(self) -> None:
        places, admitted = self.places()
        running = admitted_pod(template("web"), "web-1", None, "envoy:1.28")
        running["spec"]["volumes"].pop()
        running["spec"]["containers"][1]["args"] = ["--port", "15000"]
        found = {
            (d.path, json.dumps(d.before) if d.before is not MISSING else None)
            for d in compare(running, admitted, places)
        }
        self.assertEqual(found, {("/spec/volumes/-", None), ("/spec/containers/1/args", '["--port", "15000"]')})

    def test_a_place_the_endpoint_removes_must_be_absent(self) -> None:
        tmpl = template("web")
        tmpl["metadata"]["annotations"] = {"legacy": "1"}
        admitted = copy.deepcopy(tmpl)
        del admitted["metadata"]["annotations"]["legacy"]
        places = touched_places(tmpl, admitted)
        running = copy.deepcopy(tmpl)
        [d] = compare(running, admitted, places)
        self.assertEqual((d.path, d.before, d.after), ("/metadata/annotations/legacy", "1", MISSING))
        del running["metadata"]["annotations"]["legacy"]
        self.assertEqual(compare(running, admitted, places), ())

    def test_the_pods_own_name_where_the_template_had_none_is_no_difference(self) -> None:
        # An endpoint that writes the Pod's name (a sidecar's identity) gave
        # the template its empty name; each controller's Pod has its own.
        tmpl = template("web")
        admitted = copy.deepcopy(tmpl)
        admitted["spec"]["containers"][0]["env"] = [{"name": "POD", "value": ""}]
        places = touched_places(tmpl, admitted)
        running = copy.deepcopy(admitted)
        running["metadata"]["name"] = "web-7d4b9-x2k8q"
        running["spec"]["containers"][0]["env"][0]["value"] = "web-7d4b9-x2k8q"
        self.assertEqual(compare(running, admitted, places), ())
        running["spec"]["containers"][0]["env"][0]["value"] = "another-pod"
        [d] = compare(running, admitted, places)
        self.assertEqual((d.before, d.after), ("another-pod", ""))

    def test_an_empty_string_the_api_server_left_out_is_no_difference(self) -> None:
        tmpl = template("web")
        admitted = copy.deepcopy(tmpl)
        admitted["spec"]["containers"][0]["env"] = [{"name": "POD", "value": ""}]
        places = touched_places(tmpl, admitted)
        running = copy.deepcopy(admitted)
        del running["spec"]["containers"][0]["env"][0]["value"]  # omitempty
        self.assertEqual(compare(running, admitted, places), ())
        admitted["spec"]["containers"][0]["env"][0]["value"] = "x"
        [d] = compare(running, admitted, places)
        self.assertEqual((d.before, d.after), (MISSING, "x"))

    def test_numbers_and_booleans_are_not_the_same(self) -> None:
        tmpl = template("web")
        admitted = copy.deepcopy(tmpl)
        admitted["spec"]["hostNetwork"] = True
        running = copy.deepcopy(tmpl)
        running["spec"]["hostNetwork"] = 1
        self.assertEqual(len(compare(running, admitted, touched_places(tmpl, admitted))), 1)


def admitted_from_template(tmpl: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(tmpl)


# ---------------------------------------------------------------- states


class JudgeTests(SynchronousTestCase):
    def setUp(self) -> None:
        tmpl = template("web")
        self.admitted = admitted_pod(tmpl, "x", None, "envoy:1.28")
        for key in ("uid", "name"):
            del self.admitted["metadata"][key]
        self.prediction = Prediction(self.admitted, touched_places(tmpl, self.admitted), (EP,))

    def judge(self, pod: dict[str, Any], prediction: Any = "default") -> Any:
        return judge_pod(pod, self.prediction if prediction == "default" else prediction, KUBE)

    def test_states(self) -> None:
        tmpl = template("web")
        cases = [
            (admitted_pod(tmpl, "a", None, "envoy:1.28"), PodState.CURRENT),
            (admitted_pod(tmpl, "b", None, "envoy:1.27"), PodState.STALE),
            (admitted_pod(tmpl, "c", None, None), PodState.NEVER_MUTATED),
            (admitted_pod(tmpl, "d", None, None, stamp=f"skipped endpoint-timeout {EP}"), PodState.FAILED),
            (admitted_pod(tmpl, "e", None, None, **{"amp.txn2.com/enabled": "false"}), PodState.OPTED_OUT),
        ]
        self.assertEqual([self.judge(pod).state for pod, _ in cases], [state for _, state in cases])
        self.assertEqual(self.judge(cases[3][0]).detail, f"skipped endpoint-timeout {EP}")

    def test_unknown_without_a_prediction_or_when_the_endpoint_failed_now(self) -> None:
        pod = admitted_pod(template("web"), "a", None, "envoy:1.28")
        self.assertEqual(self.judge(pod, None).state, PodState.UNKNOWN)
        failed = self.judge(pod, Prediction(None, error="amp's review failed (endpoint-error)"))
        self.assertEqual((failed.state, failed.detail), (PodState.UNKNOWN, "amp's review failed (endpoint-error)"))

    def test_a_stamp_with_one_endpoint_skipped_is_failed(self) -> None:
        pod = admitted_pod(
            template("web"), "a", None, "envoy:1.28", stamp=f"skipped endpoint-timeout http://b/x; mutated {EP}"
        )
        self.assertEqual(self.judge(pod).state, PodState.FAILED)


class OwnerTests(SynchronousTestCase):
    def test_owner_chains(self) -> None:
        owners = Owners("ns")
        owners.add("Deployment", [{"metadata": {"name": "web"}}])
        owners.add("CronJob", [{"metadata": {"name": "nightly"}}])
        owners.add(
            "ReplicaSet",
            [
                {
                    "metadata": {
                        "name": "web-1",
                        "ownerReferences": [
                            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": True}
                        ],
                    }
                },
                {"metadata": {"name": "lone"}},
            ],
        )
        owners.add(
            "Job",
            [
                {
                    "metadata": {
                        "name": "nightly-1",
                        "ownerReferences": [
                            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "controller": True}
                        ],
                    }
                }
            ],
        )

        def pod(kind: Optional[str], name: str, group: str = "apps/v1") -> dict[str, Any]:
            refs = [{"apiVersion": group, "kind": kind, "name": name, "controller": True}] if kind else []
            return {"metadata": {"name": "p", "ownerReferences": refs}}

        self.assertEqual(owners.workload_of(pod("ReplicaSet", "web-1")), WorkloadKey("ns", "Deployment", "web"))
        self.assertEqual(owners.workload_of(pod("ReplicaSet", "lone")), WorkloadKey("ns", "ReplicaSet", "lone"))
        self.assertEqual(
            owners.workload_of(pod("Job", "nightly-1", "batch/v1")), WorkloadKey("ns", "CronJob", "nightly")
        )
        self.assertEqual(owners.workload_of(pod(None, "")), WorkloadKey("ns", "Pod", "p"))
        # An owner of a kind amp does not know, or one not listed: a bare Pod.
        self.assertEqual(owners.workload_of(pod("Rollout", "r", "argoproj.io/v1alpha1")).kind, "Pod")
        self.assertEqual(owners.workload_of(pod("StatefulSet", "gone")).kind, "Pod")

    def test_restart_commands(self) -> None:
        self.assertEqual(
            restart_command(WorkloadKey("a", "Deployment", "web")), "kubectl rollout restart deployment/web -n a"
        )
        self.assertEqual(
            restart_command(WorkloadKey("a", "DaemonSet", "agent")), "kubectl rollout restart daemonset/agent -n a"
        )
        self.assertIn(
            "kubectl delete pod p2 p1 -n a".replace("p2 p1", "p1 p2"),
            restart_command(WorkloadKey("a", "ReplicaSet", "r"), ["p2", "p1"]),
        )
        self.assertIn("kubectl delete pod solo -n a", restart_command(WorkloadKey("a", "Pod", "solo")))


class OutputTests(SynchronousTestCase):
    def test_control_characters_from_the_cluster_are_escaped(self) -> None:
        self.assertEqual(terminal("a\x1b[2J\rb\u202e"), "a\\x1b[2J\\x0db\\u202e")
        from amp.cli.audit_judge import PodAudit, WorkloadAudit

        w = WorkloadAudit(
            WorkloadKey("ns", "Pod", "evil\x1b]0;x\x07"),
            pods=[PodAudit("evil\x1b]0;x\x07", PodState.NEVER_MUTATED, "no stamp")],
        )
        text = render_table([w])
        self.assertNotIn("\x1b", text)
        self.assertIn("pod/evil\\x1b]0;x\\x07", text)


# ---------------------------------------------------------------- whole audits


class AuditTests(SynchronousTestCase):
    def cluster(self) -> tuple[FakeCluster, Sidecar]:
        """
        Namespace team-a: Deployment web (two Pods with the old sidecar,
        one with the new, one never mutated, one failed), StatefulSet db
        (current), a bare Pod; namespace off: not enabled.
        """
        c = FakeCluster()
        c.namespace("team-a")
        c.namespace("off", enabled=False)
        web = template("web")
        rs = deployment(c, "team-a", "web", web)
        owner = ("apps/v1", "ReplicaSet", rs)
        for name, image in (("web-old1", "envoy:1.27"), ("web-old2", "envoy:1.27"), ("web-new", "envoy:1.28")):
            c.add("pods", "team-a", admitted_pod(web, name, owner, image))
        c.add("pods", "team-a", admitted_pod(web, "web-bypassed", owner, None))
        c.add("pods", "team-a", admitted_pod(web, "web-failed", owner, None, stamp=f"skipped endpoint-timeout {EP}"))
        db = template("db", "postgres:16")
        c.add(
            "statefulsets",
            "team-a",
            {"apiVersion": "apps/v1", "metadata": {"name": "db"}, "spec": {"template": db, "serviceName": "db"}},
        )
        c.add("pods", "team-a", admitted_pod(db, "db-0", ("apps/v1", "StatefulSet", "db"), "envoy:1.28"))
        c.add("pods", "team-a", admitted_pod(template("solo"), "solo", None, "envoy:1.27"))
        done = admitted_pod(web, "web-done", owner, "envoy:1.27")
        done["status"]["phase"] = "Succeeded"
        c.add("pods", "team-a", done)
        c.add("pods", "off", admitted_pod(template("x"), "x", None, None))
        return c, Sidecar("envoy:1.28")

    def test_states_differences_commands_and_one_call_per_template(self) -> None:
        cluster, endpoint = self.cluster()
        ran = audit_sync(self, cluster, endpoint, ["-o", "json"], page_size=2)
        self.assertEqual(ran.status, 1, ran.err)
        found = {(w["kind"], w["name"]): w for w in ran.json["workloads"]}
        web = found[("Deployment", "web")]
        self.assertEqual(
            {p["name"]: p["state"] for p in web["pods"]},
            {
                "web-old1": "stale",
                "web-old2": "stale",
                "web-new": "current",
                "web-bypassed": "never-mutated",
                "web-failed": "failed",
            },
        )
        stale = next(p for p in web["pods"] if p["name"] == "web-old1")
        self.assertEqual(
            stale["differences"], [{"path": "/spec/containers/1/image", "before": "envoy:1.27", "after": "envoy:1.28"}]
        )
        self.assertEqual(web["command"], "kubectl rollout restart deployment/web -n team-a")
        self.assertEqual(found[("StatefulSet", "db")]["counts"]["current"], 1)
        self.assertIsNone(found[("StatefulSet", "db")]["command"])
        self.assertEqual(found[("Pod", "solo")]["pods"][0]["state"], "unknown")
        self.assertNotIn(("Pod", "x"), found)  # namespace off is not amp's
        self.assertEqual(ran.json["notes"], [])
        # One endpoint call per workload template (web, db), not per Pod.
        self.assertEqual((endpoint.calls, ran.json["endpoint_calls"]), (2, 2))
        # The Pods were read in pages of two.
        pods = [q for path, q in cluster.requests if path.endswith("/pods")]
        self.assertEqual(len(pods), 4)  # eight Pods
        self.assertEqual([q.get("continue", [""])[0] for q in pods], ["", "2", "4", "6"])

    def test_everything_current_exits_0(self) -> None:
        c = FakeCluster()
        c.namespace("team-a")
        web = template("web")
        rs = deployment(c, "team-a", "web", web)
        c.add("pods", "team-a", admitted_pod(web, "web-1", ("apps/v1", "ReplicaSet", rs), "envoy:1.28"))
        ran = audit_sync(self, c, Sidecar("envoy:1.28"), [])
        self.assertEqual(ran.status, 0, ran.out + ran.err)
        self.assertIn("1 Pods in 1 workloads: 1 current", ran.out)
        self.assertIn("1 templates reviewed, 1 endpoint calls", ran.out)

    def test_table(self) -> None:
        cluster, endpoint = self.cluster()
        ran = audit_sync(self, cluster, endpoint, ["-n", "team-a", "-n", "off"])
        self.assertEqual(ran.status, 1)
        self.assertIn("note: namespace off: not enabled for amp (amp.txn2.com/enabled), passed over", ran.out)
        self.assertIn('stale 2 Pod(s): /spec/containers/1/image: "envoy:1.27" -> "envoy:1.28"', ran.out)
        self.assertIn("never-mutated pod/web-bypassed", ran.out)
        self.assertIn(f"failed pod/web-failed: skipped endpoint-timeout {EP}", ran.out)
        self.assertIn("to update: kubectl rollout restart deployment/web -n team-a", ran.out)

    def test_an_endpoint_failure_is_that_workloads_not_the_audits(self) -> None:
        cluster, endpoint = self.cluster()
        cluster.namespace("team-b")
        other = Sidecar()
        root = Resource()
        root.putChild(b"sidecar", endpoint)
        cluster.objects[("namespaces", "")][-1]["metadata"]["annotations"]["amp.txn2.com/ep"] = (
            "http://127.0.0.1:8090/down"
        )
        other.fail = True
        root.putChild(b"down", other)
        api = template("api")
        rs = deployment(cluster, "team-b", "api", api)
        cluster.add("pods", "team-b", admitted_pod(api, "api-1", ("apps/v1", "ReplicaSet", rs), "envoy:1.28"))
        ran = audit_sync(self, cluster, root, ["-o", "json"])
        found = {(w["namespace"], w["name"]): w for w in ran.json["workloads"]}
        self.assertIn("endpoint", found[("team-b", "api")]["error"])
        self.assertEqual(found[("team-b", "api")]["pods"][0]["state"], "unknown")
        self.assertEqual(found[("team-a", "web")]["counts"]["stale"], 2)
        self.assertEqual(ran.status, 1)

    def test_policy_reports(self) -> None:
        cluster, endpoint = self.cluster()
        ran = audit_sync(self, cluster, endpoint, ["-o", "policyreport"])
        [report] = list(yaml.safe_load_all(ran.out))
        self.assertEqual(
            (report["apiVersion"], report["kind"], report["metadata"]["namespace"]),
            ("wgpolicyk8s.io/v1alpha2", "PolicyReport", "team-a"),
        )
        results = {r["resources"][0]["name"]: r for r in report["results"]}
        self.assertEqual(results["web"]["result"], "fail")
        self.assertEqual(results["web"]["resources"][0]["kind"], "Deployment")
        self.assertIn("kubectl rollout restart deployment/web -n team-a", results["web"]["message"])
        self.assertEqual(results["db"]["result"], "pass")
        self.assertEqual(results["solo"]["result"], "skip")  # a bare Pod without a recorded review
        self.assertEqual(report["summary"], {"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 1})

    def test_progress_on_a_terminal_only(self) -> None:
        cluster, endpoint = self.cluster()
        tty = _Tty()
        audit_sync(self, cluster, endpoint, [], stderr=tty)
        self.assertIn("amp audit: namespace team-a: ", tty.getvalue())
        self.assertTrue(tty.getvalue().endswith("\r\x1b[K"))
        plain = audit_sync(self, cluster, endpoint, [])
        self.assertEqual(plain.err, "")

    def test_bare_pods_against_their_recorded_review(self) -> None:
        from amp.record import encode_line
        from amp.record._entry import Capture

        cluster, endpoint = self.cluster()
        directory = self.mktemp()
        import os

        os.makedirs(directory)
        request_pod = template("solo")
        request_pod["metadata"]["name"] = "solo"
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "operation": "CREATE",
                "namespace": "team-a",
                "name": "solo",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": request_pod,
            },
        }
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": True},
        }
        line = encode_line(
            Capture(
                1.0,
                "u1",
                "team-a",
                {},
                {},
                (EP,),
                "Ignore",
                "normal",
                json.dumps(review).encode(),
                json.dumps(answer).encode(),
                "allowed",
                "",
            )
        )
        with open(os.path.join(directory, "amp-reviews-20260101T000000Z-1-0.jsonl"), "wb") as f:
            f.write(line)
        ran = audit_sync(self, cluster, endpoint, ["-o", "json", "--recordings", directory])
        solo = next(w for w in ran.json["workloads"] if w["name"] == "solo")
        self.assertEqual(solo["pods"][0]["state"], "stale", ran.out)
        self.assertEqual(solo["pods"][0]["differences"][0]["path"], "/spec/containers/1/image")
        self.assertIn("kubectl delete pod solo -n team-a", solo["command"])

    def test_usage(self) -> None:
        cluster, endpoint = self.cluster()
        for argv, message in (
            (["-A", "-n", "x"], "give -A or -n"),
            (["--rate", "0"], "--rate: must be at least 1"),
            (["-o", "yaml"], "invalid choice"),
        ):
            ran = audit_sync(self, cluster, endpoint, argv)
            self.assertEqual(ran.status, 2, argv)
            self.assertIn(message, ran.err)

    def test_dispatch_knows_audit(self) -> None:
        out = io.StringIO()
        status = self.successResultOf(dispatch(["audit", "--help"], Clock(), stdout=out, stderr=io.StringIO()))
        self.assertEqual(status, 0)
        self.assertIn("usage: amp audit", out.getvalue())


class PacingTests(SynchronousTestCase):
    def test_pacer_spaces_starts_by_the_rate(self) -> None:
        clock = Clock()
        pacer = Pacer(clock, 4)
        waits = [pacer.wait() for _ in range(3)]
        self.assertEqual([w.called for w in waits], [True, False, False])
        clock.advance(0.25)
        self.assertEqual([w.called for w in waits], [True, True, False])
        clock.advance(0.25)
        self.assertTrue(waits[2].called)

    def test_concurrency_and_rate_bound_the_calls(self) -> None:
        c = FakeCluster()
        c.namespace("team-a")
        for i in range(6):
            tmpl = template(f"w{i}")
            rs = deployment(c, "team-a", f"w{i}", tmpl)
            c.add("pods", "team-a", admitted_pod(tmpl, f"w{i}-1", ("apps/v1", "ReplicaSet", rs), "envoy:1.28"))
        clock = Clock()
        endpoint = Sidecar("envoy:1.28")
        config = self.mktemp()
        with open(config, "w") as f:
            yaml.safe_dump(
                {
                    "kubernetes": {"source": "kubeconfig", "kubeconfig": "/x"},
                    "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
                },
                f,
            )
        d = run(
            ["--config", config, "--rate", "2", "-o", "json"],
            clock,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
            connector=ResourceConnector(endpoint),
            lists=PagedLists(c.get, 500),
            blocking=lambda f, *a: succeed(f(*a)),
        )
        seen = []
        for _ in range(6):
            seen.append(endpoint.calls)
            clock.advance(0.5)
        self.assertEqual(seen, [1, 2, 3, 4, 5, 6])
        self.assertEqual(self.successResultOf(d), 0)


class ConfigTests(SynchronousTestCase):
    def test_audit_keys(self) -> None:
        config = parse_config({"audit": {"concurrency": 2, "rate": 5, "page_size": 100}})
        self.assertEqual((config.audit.concurrency, config.audit.rate, config.audit.page_size), (2, 5, 100))


class OwnerKindsAuditTests(SynchronousTestCase):
    def test_every_owner_kind_is_audited_by_its_template(self) -> None:
        """A CronJob's Job's Pods, a DaemonSet's, a bare ReplicaSet's and a bare Job's: each judged against its
        own template, each with its command; one endpoint call per template."""
        c = FakeCluster()
        c.namespace("ops")
        nightly, agent, lone, once = (template(n) for n in ("nightly", "agent", "lone", "once"))
        c.add(
            "cronjobs",
            "ops",
            {
                "metadata": {"name": "nightly"},
                "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": nightly}}},
            },
        )
        c.add(
            "jobs",
            "ops",
            {
                "metadata": {
                    "name": "nightly-29000000",
                    "ownerReferences": [
                        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "controller": True}
                    ],
                },
                "spec": {"template": nightly},
            },
        )
        c.add(
            "pods",
            "ops",
            admitted_pod(nightly, "nightly-29000000-x", ("batch/v1", "Job", "nightly-29000000"), "envoy:1.27"),
        )
        c.add("daemonsets", "ops", {"metadata": {"name": "agent"}, "spec": {"template": agent}})
        c.add("pods", "ops", admitted_pod(agent, "agent-x", ("apps/v1", "DaemonSet", "agent"), "envoy:1.28"))
        c.add("replicasets", "ops", {"metadata": {"name": "lone"}, "spec": {"template": lone}})
        c.add("pods", "ops", admitted_pod(lone, "lone-x", ("apps/v1", "ReplicaSet", "lone"), "envoy:1.27"))
        c.add("jobs", "ops", {"metadata": {"name": "once"}, "spec": {"template": once}})
        c.add("pods", "ops", admitted_pod(once, "once-x", ("batch/v1", "Job", "once"), "envoy:1.27"))
        endpoint = Sidecar("envoy:1.28")
        ran = audit_sync(self, c, endpoint, ["-o", "json"])
        found = {(w["kind"], w["name"]): w for w in ran.json["workloads"]}
        self.assertEqual(
            {k: w["pods"][0]["state"] for k, w in found.items()},
            {
                ("CronJob", "nightly"): "stale",
                ("DaemonSet", "agent"): "current",
                ("ReplicaSet", "lone"): "stale",
                ("Job", "once"): "stale",
            },
        )
        self.assertIn("kubectl create job --from=cronjob/nightly", found[("CronJob", "nightly")]["command"])
        self.assertIn("kubectl delete pod lone-x -n ops", found[("ReplicaSet", "lone")]["command"])
        self.assertIn(
            "kubectl get job once -n ops -o yaml | kubectl replace --force", found[("Job", "once")]["command"]
        )
        self.assertEqual(endpoint.calls, 4)
