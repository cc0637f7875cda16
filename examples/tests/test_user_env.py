"""Tests for amp_examples.user_env: the JupyterHub user environment."""

from __future__ import annotations

import copy

import pytest
from podfixtures import apply, bare_pod, env_of, jupyter_pod

from amp_examples import user_env


def test_user_env_on_a_bare_pod_with_two_containers():
    pod = bare_pod({"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"})
    pod["metadata"]["annotations"] = {"hub.jupyter.org/username": "alice"}
    before = copy.deepcopy(pod)
    ops = user_env.user_env_patch(pod)
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
    ops = user_env.user_env_patch(pod)
    # Existing lists are appended to with "-", as the Go amp example does.
    assert {
        "op": "add",
        "path": "/spec/containers/0/env/-",
        "value": {"name": "ADDED_VAR", "value": "something important"},
    } in ops
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
    once = apply(pod, user_env.user_env_patch(pod))
    assert [e for e in once["spec"]["containers"][0]["env"] if e["name"] == "AMP_USER"] == [
        {"name": "AMP_USER", "value": "jovyan"}
    ]
    assert user_env.user_env_patch(once) == []


@pytest.mark.parametrize(
    "metadata, user, home",
    [
        (
            {"annotations": {"hub.jupyter.org/username": "jovyan"}, "labels": {"hub.jupyter.org/username": "x"}},
            "jovyan",
            "/home/jovyan",
        ),
        ({"labels": {"hub.jupyter.org/username": "bob"}}, "bob", "/home/bob"),
        ({}, "anonymous", "/home/anonymous"),
        ({"annotations": {"hub.jupyter.org/username": "../../etc"}}, "../../etc", "/home/..-..-etc"),
        ({"annotations": {"hub.jupyter.org/username": ".."}}, "..", "/home/anonymous"),
        (
            {"annotations": {"hub.jupyter.org/username": "ann@user_env.org"}},
            "ann@user_env.org",
            "/home/ann-user_env.org",
        ),
    ],
)
def test_user_env_username_sources_and_safe_home(metadata, user, home):
    pod = bare_pod({"name": "a", "image": "busybox"})
    pod["metadata"].update(metadata)
    out = apply(pod, user_env.user_env_patch(pod))
    assert env_of(out["spec"]["containers"][0])["AMP_USER"] == user
    assert out["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == home


def test_user_env_ignores_a_pod_without_spec():
    assert user_env.user_env_patch({"metadata": {}}) == []
