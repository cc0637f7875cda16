"""Tests for amp_examples.sidecar: the proxy sidecar and init container."""

from __future__ import annotations

import pytest
from podfixtures import apply, bare_pod, env_of, jupyter_pod, mesh_pod

from amp_examples import sidecar


def test_sidecar_injection_on_a_bare_pod():
    pod = mesh_pod()
    reply = sidecar.sidecar_reply(pod)
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
    out = apply(pod, sidecar.sidecar_patch(pod))
    assert [v["name"] for v in out["spec"]["volumes"]] == ["kube-api-access-x2v9z", "amp-shared"]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["setup", "amp-proxy-init"]
    assert env_of(out["spec"]["initContainers"][1]) == {"APP_PORTS": "8888"}
    assert len(out["spec"]["containers"][0]["volumeMounts"]) == 2


def test_sidecar_is_idempotent():
    pod = mesh_pod()
    injected = apply(pod, sidecar.sidecar_patch(pod))
    assert sidecar.sidecar_patch(injected) == []
    assert sidecar.sidecar_reply(injected) == {"patch": [], "allowed": True}


@pytest.mark.parametrize("value", ["false", "False", " false "])
def test_sidecar_opt_out_annotation(value):
    pod = mesh_pod()
    pod["metadata"]["annotations"] = {"amp.txn2.com/inject": value}
    assert sidecar.sidecar_patch(pod) == []
    assert "auditAnnotations" not in sidecar.sidecar_reply(pod)


def test_sidecar_injects_when_annotation_is_true():
    pod = mesh_pod()
    pod["metadata"]["annotations"] = {"amp.txn2.com/inject": "true"}
    assert sidecar.sidecar_patch(pod) != []


def test_container_ports_without_any_ports():
    pod = bare_pod({"name": "a", "image": "x"})
    assert sidecar.container_ports(pod) == []
    out = apply(pod, sidecar.sidecar_patch(pod))
    assert env_of(out["spec"]["initContainers"][0]) == {"APP_PORTS": ""}


def test_sidecar_image_option():
    """``--sidecar-image``: the proxy's image (an injector's new version), nothing else changed."""
    from amp_examples import server

    options = server.Options()
    options.parseOptions(["--sidecar-image", "envoyproxy/envoy:v1.28.0"])
    reply = server.handlers(options)["sidecar"](mesh_pod(), None)
    out = apply(mesh_pod(), reply["patch"])
    assert out["spec"]["containers"][-1]["image"] == "envoyproxy/envoy:v1.28.0"
    assert (
        apply(mesh_pod(), sidecar.sidecar_reply(mesh_pod())["patch"])["spec"]["containers"][:-1]
        == out["spec"]["containers"][:-1]
    )
