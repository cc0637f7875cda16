"""
Every example endpoint is idempotent: its patch applies to any well-formed
Pod, and a second call on the Pod it changed returns no change. The API
server relies on this when it reinvokes a webhook (``reinvocationPolicy:
IfNeeded``) or retries a creation, and an ordered chain of endpoints
(registry rewrite, then sidecar injection) relies on it when a later round
calls every endpoint again.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from podfixtures import apply, bare_pod

from amp_examples import filer, poddefault, registry, sidecar, user_env

Mutation = Callable[[dict[str, Any]], "list[dict[str, Any]] | None"]


def _poddefault(pod: dict[str, Any]) -> list[dict[str, Any]] | None:
    reply = poddefault.poddefault_reply(pod)
    return reply["patch"] if reply["allowed"] else None


MUTATIONS: dict[str, Mutation] = {
    "user-env": user_env.user_env_patch,
    "registry": lambda pod: registry.registry_reply(pod)["patch"],
    "sidecar": sidecar.sidecar_patch,
    "poddefault": _poddefault,
    "filer": lambda pod: filer.filer_patch(pod, "team-a"),
}

_names = st.sampled_from(["a", "b", "user-home", "amp-shared", "secret-volume", "amp-proxy-init"])
_images = st.sampled_from(["nginx", "gcr.io/proj/app:1", "quay.io/x/y", "mirror.local/library/nginx", "asia.gcr.io/a"])
_env = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["AMP_USER", "X", "ADDED_VAR", "NB_PREFIX", "FILER_MOUNTS"]),
            "value": st.sampled_from(["1", "jovyan"]),
        }
    ),
    max_size=3,
)
_mounts = st.lists(
    st.fixed_dictionaries({"name": _names, "mountPath": st.sampled_from(["/data", "/var/run/amp", "/secret/gcp"])}),
    max_size=2,
)
_container = st.builds(
    lambda image, env, mounts, port: {
        k: v
        for k, v in {
            "image": image,
            "env": env,
            "volumeMounts": mounts,
            "ports": [{"containerPort": port}] if port else None,
        }.items()
        if v is not None
    },
    _images,
    st.one_of(st.none(), _env),
    st.one_of(st.none(), _mounts),
    st.one_of(st.none(), st.integers(1, 65535)),
)


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    containers = draw(st.lists(_container, min_size=1, max_size=3))
    for i, c in enumerate(containers):
        c["name"] = f"c{i}"
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["volumes"] = [{"name": n, "emptyDir": {}} for n in sorted(set(draw(st.lists(_names, max_size=3))))]
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "setup", "image": draw(_images)}]
    labels = draw(st.dictionaries(st.sampled_from(["app", "add-gcp-secret", "notebook-name"]), st.just("true")))
    return {"metadata": {"name": "p", "labels": labels}, "spec": spec}


@settings(max_examples=150, deadline=None)
@given(pods())
def test_every_patch_applies_and_a_second_call_changes_nothing(pod: dict[str, Any]) -> None:
    for name, mutate in MUTATIONS.items():
        ops = mutate(pod)
        if ops is None:  # a denial (a PodDefault conflict) changes nothing
            continue
        changed = apply(pod, ops)
        assert mutate(changed) == [], f"{name} changed the Pod it had already changed"


@settings(max_examples=100, deadline=None)
@given(pods())
def test_every_endpoint_changes_nothing_after_a_full_round_of_all_of_them(pod: dict[str, Any]) -> None:
    """Reinvocation: after every endpoint ran twice in order, a third round is a no-op for each."""
    for _ in range(2):
        for mutate in MUTATIONS.values():
            ops = mutate(pod)
            if ops is not None:
                pod = apply(pod, ops)
    for name, mutate in MUTATIONS.items():
        assert mutate(pod) in ([], None), name


def test_registry_then_sidecar_rewrites_the_sidecar_image_once() -> None:
    """The chain registry -> sidecar, with the API server's reinvocation calling both again."""
    pod = bare_pod({"name": "web", "image": "nginx:1.25"})
    pod = apply(pod, registry.registry_reply(pod)["patch"])
    pod = apply(pod, sidecar.sidecar_patch(pod))
    assert [c["image"] for c in pod["spec"]["containers"]] == ["mirror.local/library/nginx:1.25", sidecar.SIDECAR_IMAGE]

    pod = apply(pod, registry.registry_reply(pod)["patch"])  # the reinvocation round
    pod = apply(pod, sidecar.sidecar_patch(pod))
    assert [c["image"] for c in pod["spec"]["containers"]] == [
        "mirror.local/library/nginx:1.25",
        "mirror.local/envoyproxy/envoy:v1.27.0",
    ]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["web", "amp-proxy"]
    assert registry.registry_reply(pod)["patch"] == []
    assert sidecar.sidecar_patch(pod) == []
