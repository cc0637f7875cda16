"""Tests for amp_examples.filer: file-share sidecars for notebook Pods."""

from __future__ import annotations

import json
from typing import Any

import pytest
from podfixtures import apply, bare_pod, env_of
from treq.testing import StubTreq
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from amp_examples import filer, server

SHARES_YAML = """
filers:
  fld9: https://fld9.filers.internal:9000
  fld5: http://fld5.filers.internal
shares:
  team-a: [fld9/projects/alpha, fld5/scratch]
  "*": [fld9/common]
"""


def notebook(*extra: dict[str, Any]) -> dict[str, Any]:
    """A Kubeflow notebook Pod: the user container defines NB_PREFIX and is not the first."""
    return bare_pod(
        {"name": "istio-proxy", "image": "istio/proxyv2"},
        {"name": "alice", "image": "kubeflownotebookswg/jupyter", "env": [{"name": "NB_PREFIX", "value": "/nb/a"}]},
        *extra,
        labels={"notebook-name": "alice"},
    )


def test_each_share_gets_a_sidecar_a_volume_and_a_mount_in_the_user_container():
    config = filer.parse_shares(SHARES_YAML)
    pod = notebook()
    reply = filer.filer_reply(pod, "team-a", config)
    assert reply["auditAnnotations"] == {"filer-shares": "fld9/projects/alpha,fld5/scratch"}
    out = apply(pod, reply["patch"])
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names[:2] == ["istio-proxy", "alice"], "existing containers keep their indexes"
    sidecars = out["spec"]["containers"][2:]
    alpha, scratch = config.for_namespace("team-a")
    assert [s["name"] for s in sidecars] == [alpha.container, scratch.container]
    assert sidecars[0]["args"][1] == f":s3:{alpha.bucket}"
    assert "--s3-endpoint=https://fld9.filers.internal:9000" in sidecars[0]["args"]
    assert sidecars[1]["envFrom"] == [{"secretRef": {"name": "filer-fld5-credentials"}}]
    assert sidecars[0]["volumeMounts"][0]["mountPropagation"] == "Bidirectional"
    assert [v["name"] for v in out["spec"]["volumes"]] == [alpha.container, scratch.container]
    user = out["spec"]["containers"][1]
    assert [(m["name"], m["mountPath"]) for m in user["volumeMounts"]] == [
        (alpha.container, "/home/jovyan/filers/fld9/projects/alpha"),
        (scratch.container, "/home/jovyan/filers/fld5/scratch"),
    ]
    assert env_of(user)["FILER_MOUNTS"] == "/home/jovyan/filers/fld9/projects/alpha:/home/jovyan/filers/fld5/scratch"
    assert "volumeMounts" not in out["spec"]["containers"][0]
    assert filer.filer_patch(out, "team-a", config) == []


def test_other_namespaces_get_the_wildcard_shares_and_unlisted_ones_nothing():
    config = filer.parse_shares(SHARES_YAML)
    out = apply(notebook(), filer.filer_patch(notebook(), "team-b", config))
    assert [c["name"] for c in out["spec"]["containers"]][2:] == [config.for_namespace("team-b")[0].container]
    only_team_a = filer.parse_shares("filers: {fld9: 'http://f'}\nshares: {team-a: [fld9/x]}\n")
    assert filer.filer_reply(notebook(), "team-b", only_team_a) == {"patch": [], "allowed": True}


def test_only_notebook_pods_are_changed():
    pod = bare_pod({"name": "web", "image": "nginx"}, labels={"app": "web"})
    assert filer.filer_patch(pod, "team-a") == []


def test_without_nb_prefix_the_first_container_is_the_users():
    pod = bare_pod({"name": "a", "image": "x"}, {"name": "b", "image": "y"}, labels={"notebook-name": "n"})
    out = apply(pod, filer.filer_patch(pod, "any"))
    assert out["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/home/jovyan/filers/fld9/projects"
    assert "volumeMounts" not in out["spec"]["containers"][1]


def test_a_share_added_later_is_mounted_next_to_the_first():
    one = filer.parse_shares("filers: {fld9: 'http://f'}\nshares: {'*': [fld9/a]}\n")
    two = filer.parse_shares("filers: {fld9: 'http://f'}\nshares: {'*': [fld9/a, fld9/b]}\n")
    pod = apply(notebook(), filer.filer_patch(notebook(), "ns", one))
    pod = apply(pod, filer.filer_patch(pod, "ns", two))
    assert len(pod["spec"]["containers"]) == 4
    mounts = env_of(pod["spec"]["containers"][1])["FILER_MOUNTS"]
    assert mounts == "/home/jovyan/filers/fld9/a:/home/jovyan/filers/fld9/b"
    assert filer.filer_patch(pod, "ns", two) == []


def test_names_are_dns_labels_and_distinct_for_distinct_paths():
    shares = [
        filer.Share("fld9", path, "http://f") for path in ("Projects/Alpha Team", "projects/alpha-team", "x" * 200)
    ]
    assert len({s.container for s in shares}) == len({s.bucket for s in shares}) == 3
    for share in shares:
        assert len(share.container) <= 63 and share.container.replace("-", "").isalnum()
        assert len(share.bucket) <= 63 and share.bucket == share.bucket.lower()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("shares: {a: [nowhere/x]}\n", "filer 'nowhere' is not under filers"),
        ("filers: {f: 'http://f'}\nshares: {a: [f/../etc]}\n", "without empty, . or .. parts"),
        ("filers: {f: 'http://f'}\nshares: {a: [f]}\n", "FILER/DIR"),
        ("filers: {f: 'ftp://f'}\n", "is not an http(s) URL"),
        ("filers: {F_1: 'http://f'}\n", "is not a lowercase name"),
        ("filers: {f: 'http://f'}\nshares: {a: f/x}\n", "must be a list"),
        ("nonsense: 1\n", "the keys filers and shares"),
        ("filers: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_share_files_name_the_problem(text, fragment):
    with pytest.raises(ValueError) as info:
        filer.parse_shares(text)
    assert fragment in str(info.value)


def test_shares_option(tmp_path):
    path = tmp_path / "shares.yaml"
    path.write_text(SHARES_YAML)
    options = filer.Options()
    options.parseOptions(["--shares", str(path)])
    assert [s.name for s in options["share_config"].for_namespace("team-a")] == ["fld9/projects/alpha", "fld5/scratch"]
    path.write_text("shares: {a: [x/y]}\n")
    with pytest.raises(usage.UsageError) as info:
        filer.Options().parseOptions(["--shares", str(path)])
    assert "--shares" in str(info.value) and "filer 'x'" in str(info.value)


class HTTPTests(SynchronousTestCase):
    """The namespace comes from amp's X-Amp-Namespace header, else from the Pod."""

    def post(self, pod: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        config = filer.parse_shares(SHARES_YAML)
        client = StubTreq(server.build_root(share_config=config))
        response = self.successResultOf(client.post("http://x/filer", data=json.dumps(pod).encode(), headers=headers))
        self.assertEqual(response.code, 200)
        return json.loads(self.successResultOf(client.content(response)))

    def test_header_namespace(self) -> None:
        reply = self.post(notebook(), {"X-Amp-Namespace": "team-a"})
        self.assertEqual(reply["auditAnnotations"], {"filer-shares": "fld9/projects/alpha,fld5/scratch"})

    def test_pod_namespace_without_the_header(self) -> None:
        pod = notebook()
        pod["metadata"]["namespace"] = "team-a"
        self.assertEqual(
            len(self.post(pod, {})["patch"]), len(self.post(notebook(), {"X-Amp-Namespace": "team-a"})["patch"])
        )
        self.assertEqual(self.post(notebook(), {})["auditAnnotations"], {"filer-shares": "fld9/common"})
