"""Tests for amp_examples.registry: the image registry rewrite."""

from __future__ import annotations

import pytest
from podfixtures import apply, bare_pod, jupyter_pod

from amp_examples import registry


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
    assert registry.split_image(image) == expected


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
    assert registry.rewrite_image(image, registry.DEFAULT_REGISTRY_MAP) == expected


def test_registry_reply_rewrites_containers_and_init_containers():
    pod = jupyter_pod(initContainers=[{"name": "init", "image": "gcr.io/tools/init:1"}])
    pod["spec"]["containers"].append({"name": "sidecar", "image": "quay.io/x/y"})
    pod["spec"]["containers"].append({"name": "web", "image": "gcr.io/nginx:latest"})
    reply = registry.registry_reply(pod)
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
    assert registry.registry_reply(pod) == {"patch": [], "allowed": True, "warnings": []}


def test_registry_custom_map_with_path_prefix():
    rmap = registry.parse_registry_map(["docker.io=123.dkr.ecr.us-west-2.amazonaws.com/hub/", "gcr.io = ecr.local"])
    assert rmap == {"docker.io": "123.dkr.ecr.us-west-2.amazonaws.com/hub", "gcr.io": "ecr.local"}
    pod = bare_pod({"name": "a", "image": "nginx:latest"})
    out = apply(pod, registry.registry_reply(pod, rmap)["patch"])
    assert out["spec"]["containers"][0]["image"] == "123.dkr.ecr.us-west-2.amazonaws.com/hub/library/nginx:latest"


@pytest.mark.parametrize("entry", ["gcr.io", "=asia.gcr.io", "gcr.io=", "gcr.io/proj=x.io"])
def test_parse_registry_map_rejects_bad_entries(entry):
    with pytest.raises(ValueError):
        registry.parse_registry_map([entry])
