"""
Tests that keep docs/ true to the code: the configuration reference lists
exactly the loader's keys with exactly its defaults, the metrics page lists
exactly the registry's metrics and labels, every reason of amp's one
vocabulary (L{amp.reasons}) has its entry in the troubleshooting page and
every failure reason its row in the failure-modes page, the
messages the troubleshooting page quotes are still the ones the code emits,
the endpoint protocol page names the headers amp sends and the example
endpoints that exist, and every relative link resolves.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import amp.endpoint
from amp.config import KEYS, Config, EndpointsConfig, parse_config, reference_row, rewrite_reference
from amp.metrics import Metrics
from amp.reasons import ENDPOINT_OUTCOMES, FAILURE_REASONS, SKIP_REASONS, Reason, Result
from amp_examples.server import build_root

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
AMP = ROOT / "amp"


def doc(name: str) -> str:
    return (DOCS / name).read_text()


# ---------------------------------------------------------------- config.md


def expected_keys() -> set[str]:
    """
    Every dotted key the loader accepts, from the default dataclasses: the
    endpoint settings sit directly under C{endpoints} (they are its
    defaults), maps and lists are single keys.
    """
    keys: set[str] = set()

    def walk(section: Any, prefix: str) -> None:
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(section, EndpointsConfig) and f.name == "defaults":
                walk(value, prefix)
            elif dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                keys.add(prefix + f.name)

    walk(Config(), "")
    return keys


def defaults_block() -> str:
    text = doc("config.md")
    m = re.search(r"<!-- defaults:begin -->\s*```yaml\n(.*?)```\s*<!-- defaults:end -->", text, re.S)
    assert m, "config.md has no defaults block"
    return m.group(1)


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], value


def nested(key: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def table_rows(text: str) -> list[tuple[str, str, str]]:
    """(key, default, meaning) of every table row whose first cell is a backticked key."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|\s*`([^`]*)`\s*\|\s*(.*?)\s*\|\s*$", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def test_the_key_list_is_complete() -> None:
    """The helper sees every section (guards the tests below)."""
    keys = expected_keys()
    assert {
        "listen.port",
        "endpoints.timeout",
        "endpoints.breaker.cooldown",
        "endpoints.allow",
        "kubernetes.namespaces",
        "failure_policy",
        "workers",
        "log.level",
    } <= keys
    assert not any(k.startswith("endpoints.defaults") for k in keys)


def test_defaults_block_is_exactly_the_loader_defaults() -> None:
    raw = yaml.safe_load(defaults_block())
    assert parse_config(raw) == Config()
    assert {k for k, _ in flatten(raw)} == expected_keys()


def test_reference_table_lists_every_key_once() -> None:
    keys = [k for k, _, _ in table_rows(doc("config.md"))]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    assert set(keys) == expected_keys(), (
        f"missing: {sorted(expected_keys() - set(keys))}, extra: {sorted(set(keys) - expected_keys())}"
    )


CONFIG_ROWS = table_rows((DOCS / "config.md").read_text())


@pytest.mark.parametrize("key,default,meaning", CONFIG_ROWS, ids=[row[0] for row in CONFIG_ROWS])
def test_reference_table_default_is_the_loader_default(key: str, default: str, meaning: str) -> None:
    """
    The default written in the table, given alone in a config file, gives
    the same configuration as leaving the key out.
    """
    assert len(meaning) > 20, f"{key}: say what it means"
    value = yaml.safe_load(default)
    assert parse_config(nested(key, value)) == Config(), f"{key}: documented default {default!r} differs"


def test_reference_rows_are_the_declarations() -> None:
    """
    Every row of the key tables is derived from its key's one declaration
    (default as written, meaning): C{python -m amp.config docs/config.md}
    changes nothing, and the declarations are exactly the loader's keys.
    """
    text = doc("config.md")
    assert rewrite_reference(text) == text, "run: python -m amp.config docs/config.md"
    assert [key.path for key in KEYS] == list(dict.fromkeys(key.path for key in KEYS))
    assert {key.path for key in KEYS} == expected_keys()


def test_a_changed_declaration_changes_its_row() -> None:
    """The derivation above is sensitive to a key's doc and default (guards it)."""
    key = next(key for key in KEYS if key.path == "endpoints.breaker.cooldown")
    row = reference_row(key)
    assert row == f"| `endpoints.breaker.cooldown` | `5s` | {key.doc} |"
    assert reference_row(dataclasses.replace(key, default=6.0)) != row


def test_a_wrong_documented_default_is_noticed() -> None:
    """The comparison used above is sensitive to a single changed value."""
    assert parse_config(nested("endpoints.breaker.cooldown", "6s")) != Config()
    assert parse_config(nested("kubernetes.endpoint_annotations", ["amp.txn2.com/ep"])) != Config()


# ---------------------------------------------------------------- metrics.md


def metric_rows() -> dict[str, tuple[str, list[str], str]]:
    out = {}
    for line in doc("metrics.md").splitlines():
        m = re.match(r"^\|\s*`(amp_[a-z_]+)`\s*\|\s*(\w+)\s*\|(.*?)\|(.*)\|\s*$", line)
        if m:
            labels = re.findall(r"`([a-z_]+)`", m.group(3))
            out[m.group(1)] = (m.group(2), labels, m.group(4))
    return out


def registry_metrics() -> dict[str, tuple[str, Any]]:
    metrics = Metrics()
    out = {}
    for attr in vars(metrics).values():
        if hasattr(attr, "describe"):
            for family in attr.describe():
                name = family.name + ("_total" if family.type == "counter" else "")
                out[name] = (family.type, attr)
    return out


def test_metrics_page_lists_exactly_the_registry() -> None:
    documented = metric_rows()
    defined = registry_metrics()
    assert set(documented) == set(defined), (
        f"undocumented: {sorted(set(defined) - set(documented))}, not defined: {sorted(set(documented) - set(defined))}"
    )
    for name, (kind, labels, meaning) in documented.items():
        defined_kind, collector = defined[name]
        assert kind == defined_kind, name
        assert meaning.strip(), name
        if labels:
            collector.labels(**{label: "x" for label in labels})  # refuses any other label set
        else:
            with pytest.raises(ValueError):
                collector.labels("x")


def test_metrics_page_names_every_review_result() -> None:
    row = next(line for line in doc("metrics.md").splitlines() if line.startswith("| `amp_admission_requests_total`"))
    named = set(re.findall(r"`([a-z0-9-]+)`", row.split("|")[4]))
    assert {r.value for r in Result} <= named, sorted({r.value for r in Result} - named)


def test_metrics_page_names_every_endpoint_outcome() -> None:
    outcomes = ENDPOINT_OUTCOMES
    row = next(line for line in doc("metrics.md").splitlines() if line.startswith("| `amp_endpoint_requests_total`"))
    named = set(re.findall(r"`([a-z0-9-]+)`", row.split("|")[4]))
    assert set(outcomes) <= named, sorted(set(outcomes) - named)


# ---------------------------------------------------------------- reasons


def test_the_vocabulary_is_complete() -> None:
    """The reasons the tests below go through (guards them)."""
    assert {
        "timeout",
        "http-5xx",
        "apply-failed",
        "no-endpoint",
        "not-allowed",
        "bad-url",
        "deadline",
        "internal-error",
        "cancelled",
        "endpoint-denied",
    } <= set(Reason)
    assert len(FAILURE_REASONS) >= 25
    assert set(Reason) - FAILURE_REASONS == {Reason.ENDPOINT_DENIED} | SKIP_REASONS


def reason_sections() -> set[str]:
    text = doc("troubleshooting.md")
    reasons_part = text.split("\n## Reasons\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^### `([a-z0-9-]+)`$", reasons_part, re.M))


def test_every_reason_has_a_troubleshooting_section() -> None:
    headings = reason_sections()
    reasons = set(Reason)
    assert headings == reasons, f"missing: {sorted(reasons - headings)}, not a reason: {sorted(headings - reasons)}"


def test_every_failure_reason_is_in_the_failure_modes_tables() -> None:
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", doc("failure-modes.md"), re.M))
    assert rows == FAILURE_REASONS, (
        f"missing: {sorted(FAILURE_REASONS - rows)}, not a reason: {sorted(rows - FAILURE_REASONS)}"
    )


def test_failure_modes_says_a_deny_is_not_a_failure() -> None:
    not_failures = doc("failure-modes.md").split("\n### Not failures\n", 1)[1].split("\n## ", 1)[0]
    assert f"`{Reason.ENDPOINT_DENIED}`" in not_failures


#: Messages the troubleshooting page quotes, with the code that emits them
#: (the text, or its pieces, as they appear in the source when that differs
#: from the page's).
MESSAGES = [
    ("admitted without the endpoint's patch", "answers.py", None),
    ("failure policy Fail denies the Pod", "answers.py", None),
    ("denied the Pod: ", "answers.py", None),
    ("denied by the endpoint without a message", "answers.py", None),
    ("dropped (must be a name without '/')", "admission_response.py", None),
    ("replaced an existing list of", "patch/_apply.py", None),
    ("namespace is enabled but has no endpoint annotation", "admission/_review.py", None),
    ("is not in endpoints.allow", "policy.py", None),
    ("contains non-ASCII characters (use punycode or percent-encoding)", "urls.py", None),
    ("must not have a", "urls.py", None),
    ("review deadline of", "admission/_failing.py", None),
    ("the review was cancelled: the client went away", "admission/_failing.py", None),
    ("amp internal error: ", "admission/_review.py", None),
    ("Internal error reviewing", "admission/_failing.py", None),
    ("circuit breaker open, next try in", "endpoint/_client.py", None),
    ("waiting for a slot (endpoints.max_queued)", "endpoint/_client.py", None),
    ("too little to wait for a slot (endpoints.min_call_time)", "endpoint/_client.py", None),
    (
        "for a slot (endpoints.max_concurrent calls in flight)",
        "endpoint/_call.py",
        ("for a slot (endpoints.max_concurrent ", "calls in flight); "),
    ),
    ("one probe call at a time until one is back within it", "endpoint/_client.py", None),
    ("is within its latency budget again", "endpoint/_client.py", None),
    ("no time left in the review's deadline", "endpoint/_client.py", None),
    ("call cancelled before a reply", "endpoint/_failures.py", None),
    ("could not connect within", "endpoint/_failures.py", "could not connect{within}"),
    ("connection closed before a full reply", "endpoint/_failures.py", None),
    ("host name did not resolve", "endpoint/_failures.py", None),
    ("certificate does not match the host", "endpoint/_failures.py", None),
    ("is not an unencrypted PEM private key", "endpoint/_tls.py", None),
    ("does not belong to client_cert", "endpoint/_tls.py", None),
    (
        "redirect to <location> not followed",
        "endpoint/_call.py",
        ("redirect{to} not followed", 'f" to {first_line(where)}"'),
    ),
    ("is larger than the <limit> byte limit", "http/_client.py", "is larger than the {limit} byte limit"),
    ("is not a reply", "endpoint/_call.py", None),
    ("reply is not valid HTTP/1.1: <reason>", "http/_client.py", "reply is not valid HTTP/1.1: {e}"),
    ("a request header holds a line break", "endpoint/_pool.py", None),
    ("send\n[] for no change", "reply.py", "send [] for no change"),
    ("endpoint\nreply has unknown key", "reply.py", "endpoint reply has unknown key"),
    ("the patched Pod would be invalid: ", "patch/_pod.py", None),
    ("more than patch.max_operations", "patch/_ops.py", None),
    ("is refused by amp (patch.denied_paths)", "patch/_paths.py", ('"is refused by amp"', '" (patch.denied_paths)"')),
    ("is over patch.max_size", "admission/_answering.py", None),
    ("Circuit breaker for <endpoint>\nis now open", "service.py", "Circuit breaker for {endpoint} is now {state}"),
    ("TLS certificate not reloaded", "tls.py", None),
    ("still serving serial", "tls.py", None),
    ("no TLS certificate loaded", "tls.py", None),
    ("The namespace watch restarts (<reason>)", "kube/_source.py", "watch restarts ({reason})"),
    ("Namespace lookup for <ns> failed", "kube/_misses.py", "Namespace lookup for {namespace} failed"),
    ("waiting for the first namespace list", "kube/_source.py", None),
    ("waiting for the first list of MutatingWebhookConfiguration", "kube/_source.py", None),
    (
        "cannot load the Kubernetes client\n  configuration from",
        "kube/_source.py",
        "cannot load the Kubernetes client configuration from",
    ),
    ("Refused a request: ", "http/_refusal.py", None),
    ("(listen.max_body)", "http/_server.py", None),
    ("(listen.request_timeout)", "http/_server.py", None),
    ("connections open (listen.max_connections)", "http/_factory.py", None),
    ("Bad\nAdmissionReview: ", "web.py", "Bad AdmissionReview: "),
    (
        "Review <uid> of <ns>/<pod>: endpoint <endpoint> failed (<reason>): <message>; "
        "failure policy <policy> <effect>",
        "admission/_answering.py",
        (
            "Review {uid} of {namespace}/{pod}: {text}; failure policy {policy} {effect}",
            'f"endpoint {where} failed ({reason}): {message}"',
        ),
    ),
    ("admits it without the endpoint's patch", "admission/_answering.py", None),
    (
        "is not Ignore or Fail; failure policy <policy> (from <where>) applies",
        "policy.py",
        ("is not {IGNORE} or {FAIL}; ", "failure policy {policy} (from {source}) applies"),
    ),
    (
        "nests arrays and objects more than 100\ndeep; an AdmissionReview never does",
        "admission_review.py",
        ("nests arrays and objects more than {MAX_DEPTH} deep; ", "an AdmissionReview never does", "MAX_DEPTH = 100"),
    ),
    (
        "is not JSON an API\nserver sends: NaN is not a JSON number",
        "admission_review.py",
        ("is not JSON an API server sends: ", "is not a JSON number"),
    ),
    ("is out of range", "admission_review.py", None),
    ("(webhook) is in use by pid", "startup.py", ('"webhook"', '"listen.port: {problem}"')),
    ("is in use by", "ports.py", "is in use by {port_holder(port)}"),
    (
        "a process of another user (try: sudo ss\n-ltnp 'sport = :<n>')",
        "ports.py",
        "a process of another user (try: sudo ss -ltnp 'sport = :{port}')",
    ),
    ("kubernetes.kubeconfig: cannot load <path>: <error>", "startup.py", "kubernetes.kubeconfig"),
    (
        "in-cluster service account cannot be loaded (...); outside a cluster use\nsource: kubeconfig or static",
        "startup.py",
        ("in-cluster service account cannot be loaded (", "outside a cluster use source: kubeconfig or static"),
    ),
    ("is not read by amp (did you mean", "hints.py", ("is not read by amp", "(did you mean {match}?)")),
]


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("on_page,source,in_code", MESSAGES, ids=[m[0][:40] for m in MESSAGES])
def test_quoted_messages_are_the_ones_amp_emits(on_page: str, source: str, in_code: Any) -> None:
    assert _squash(on_page) in _squash(doc("troubleshooting.md")), f"troubleshooting.md does not quote {on_page!r}"
    code = (AMP / source).read_text()
    for phrase in in_code if isinstance(in_code, tuple) else (in_code or on_page,):
        assert phrase in code, f"amp/{source} no longer says {phrase!r}"


# ---------------------------------------------------------------- endpoints.md


def test_endpoint_protocol_names_the_headers_amp_sends() -> None:
    sent = set(re.findall(r'b"(x-amp-[a-z-]+)"', (AMP / "admission" / "_review.py").read_text()))
    assert sent, "admission/_review.py sends X-Amp-* headers"
    text = doc("endpoints.md")
    documented = {h.lower() for h in re.findall(r"^(X-Amp-[A-Za-z-]+):", text, re.M)}
    assert documented == sent
    assert f"User-Agent: {amp.endpoint.USER_AGENT.decode()}" in text


def test_endpoint_page_lists_every_example_endpoint() -> None:
    served = {name.decode() for name in build_root().children if name != b"healthz"}
    rows = set(re.findall(r"^\| `/([a-z-]+)` \|", doc("endpoints.md"), re.M))
    assert rows == served


# ---------------------------------------------------------------- operations.md and the manifests


def test_operations_page_explains_the_registered_policies() -> None:
    mwc = yaml.safe_load((ROOT / "deploy" / "cert-manager" / "mutatingwebhookconfiguration.yaml").read_text())
    hooks = mwc["webhooks"]
    text = doc("operations.md")
    assert sorted(hook["failurePolicy"] for hook in hooks) == ["Fail", "Ignore"]
    for hook in hooks:
        # each entry per failure class, named where choosing a class is explained
        assert f"`{hook['name']}`" in text.split("## Choosing a failure class")[1].split("\n## ")[0]
        assert f"reinvocationPolicy: {hook['reinvocationPolicy']}" in text
        assert f"{hook['timeoutSeconds']} s" in text


# ---------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6} (.*)$", line)
        if m and not in_code:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINKED = sorted([*DOCS.glob("*.md"), ROOT / "deploy" / "README.md", ROOT / "deploy" / "no-cert-manager" / "README.md"])


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: no heading for #{anchor} in {resolved.name}"


def test_slugs_follow_github() -> None:
    assert _slug("`/readyz` is not ready") == "readyz-is-not-ready"
    assert (
        _slug("`Warning: amp: <endpoint> <reason>; admitted without the endpoint's patch`")
        == "warning-amp-endpoint-reason-admitted-without-the-endpoints-patch"
    )
