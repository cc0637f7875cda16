"""
The docs and the manifests agree with amp and with each other: one
namespace for amp in every example, no advice to restart amp for a key it
reloads, one story about endpoint idempotency, and the kubectl plugin named
where the command is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from amp.config import RESTART_ONLY, Config, effective_config

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]
DEPLOY = [p for p in sorted((ROOT / "deploy").rglob("*")) if p.is_file() and p.suffix in (".yaml", ".sh", ".md")]

#: How an example names amp's own namespace: a kubectl or helm namespace
#: flag, amp's Service host, or the namespace of one of amp's objects.
AMPS_NAMESPACE = [
    # (not `kubectl amp explain -n <ns>`: that is the Pod's namespace; nor
    # amp audit's restart commands, which name a workload's)
    re.compile(
        r"\b(?:kubectl(?! amp\b)(?! rollout restart\b)(?! delete pod\b)|helm)\b"
        r"[^\n`]*?\s(?:-n|--namespace)[ =]([a-z0-9][a-z0-9-]*)"
    ),
    re.compile(r"\bamp\.([a-z0-9][a-z0-9-]*)\.svc\b"),
    re.compile(r"\bname: amp[a-z0-9-]*, namespace: ([a-z0-9][a-z0-9-]*)"),
]
#: In the rendered manifests every namespaced object is amp's.
MANIFEST_NAMESPACE = re.compile(r"^\s*namespace: ([a-z0-9][a-z0-9-]*)\s*$", re.M)


def named_namespaces() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in {*DOCS, *DEPLOY}:
        text = path.read_text()
        patterns = AMPS_NAMESPACE + (
            [MANIFEST_NAMESPACE] if path.suffix == ".yaml" and "chart" not in path.parts else []
        )
        for pattern in patterns:
            for m in pattern.finditer(text):
                found.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_example_names_one_namespace_for_amp() -> None:
    from tests.support.deploytools import NAMESPACE

    found = named_namespaces()
    assert NAMESPACE in found
    assert {ns: sorted(paths) for ns, paths in found.items() if ns != NAMESPACE} == {}


def test_the_namespace_check_finds_a_stray_one() -> None:
    """The patterns above catch the forms the docs use (a regression: operations.md once said -n amp)."""
    stray = "kubectl -n amp port-forward deploy/amp 9090 &\nmetadata: {name: amp-metrics, namespace: amp}\n"
    assert [m.group(1) for p in AMPS_NAMESPACE for m in p.finditer(stray)] == ["amp", "amp"]


def config_keys() -> set[str]:
    def walk(value: Any, prefix: str) -> Iterator[str]:
        if isinstance(value, dict):
            for k, v in value.items():
                key = f"{prefix}.{k}" if prefix else k
                yield key
                if k != "namespaces":
                    yield from walk(v, key)

    return set(walk(effective_config(Config()), ""))


def paragraphs() -> Iterator[tuple[Path, str]]:
    for path in DOCS:
        for para in re.split(r"\n\s*\n", path.read_text()):
            yield path, para


RESTART_ADVICE = re.compile(r"\b(?:and|then) restart (?:amp|it)\b|\brestart amp (?:after|to|so)\b", re.I)


def test_no_advice_to_restart_amp_for_a_key_it_reloads() -> None:
    keys = config_keys()
    wrong = []
    for path, para in paragraphs():
        if not RESTART_ADVICE.search(para):
            continue
        named = {k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", para)}
        reloadable = {k for k in named if k not in RESTART_ONLY and not k.startswith("kubernetes.")}
        if reloadable:
            wrong.append(f"{path.relative_to(ROOT)}: {sorted(reloadable)}: {para[:80]!r}")
    assert wrong == []


def test_the_restart_check_sees_the_old_advice() -> None:
    old = "`endpoint <origin> is not in endpoints.allow`: ... add a pattern to amp's configuration and restart amp."
    assert RESTART_ADVICE.search(old)
    assert "endpoints.allow" in config_keys() and "endpoints.allow" not in RESTART_ONLY


def test_one_story_about_idempotency() -> None:
    """
    amp's webhook is registered with reinvocationPolicy Never, so an endpoint
    never sees a Pod it has patched; it still sees a Pod again in a new
    admission.  No doc or manifest says endpoints need not be idempotent
    without saying in what sense, or asks for idempotency without it.
    """
    texts = {
        p: p.read_text()
        for p in {
            *DOCS,
            *DEPLOY,
            ROOT / "deploy" / "chart" / "amp" / "values.yaml",
            *(ROOT / "deploy" / "chart" / "amp" / "templates").glob("*.yaml"),
        }
    }
    assert not [str(p.relative_to(ROOT)) for p, t in texts.items() if "need not be idempotent" in t]
    assert not [str(p.relative_to(ROOT)) for p, t in texts.items() if "Be idempotent" in t]
    endpoints = texts[ROOT / "docs" / "endpoints.md"]
    assert "reinvocationPolicy: Never" in endpoints and "amp explain --twice" in endpoints


def test_the_kubectl_plugin_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "kubectl amp explain" in readme and "kubectl-amp" in readme
