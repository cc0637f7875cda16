"""Tests for the example endpoints: amp.example (pure) and amp.example_tap (HTTP)."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.logger import capturedLogs
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from amp import example, example_tap


def jupyter_pod(**spec_extra: Any) -> dict[str, Any]:
    """A Pod as the API server hands it to a mutating webhook after defaulting."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-jovyan",
            "namespace": "hub",
            "labels": {"app": "jupyterhub", "component": "singleuser-server"},
            "annotations": {"hub.jupyter.org/username": "jovyan"},
        },
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "jupyter/base-notebook:latest",
                    "ports": [{"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}],
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x2v9z",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                },
            ],
            "volumes": [
                {
                    "name": "kube-api-access-x2v9z",
                    "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"path": "token"}}]},
                }
            ],
            "restartPolicy": "OnFailure",
            "serviceAccountName": "default",
        },
        "status": {},
    }
    pod["spec"].update(spec_extra)
    return pod


def bare_pod(*containers: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A minimal Pod: no env, no volumes, no init containers."""
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": list(containers)}}
    if labels is not None:
        pod["metadata"]["labels"] = labels
    return pod


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply ``ops`` as the API server would; raises if any op does not apply."""
    return jsonpatch.apply_patch(pod, ops)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# --- PatchBuilder -------------------------------------------------------------


def test_builder_creates_missing_lists_and_objects_then_appends():
    b = example.PatchBuilder({"metadata": {}, "spec": {"containers": [{"name": "a"}]}})
    b.append(["spec", "containers", 0, "env"], {"name": "A", "value": "1"})
    b.append(["spec", "containers", 0, "env"], {"name": "B", "value": "2"})
    b.put(["metadata", "annotations"], "example.com/key", "v")
    assert b.ops == [
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/example.com~1key", "value": "v"},
    ]
    assert apply({"metadata": {}, "spec": {"containers": [{"name": "a"}]}}, b.ops) == b.doc


def test_builder_refuses_to_append_to_a_non_list():
    b = example.PatchBuilder({"spec": {"volumes": {"oops": True}}})
    with pytest.raises(ValueError):
        b.append(["spec", "volumes"], {"name": "v"})


# --- /user-env ------------------------------------------------------------------


def test_user_env_on_a_bare_pod_with_two_containers():
    pod = bare_pod({"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"})
    pod["metadata"]["annotations"] = {"hub.jupyter.org/username": "alice"}
    before = copy.deepcopy(pod)
    ops = example.user_env_patch(pod)
    assert pod == before, "the pure function must not modify its input"
    out = apply(pod, ops)
    for container in out["spec"]["containers"]:
        assert env_of(container) == {"AMP_USER": "alice", "ADDED_VAR": "something important"}
    assert out["spec"]["volumes"] == [{"name": "user-home", "emptyDir": {}}]
    assert out["spec"]["containers"][0]["volumeMounts"] == [{"name": "user-home", "mountPath": "/home/alice"}]
    assert "volumeMounts" not in out["spec"]["containers"][1]
    assert out["spec"]["initContainers"] == [{"name": "new-init-container", "image": "alpine:3.12.0"}]


def test_user_env_appends_to_existing_env_volumes_and_init_containers():
    pod = jupyter_pod(initContainers=[{"name": "block-metadata", "image": "alpine"}])
    pod["spec"]["containers"][0]["env"] = [{"name": "JUPYTERHUB_USER", "value": "jovyan"}]
    ops = example.user_env_patch(pod)
    # Existing lists are appended to with "-", as the Go amp example does.
    assert {"op": "add", "path": "/spec/containers/0/env/-",
            "value": {"name": "ADDED_VAR", "value": "something important"}} in ops
    out = apply(pod, ops)
    notebook = out["spec"]["containers"][0]
    assert [e["name"] for e in notebook["env"]] == ["JUPYTERHUB_USER", "AMP_USER", "ADDED_VAR"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["kube-api-access-x2v9z", "user-home"]
    assert [m["mountPath"] for m in notebook["volumeMounts"]] == [
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/home/jovyan",
    ]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["block-metadata", "new-init-container"]


def test_user_env_is_idempotent_and_replaces_a_stale_value():
    pod = jupyter_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "AMP_USER", "value": "someone-else"}]
    once = apply(pod, example.user_env_patch(pod))
    assert [e for e in once["spec"]["containers"][0]["env"] if e["name"] == "AMP_USER"] == [
        {"name": "AMP_USER", "value": "jovyan"}
    ]
    assert example.user_env_patch(once) == []


@pytest.mark.parametrize(
    "metadata, user, home",
    [
        ({"annotations": {"hub.jupyter.org/username": "jovyan"}, "labels": {"hub.jupyter.org/username": "x"}},
         "jovyan", "/home/jovyan"),
        ({"labels": {"hub.jupyter.org/username": "bob"}}, "bob", "/home/bob"),
        ({}, "anonymous", "/home/anonymous"),
        ({"annotations": {"hub.jupyter.org/username": "../../etc"}}, "../../etc", "/home/..-..-etc"),
        ({"annotations": {"hub.jupyter.org/username": ".."}}, "..", "/home/anonymous"),
        ({"annotations": {"hub.jupyter.org/username": "ann@example.org"}}, "ann@example.org",
         "/home/ann-example.org"),
    ],
)
def test_user_env_username_sources_and_safe_home(metadata, user, home):
    pod = bare_pod({"name": "a", "image": "busybox"})
    pod["metadata"].update(metadata)
    out = apply(pod, example.user_env_patch(pod))
    assert env_of(out["spec"]["containers"][0])["AMP_USER"] == user
    assert out["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == home


def test_user_env_ignores_a_pod_without_spec():
    assert example.user_env_patch({"metadata": {}}) == []


# --- /registry ------------------------------------------------------------------


@pytest.mark.parametrize(
    "image, expected",
    [
        ("nginx", ("docker.io", "library/nginx")),
        ("nginx:1.25", ("docker.io", "library/nginx:1.25")),
        ("bitnami/redis:7", ("docker.io", "bitnami/redis:7")),
        ("docker.io/nginx", ("docker.io", "library/nginx")),
        ("index.docker.io/library/nginx", ("docker.io", "library/nginx")),
        ("gcr.io/nginx:latest", ("gcr.io", "nginx:latest")),
        ("gcr.io/proj/app@sha256:abcd", ("gcr.io", "proj/app@sha256:abcd")),
        ("localhost/app", ("localhost", "app")),
        ("registry:5000/app", ("registry:5000", "app")),
    ],
)
def test_split_image(image, expected):
    assert example.split_image(image) == expected


@pytest.mark.parametrize(
    "image, expected",
    [
        ("gcr.io/nginx:latest", "asia.gcr.io/nginx:latest"),
        ("gcr.io/proj/app@sha256:abcd", "asia.gcr.io/proj/app@sha256:abcd"),
        ("nginx", "mirror.local/library/nginx"),
        ("docker.io/library/nginx:1.25", "mirror.local/library/nginx:1.25"),
        ("bitnami/redis:7", "mirror.local/bitnami/redis:7"),
        ("quay.io/prometheus/prometheus", None),
        ("asia.gcr.io/nginx", None),
        ("localhost:5000/app", None),
    ],
)
def test_rewrite_image_with_default_map(image, expected):
    assert example.rewrite_image(image, example.DEFAULT_REGISTRY_MAP) == expected


def test_registry_reply_rewrites_containers_and_init_containers():
    pod = jupyter_pod(initContainers=[{"name": "init", "image": "gcr.io/tools/init:1"}])
    pod["spec"]["containers"].append({"name": "sidecar", "image": "quay.io/x/y"})
    pod["spec"]["containers"].append({"name": "web", "image": "gcr.io/nginx:latest"})
    reply = example.registry_reply(pod)
    assert reply["allowed"] is True
    out = apply(pod, reply["patch"])
    assert [c["image"] for c in out["spec"]["containers"]] == [
        "mirror.local/jupyter/base-notebook:latest",
        "quay.io/x/y",
        "asia.gcr.io/nginx:latest",
    ]
    assert out["spec"]["initContainers"][0]["image"] == "asia.gcr.io/tools/init:1"
    assert all(op["op"] == "replace" for op in reply["patch"])
    (warning,) = reply["warnings"]
    assert "gcr.io/nginx:latest -> asia.gcr.io/nginx:latest" in warning
    assert "initContainers[0] gcr.io/tools/init:1 -> asia.gcr.io/tools/init:1" in warning
    assert "quay.io" not in warning


def test_registry_reply_without_matches_is_empty_and_quiet():
    pod = bare_pod({"name": "a", "image": "quay.io/x/y:1"})
    assert example.registry_reply(pod) == {"patch": [], "allowed": True, "warnings": []}


def test_registry_custom_map_with_path_prefix():
    rmap = example.parse_registry_map(["docker.io=123.dkr.ecr.us-west-2.amazonaws.com/hub/", "gcr.io = ecr.local"])
    assert rmap == {"docker.io": "123.dkr.ecr.us-west-2.amazonaws.com/hub", "gcr.io": "ecr.local"}
    pod = bare_pod({"name": "a", "image": "nginx:latest"})
    out = apply(pod, example.registry_reply(pod, rmap)["patch"])
    assert out["spec"]["containers"][0]["image"] == "123.dkr.ecr.us-west-2.amazonaws.com/hub/library/nginx:latest"


@pytest.mark.parametrize("entry", ["gcr.io", "=asia.gcr.io", "gcr.io=", "gcr.io/proj=x.io"])
def test_parse_registry_map_rejects_bad_entries(entry):
    with pytest.raises(ValueError):
        example.parse_registry_map([entry])


# --- /sidecar -------------------------------------------------------------------


def mesh_pod() -> dict[str, Any]:
    return bare_pod(
        {"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}, {"containerPort": 9090}]},
        {"name": "metrics", "image": "exporter:1", "ports": [{"containerPort": 9090}, {"containerPort": 9100}]},
        {"name": "worker", "image": "worker:1"},
        labels={"app": "shop"},
    )


def test_sidecar_injection_on_a_bare_pod():
    pod = mesh_pod()
    reply = example.sidecar_reply(pod)
    assert reply["allowed"] is True
    assert reply["auditAnnotations"] == {"sidecar-injected": "true"}
    out = apply(pod, reply["patch"])
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["app", "metrics", "worker", "amp-proxy"], "app containers keep their indexes"
    proxy = out["spec"]["containers"][-1]
    assert proxy["image"] == "envoyproxy/envoy:v1.27.0"
    (init,) = out["spec"]["initContainers"]
    assert init["name"] == "amp-proxy-init"
    assert env_of(init) == {"APP_PORTS": "8080,9090,9100"}
    assert out["spec"]["volumes"] == [{"name": "amp-shared", "emptyDir": {}}]
    for container in out["spec"]["containers"]:
        assert {"name": "amp-shared", "mountPath": "/var/run/amp"} in container["volumeMounts"], container["name"]


def test_sidecar_injection_keeps_existing_volumes_and_init_containers():
    pod = jupyter_pod(initContainers=[{"name": "setup", "image": "alpine"}])
    out = apply(pod, example.sidecar_patch(pod))
    assert [v["name"] for v in out["spec"]["volumes"]] == ["kube-api-access-x2v9z", "amp-shared"]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["setup", "amp-proxy-init"]
    assert env_of(out["spec"]["initContainers"][1]) == {"APP_PORTS": "8888"}
    assert len(out["spec"]["containers"][0]["volumeMounts"]) == 2


def test_sidecar_is_idempotent():
    pod = mesh_pod()
    injected = apply(pod, example.sidecar_patch(pod))
    assert example.sidecar_patch(injected) == []
    assert example.sidecar_reply(injected) == {"patch": [], "allowed": True}


@pytest.mark.parametrize("value", ["false", "False", " false "])
def test_sidecar_opt_out_annotation(value):
    pod = mesh_pod()
    pod["metadata"]["annotations"] = {"amp.txn2.com/inject": value}
    assert example.sidecar_patch(pod) == []
    assert "auditAnnotations" not in example.sidecar_reply(pod)


def test_sidecar_injects_when_annotation_is_true():
    pod = mesh_pod()
    pod["metadata"]["annotations"] = {"amp.txn2.com/inject": "true"}
    assert example.sidecar_patch(pod) != []


def test_container_ports_without_any_ports():
    pod = bare_pod({"name": "a", "image": "x"})
    assert example.container_ports(pod) == []
    out = apply(pod, example.sidecar_patch(pod))
    assert env_of(out["spec"]["initContainers"][0]) == {"APP_PORTS": ""}


# --- /poddefault ----------------------------------------------------------------


@pytest.mark.parametrize(
    "selector, labels, expected",
    [
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchLabels": {"a": "1"}}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]}, {"tier": "api"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}, {"tier": "db"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}, {"tier": "web"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}, {"tier": "db"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "1"}, False),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]},
            {"a": "1", "gpu": "yes"},
            False,
        ),
    ],
)
def test_selector_matches(selector, labels, expected):
    assert example.selector_matches(selector, labels) is expected


@pytest.mark.parametrize(
    "selector",
    [
        {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["1"]}]},
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]},
        {"matchExpressions": [{"operator": "Exists"}]},
        {"matchLabels": {"add-gcp-secret": True}},
        {"matchLabel": {"a": "1"}},
        ["a"],
    ],
)
def test_invalid_selectors_are_rejected(selector):
    with pytest.raises(ValueError):
        example.validate_selector(selector)


def test_default_preset_adds_gcp_secret_to_every_container():
    pod = jupyter_pod()
    pod["metadata"]["labels"]["add-gcp-secret"] = "true"
    pod["spec"]["containers"].append({"name": "helper", "image": "busybox", "env": [{"name": "X", "value": "1"}]})
    reply = example.poddefault_reply(pod)
    assert reply["allowed"] is True
    assert reply["auditAnnotations"] == {"poddefaults": "add-gcp-secret"}
    out = apply(pod, reply["patch"])
    assert out["spec"]["volumes"][-1] == {"name": "secret-volume", "secret": {"secretName": "gcp-secret"}}
    for container in out["spec"]["containers"]:
        assert {"name": "secret-volume", "mountPath": "/secret/gcp"} in container["volumeMounts"]
        assert env_of(container)["GOOGLE_APPLICATION_CREDENTIALS"] == "/secret/gcp/key.json"
    assert env_of(out["spec"]["containers"][1])["X"] == "1"


def test_default_preset_ignores_unlabelled_pods():
    pod = jupyter_pod()
    assert example.poddefault_reply(pod) == {"patch": [], "allowed": True}
    pod["metadata"]["labels"]["add-gcp-secret"] = "false"
    assert example.poddefault_reply(pod) == {"patch": [], "allowed": True}


def test_preset_already_applied_with_api_server_defaults_is_not_a_conflict():
    pod = bare_pod(
        {
            "name": "a",
            "image": "x",
            "env": [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/secret/gcp/key.json"}],
            "volumeMounts": [{"name": "secret-volume", "mountPath": "/secret/gcp"}],
        },
        labels={"add-gcp-secret": "true"},
    )
    pod["spec"]["volumes"] = [{"name": "secret-volume", "secret": {"secretName": "gcp-secret", "defaultMode": 420}}]
    reply = example.poddefault_reply(pod)
    assert reply["allowed"] is True
    assert reply["patch"] == []


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda p: p["spec"].__setitem__("volumes", [{"name": "secret-volume", "emptyDir": {}}]),
         "volume secret-volume already exists with a different definition"),
        (lambda p: p["spec"]["containers"][0].__setitem__(
            "env", [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/elsewhere.json"}]),
         "env GOOGLE_APPLICATION_CREDENTIALS in container a"),
        (lambda p: p["spec"]["containers"][0].__setitem__(
            "volumeMounts", [{"name": "data", "mountPath": "/secret/gcp"}]),
         "container a already mounts /secret/gcp differently"),
    ],
)
def test_conflicts_deny_with_403(change, fragment):
    pod = bare_pod({"name": "a", "image": "x"}, labels={"add-gcp-secret": "true"})
    change(pod)
    reply = example.poddefault_reply(pod)
    assert reply["allowed"] is False
    assert reply["status"]["code"] == 403
    assert "PodDefault add-gcp-secret" in reply["status"]["message"]
    assert fragment in reply["status"]["message"]
    assert not reply.get("patch")


PRESETS_YAML = """
apiVersion: kubeflow.org/v1alpha1
kind: PodDefault
metadata:
  name: mount-datasets
spec:
  desc: shared datasets
  selector:
    matchExpressions:
    - {key: team, operator: In, values: [ml, research]}
    - {key: no-datasets, operator: DoesNotExist}
  volumes:
  - name: datasets
    persistentVolumeClaim: {claimName: datasets}
  volumeMounts:
  - {name: datasets, mountPath: /data}
---
- name: proxy-env
  selector:
    matchLabels: {team: ml}
  env:
  - {name: HTTPS_PROXY, value: "http://proxy.internal:3128"}
  envFrom:
  - configMapRef: {name: ml-settings}
"""


def test_presets_from_yaml_apply_in_name_order():
    presets = example.combine_presets(example.DEFAULT_PRESETS, example.parse_presets(PRESETS_YAML))
    assert [p.name for p in presets] == ["add-gcp-secret", "mount-datasets", "proxy-env"]
    pod = bare_pod({"name": "a", "image": "x"}, {"name": "b", "image": "y"}, labels={"team": "ml"})
    reply = example.poddefault_reply(pod, presets)
    assert reply["auditAnnotations"] == {"poddefaults": "mount-datasets,proxy-env"}
    out = apply(pod, reply["patch"])
    assert out["spec"]["volumes"] == [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}]
    for container in out["spec"]["containers"]:
        assert container["volumeMounts"] == [{"name": "datasets", "mountPath": "/data"}]
        assert env_of(container) == {"HTTPS_PROXY": "http://proxy.internal:3128"}
        assert container["envFrom"] == [{"configMapRef": {"name": "ml-settings"}}]

    research = bare_pod({"name": "a", "image": "x"}, labels={"team": "research"})
    assert example.poddefault_reply(research, presets)["auditAnnotations"] == {"poddefaults": "mount-datasets"}
    opted_out = bare_pod({"name": "a", "image": "x"}, labels={"team": "ml", "no-datasets": ""})
    assert example.poddefault_reply(opted_out, presets)["auditAnnotations"] == {"poddefaults": "proxy-env"}


def test_two_presets_that_disagree_deny():
    presets = example.parse_presets(
        """
- name: one
  selector: {matchLabels: {x: "1"}}
  volumes: [{name: shared, emptyDir: {}}]
- name: two
  selector: {matchLabels: {x: "1"}}
  volumes: [{name: shared, configMap: {name: cfg}}]
"""
    )
    reply = example.poddefault_reply(bare_pod({"name": "a", "image": "x"}, labels={"x": "1"}), presets)
    assert reply["allowed"] is False
    assert "PodDefault two" in reply["status"]["message"]


def test_file_preset_replaces_builtin_of_same_name():
    override = example.parse_presets(
        "- name: add-gcp-secret\n  selector: {matchLabels: {gcp: 'yes'}}\n"
        "  env: [{name: GOOGLE_APPLICATION_CREDENTIALS, value: /k.json}]\n"
    )
    presets = example.combine_presets(example.DEFAULT_PRESETS, override)
    assert len(presets) == 1
    assert example.poddefault_reply(bare_pod({"name": "a"}, labels={"add-gcp-secret": "true"}), presets)["patch"] == []
    out = apply(
        bare_pod({"name": "a"}, labels={"gcp": "yes"}),
        example.poddefault_reply(bare_pod({"name": "a"}, labels={"gcp": "yes"}), presets)["patch"],
    )
    assert env_of(out["spec"]["containers"][0]) == {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("- name: a\n  selector: {}\n  tolerations: []\n", "unsupported field(s) tolerations"),
        ("- name: a\n  env: []\n", "selector is required"),
        ("- selector: {}\n", "has no name"),
        ("- {name: a, selector: {}}\n- {name: a, selector: {}}\n", "duplicate preset name(s): a"),
        ("- name: a\n  selector: {matchLabels: {on: true}}\n", "preset a"),
        ("- name: a\n  selector: {}\n  volumeMounts: [{name: v}]\n", "volumeMounts[0] needs name and mountPath"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_preset_files_name_the_problem(text, fragment):
    with pytest.raises(ValueError) as info:
        example.parse_presets(text)
    assert fragment in str(info.value)


def test_parse_presets_accepts_a_podefault_list_object():
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"metadata": {"name": "a"}, "spec": {"selector": {"matchLabels": {"a": "1"}}}}]})
    (preset,) = example.parse_presets(text)
    assert preset.name == "a"


# --- the endpoints that exercise amp itself ------------------------------------


def test_deny_reply():
    assert example.deny_reply() == {"allowed": False, "status": {"code": 403, "message": "denied by example policy"}}


def test_bad_patch_is_valid_json_patch_that_does_not_apply():
    ops = example.bad_patch()
    jsonpatch.JsonPatch(ops)  # well-formed
    with pytest.raises(jsonpatch.JsonPatchConflict):
        apply(jupyter_pod(), ops)


def test_validate_labels():
    assert example.validate_labels_reply(jupyter_pod()) == {"patch": [], "allowed": True}
    reply = example.validate_labels_reply(bare_pod({"name": "a"}, labels={"tier": "web"}))
    assert reply == {"allowed": False, "status": {"code": 403, "message": "pod has no app label"}}
    assert example.validate_labels_reply(bare_pod({"name": "a"}))["allowed"] is False


# --- HTTP -------------------------------------------------------------------------


class HTTPTests(SynchronousTestCase):
    """The resource tree, driven through StubTreq."""

    def setUp(self) -> None:
        self.root = example_tap.build_root(max_body=64 * 1024)
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
        self.assertEqual(reply["patch"], [{"op": "replace", "path": "/spec/containers/0/image",
                                           "value": "asia.gcr.io/nginx:latest"}])
        self.assertTrue(reply["allowed"])
        self.assertIn("asia.gcr.io/nginx:latest", reply["warnings"][0])

    def test_registry_uses_the_configured_map(self) -> None:
        client = StubTreq(example_tap.build_root(registry_map={"gcr.io": "eu.gcr.io"}))
        response = self.successResultOf(client.post(
            "http://x/registry", data=json.dumps(bare_pod({"name": "a", "image": "gcr.io/a"})).encode()))
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
        presets = example.parse_presets("- name: p\n  selector: {matchLabels: {p: 'y'}}\n"
                                        "  env: [{name: P, value: '1'}]\n")
        client = StubTreq(example_tap.build_root(presets=presets))
        pod = bare_pod({"name": "a"}, labels={"p": "y", "add-gcp-secret": "true"})
        response = self.successResultOf(client.post("http://x/poddefault", data=json.dumps(pod).encode()))
        reply = json.loads(self.successResultOf(client.content(response)))
        self.assertEqual(reply["auditAnnotations"], {"poddefaults": "p"})

    def test_deny_noop_bad_patch_and_validate(self) -> None:
        self.assertEqual(self.post_json("/deny", jupyter_pod()),
                         (200, {"allowed": False, "status": {"code": 403, "message": "denied by example policy"}}))
        self.assertEqual(self.post_json("/noop", jupyter_pod()), (200, []))
        self.assertEqual(self.post_json("/bad-patch", jupyter_pod()), (200, example.bad_patch()))
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
        hang = self.root.children[b"hang"]
        self.assertEqual(len(hang.pending), 1)

    def test_non_json_and_non_object_bodies_get_400(self) -> None:
        for body in (b"not json", b"\xff\xfe", b"[1, 2]", b"\"pod\"", b""):
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
            self.post_json("/user-env", pod, {"X-Amp-Namespace": "team-a", "X-Amp-Uid": "u-1",
                                             "X-Amp-Operation": "CREATE"})
            self.post_json("/deny", pod, {"X-Amp-Namespace": "team-b"})
            self.post("/user-env", b"{", raw=True)
        ours = [e for e in events if e.get("log_namespace") == "amp.example_tap"]
        self.assertEqual(
            [(e["path"], e["namespace"], e["result"], e["status"]) for e in ours],
            [("/user-env", "team-a", "patched", 200), ("/deny", "team-b", "denied", 200),
             ("/user-env", "", "bad-request", 400)],
        )
        self.assertEqual(ours[0]["uid"], "u-1")
        self.assertEqual(ours[0]["operation"], "CREATE")
        self.assertEqual(ours[0]["ops"], 5)
        for event in events:
            self.assertNotIn("s3cr3t-value", repr(event))


class TapTests(SynchronousTestCase):
    """twistd glue: options and the service."""

    def test_defaults(self) -> None:
        options = example_tap.Options()
        options.parseOptions([])
        self.assertEqual(options["port"], 8090)
        self.assertEqual(options["interface"], "127.0.0.1")
        self.assertEqual(options["registry_map"], dict(example.DEFAULT_REGISTRY_MAP))
        self.assertEqual([p.name for p in options["preset_list"]], ["add-gcp-secret"])

    def test_registry_map_is_repeatable_and_replaces_default(self) -> None:
        options = example_tap.Options()
        options.parseOptions(["--registry-map", "gcr.io=asia.gcr.io", "--registry-map", "quay.io=q.local"])
        self.assertEqual(options["registry_map"], {"gcr.io": "asia.gcr.io", "quay.io": "q.local"})

    def test_bad_options(self) -> None:
        for argv in (["--registry-map", "nonsense"], ["--port", "70000"], ["--presets", "/nonexistent/p.yaml"],
                     ["--max-body", "0"]):
            self.assertRaises(usage.UsageError, example_tap.Options().parseOptions, argv)

    def test_make_service_listens_where_told(self) -> None:
        options = example_tap.Options()
        options.parseOptions(["--port", "18091", "--interface", "::1"])
        reactor = MemoryReactor()
        service = example_tap.makeService(options, reactor)
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
        seen: list[example_tap.CappedRequest] = []

        class Recording(example_tap.capped_request_factory(1000)):  # type: ignore[misc]
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                seen.append(self)

        site = example_tap.build_site(max_body=1000, reactor=Clock())
        site.requestFactory = Recording
        protocol = site.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(head)
        for part in body_parts:
            protocol.dataReceived(part)
        return seen, transport

    def test_declared_length_over_the_cap_is_not_buffered(self) -> None:
        seen, transport = self._serve(
            b"POST /noop HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", [b"x" * 500]
        )
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
    path.write_text(PRESETS_YAML)
    options = example_tap.Options()
    options.parseOptions(["--presets", str(path)])
    assert [p.name for p in options["preset_list"]] == ["add-gcp-secret", "mount-datasets", "proxy-env"]
    path.write_text("- name: x\n")
    with pytest.raises(usage.UsageError) as info:
        example_tap.Options().parseOptions(["--presets", str(path)])
    assert "selector is required" in str(info.value)


@implementer(IBodyProducer)
class _ChunkedBody:
    """A body of unknown length, so the client sends it chunked."""

    length = UNKNOWN_LENGTH

    def __init__(self, data: bytes) -> None:
        self.data = data

    def startProducing(self, consumer):
        for i in range(0, len(self.data), 4096):
            consumer.write(self.data[i:i + 4096])
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
        from twisted.internet import reactor
        import treq

        self.reactor = reactor
        self.treq = treq
        self.port = reactor.listenTCP(0, example_tap.build_site(max_body=1000), interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.url = f"http://127.0.0.1:{self.port.getHost().port}"

    @defer.inlineCallbacks
    def _post(self, path, body):
        response = yield self.treq.post(self.url + path, data=body, pool=self.pool,
                                        headers={"Content-Type": "application/json"})
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


# --- property: every builder's patch applies to any well-formed Pod -------------

_names = st.sampled_from(["a", "b", "user-home", "amp-shared", "secret-volume", "amp-proxy-init"])
_env = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["AMP_USER", "X", "ADDED_VAR"]),
                                       "value": st.sampled_from(["1", "jovyan"])}), max_size=3)
_mounts = st.lists(st.fixed_dictionaries({"name": _names, "mountPath": st.sampled_from(["/data", "/var/run/amp"])}),
                   max_size=2)
_container = st.builds(
    lambda i, env, mounts, port: {k: v for k, v in {
        "name": f"c{i}", "image": "nginx", "env": env, "volumeMounts": mounts,
        "ports": [{"containerPort": port}] if port else None}.items() if v is not None},
    st.integers(0, 1000),
    st.one_of(st.none(), _env),
    st.one_of(st.none(), _mounts),
    st.one_of(st.none(), st.integers(1, 65535)),
)


@st.composite
def pods(draw):
    containers = draw(st.lists(_container, min_size=1, max_size=3))
    for i, c in enumerate(containers):
        c["name"] = f"c{i}"
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["volumes"] = [{"name": n, "emptyDir": {}} for n in sorted(set(draw(st.lists(_names, max_size=3))))]
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "setup", "image": "alpine"}]
    labels = draw(st.dictionaries(st.sampled_from(["app", "add-gcp-secret"]), st.just("true")))
    return {"metadata": {"name": "p", "labels": labels}, "spec": spec}


@settings(max_examples=200, deadline=None)
@given(pods())
def test_builders_always_produce_patches_that_apply(pod):
    for ops in (
        example.user_env_patch(pod),
        example.sidecar_patch(pod),
        example.registry_reply(pod)["patch"],
    ):
        apply(pod, ops)
    reply = example.poddefault_reply(pod)
    if reply["allowed"]:
        apply(pod, reply["patch"])
    once = apply(pod, example.user_env_patch(pod))
    assert example.user_env_patch(once) == []
