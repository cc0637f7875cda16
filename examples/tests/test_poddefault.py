"""Tests for amp_examples.poddefault: Kubeflow-style PodDefault presets."""

from __future__ import annotations

import json

import pytest
from podfixtures import apply, bare_pod, env_of, jupyter_pod

from amp_examples import poddefault


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
    assert poddefault.selector_matches(selector, labels) is expected


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
        poddefault.validate_selector(selector)


def test_default_preset_adds_gcp_secret_to_every_container():
    pod = jupyter_pod()
    pod["metadata"]["labels"]["add-gcp-secret"] = "true"
    pod["spec"]["containers"].append({"name": "helper", "image": "busybox", "env": [{"name": "X", "value": "1"}]})
    reply = poddefault.poddefault_reply(pod)
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
    assert poddefault.poddefault_reply(pod) == {"patch": [], "allowed": True}
    pod["metadata"]["labels"]["add-gcp-secret"] = "false"
    assert poddefault.poddefault_reply(pod) == {"patch": [], "allowed": True}


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
    reply = poddefault.poddefault_reply(pod)
    assert reply["allowed"] is True
    assert reply["patch"] == []


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            lambda p: p["spec"].__setitem__("volumes", [{"name": "secret-volume", "emptyDir": {}}]),
            "volume secret-volume already exists with a different definition",
        ),
        (
            lambda p: p["spec"]["containers"][0].__setitem__(
                "env", [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/elsewhere.json"}]
            ),
            "env GOOGLE_APPLICATION_CREDENTIALS in container a",
        ),
        (
            lambda p: p["spec"]["containers"][0].__setitem__(
                "volumeMounts", [{"name": "data", "mountPath": "/secret/gcp"}]
            ),
            "container a already mounts /secret/gcp differently",
        ),
    ],
)
def test_conflicts_deny_with_403(change, fragment):
    pod = bare_pod({"name": "a", "image": "x"}, labels={"add-gcp-secret": "true"})
    change(pod)
    reply = poddefault.poddefault_reply(pod)
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
    presets = poddefault.combine_presets(poddefault.DEFAULT_PRESETS, poddefault.parse_presets(PRESETS_YAML))
    assert [p.name for p in presets] == ["add-gcp-secret", "mount-datasets", "proxy-env"]
    pod = bare_pod({"name": "a", "image": "x"}, {"name": "b", "image": "y"}, labels={"team": "ml"})
    reply = poddefault.poddefault_reply(pod, presets)
    assert reply["auditAnnotations"] == {"poddefaults": "mount-datasets,proxy-env"}
    out = apply(pod, reply["patch"])
    assert out["spec"]["volumes"] == [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}]
    for container in out["spec"]["containers"]:
        assert container["volumeMounts"] == [{"name": "datasets", "mountPath": "/data"}]
        assert env_of(container) == {"HTTPS_PROXY": "http://proxy.internal:3128"}
        assert container["envFrom"] == [{"configMapRef": {"name": "ml-settings"}}]

    research = bare_pod({"name": "a", "image": "x"}, labels={"team": "research"})
    assert poddefault.poddefault_reply(research, presets)["auditAnnotations"] == {"poddefaults": "mount-datasets"}
    opted_out = bare_pod({"name": "a", "image": "x"}, labels={"team": "ml", "no-datasets": ""})
    assert poddefault.poddefault_reply(opted_out, presets)["auditAnnotations"] == {"poddefaults": "proxy-env"}


def test_two_presets_that_disagree_deny():
    presets = poddefault.parse_presets(
        """
- name: one
  selector: {matchLabels: {x: "1"}}
  volumes: [{name: shared, emptyDir: {}}]
- name: two
  selector: {matchLabels: {x: "1"}}
  volumes: [{name: shared, configMap: {name: cfg}}]
"""
    )
    reply = poddefault.poddefault_reply(bare_pod({"name": "a", "image": "x"}, labels={"x": "1"}), presets)
    assert reply["allowed"] is False
    assert "PodDefault two" in reply["status"]["message"]


def test_file_preset_replaces_builtin_of_same_name():
    override = poddefault.parse_presets(
        "- name: add-gcp-secret\n  selector: {matchLabels: {gcp: 'yes'}}\n"
        "  env: [{name: GOOGLE_APPLICATION_CREDENTIALS, value: /k.json}]\n"
    )
    presets = poddefault.combine_presets(poddefault.DEFAULT_PRESETS, override)
    assert len(presets) == 1
    pod = bare_pod({"name": "a"}, labels={"add-gcp-secret": "true"})
    assert poddefault.poddefault_reply(pod, presets)["patch"] == []
    out = apply(
        bare_pod({"name": "a"}, labels={"gcp": "yes"}),
        poddefault.poddefault_reply(bare_pod({"name": "a"}, labels={"gcp": "yes"}), presets)["patch"],
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
        poddefault.parse_presets(text)
    assert fragment in str(info.value)


def test_parse_presets_accepts_a_podefault_list_object():
    text = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [{"metadata": {"name": "a"}, "spec": {"selector": {"matchLabels": {"a": "1"}}}}],
        }
    )
    (preset,) = poddefault.parse_presets(text)
    assert preset.name == "a"
