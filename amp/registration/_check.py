"""
A MutatingWebhookConfiguration against what amp needs (pure): L{check}
returns the named problems (L{amp.registration._needs.Problem}), sorted.

The selectors are judged the way the API server applies them, on probe
namespaces: an enabled namespace of each failure class (and one without
the label), and each namespace no entry may send (amp's own, kube-system,
the protected ones); each probe also carries the labels an operator's own
narrowing of the selectors asks for (C{team: a}), which is a choice, not a
problem.  The caBundle is judged against the certificate chain
amp serves, when it is given.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

from cryptography import x509

from amp.registration._needs import CLASSES, Needs, Problem
from amp.registration._needs import RegistrationProblem as P

__all__ = ["check", "selects"]

#: The label the API server puts on every namespace: its name.
NAME_LABEL = "kubernetes.io/metadata.name"
#: The name of the probe namespace of a class (no entry should select by it).
PROBE_NAMESPACE = "amp-registration-probe"
_DEFAULT_TIMEOUT = 10


def selects(selector: Optional[Mapping[str, Any]], labels: Mapping[str, str]) -> bool:
    """
    Whether a label selector (C{matchLabels}, C{matchExpressions} with
    C{In}, C{NotIn}, C{Exists}, C{DoesNotExist}) selects an object with
    C{labels}; an absent or empty selector selects everything.  An operator
    it does not know selects nothing (as the API server refuses it).
    """
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or ()
        have = labels.get(key) if isinstance(key, str) else None
        if operator == "In":
            ok = have is not None and have in values
        elif operator == "NotIn":
            ok = have is None or have not in values
        elif operator == "Exists":
            ok = have is not None
        elif operator == "DoesNotExist":
            ok = have is None
        else:
            ok = False
        if not ok:
            return False
    return True


def _name(entry: Mapping[str, Any], index: int) -> str:
    name = entry.get("name")
    return name if isinstance(name, str) and name else f"webhooks[{index}]"


def _policy(entry: Mapping[str, Any]) -> str:
    policy = entry.get("failurePolicy")
    return policy if isinstance(policy, str) and policy else "Fail"


def _timeout(entry: Mapping[str, Any]) -> int:
    timeout = entry.get("timeoutSeconds")
    return timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else _DEFAULT_TIMEOUT


def check(
    obj: Optional[Mapping[str, Any]], needs: Needs, chain: Sequence[x509.Certificate] = (), now: Optional[float] = None
) -> tuple[Problem, ...]:
    """
    The problems of C{obj} (the MutatingWebhookConfiguration, None when it
    does not exist) for C{needs}, sorted by name.  C{chain} is the
    certificate chain amp serves, leaf first (empty: the caBundle is not
    judged); C{now} (seconds since the epoch) is when, for expiry.
    """
    if not obj:
        return (
            Problem(
                P.CONFIGURATION_MISSING,
                f"the MutatingWebhookConfiguration {needs.configuration or '?'} "
                "does not exist: the API server sends amp nothing",
            ),
        )
    entries = [e for e in obj.get("webhooks") or () if isinstance(e, Mapping)]
    named = [(_name(e, i), e) for i, e in enumerate(entries)]
    found: list[Problem] = []
    found += _classes(named, needs)
    found += _protected(named, needs)
    for name, entry in named:
        found += _entry(name, entry, needs, chain, now)
    policies = {str(e.get("reinvocationPolicy") or "Never") for _, e in named}
    if len(policies) > 1:
        found.append(
            Problem(
                P.REINVOCATION_DIFFERS,
                "the entries' reinvocationPolicy differ ("
                + ", ".join(f"{n}: {e.get('reinvocationPolicy') or 'Never'}" for n, e in named)
                + "): Pods of one failure class are reviewed differently from the other's",
            )
        )
    return tuple(sorted(set(found)))


def _narrowing(named: Sequence[tuple[str, Mapping[str, Any]]], needs: Needs) -> dict[str, str]:
    """
    Labels that satisfy what the entries' selectors ask of a namespace
    besides its name, the enable label and the failure-class label (an
    operator's own narrowing, e.g. C{team: a}, is a choice, not a problem):
    each C{matchLabels} value, the first value of an C{In}, any value for
    C{Exists}; the first entry's choice wins.
    """
    ours = {NAME_LABEL, needs.enabled_label, needs.class_label}
    labels: dict[str, str] = {}
    for _, entry in named:
        selector = entry.get("namespaceSelector") or {}
        for key, value in (selector.get("matchLabels") or {}).items():
            if key not in ours and isinstance(value, str):
                labels.setdefault(key, value)
        for expression in selector.get("matchExpressions") or ():
            key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values")
            if not isinstance(key, str) or key in ours:
                continue
            if operator == "In" and values:
                labels.setdefault(key, str(values[0]))
            elif operator == "Exists":
                labels.setdefault(key, "probe")
    return labels


def _probe(needs: Needs, name: str, chosen: Optional[str], narrowing: Mapping[str, str]) -> dict[str, str]:
    labels = {**narrowing, NAME_LABEL: name, needs.enabled_label: needs.enabled_value}
    if chosen is not None and needs.class_label is not None:
        labels[needs.class_label] = chosen
    return labels


def _selecting(named: Sequence[tuple[str, Mapping[str, Any]]], labels: Mapping[str, str]) -> list[str]:
    return [name for name, entry in named if selects(entry.get("namespaceSelector"), labels)]


def _classes(named: Sequence[tuple[str, Mapping[str, Any]]], needs: Needs) -> list[Problem]:
    """Each failure class (and no label) sent to amp by exactly one entry, of the class's failurePolicy."""
    out: list[Problem] = []
    by_name = dict(named)
    default = needs.default_entry
    if default is not None and default not in by_name:
        out.append(
            Problem(
                P.DEFAULT_ENTRY_MISSING,
                f"no entry is named {default} (kubernetes.webhook_name), the one "
                "failure_policy auto follows: amp's failure policy is Fail",
            )
        )
    label = needs.class_label
    narrowing = _narrowing(named, needs)
    for chosen in (None, *(CLASSES if label is not None else ())):
        who = (
            f"enabled namespaces labelled {label}={chosen}"
            if chosen is not None
            else f"enabled namespaces without the label {label}"
            if label is not None
            else "enabled namespaces"
        )
        selecting = _selecting(named, _probe(needs, PROBE_NAMESPACE, chosen, narrowing))
        if not selecting:
            out.append(Problem(P.CLASS_NOT_CALLED, f"{who} are sent to amp by no entry: amp never sees their Pods"))
            continue
        if len(selecting) > 1:
            out.append(
                Problem(
                    P.ENTRIES_OVERLAP,
                    f"{who} are sent to amp by {len(selecting)} entries "
                    f"({', '.join(selecting)}): each Pod is reviewed more than once",
                )
            )
            continue
        [entry_name] = selecting
        got = _policy(by_name[entry_name])
        if chosen is not None:
            want = chosen
        elif needs.failure_policy != "auto":
            want = needs.failure_policy
        else:
            if default is not None and default in by_name and entry_name != default:
                out.append(
                    Problem(
                        P.DEFAULT_ENTRY_DIFFERS,
                        f"{who} are sent by entry {entry_name}, but amp follows "
                        f"entry {default} (kubernetes.webhook_name) for them",
                    )
                )
            continue
        if got != want:
            where = f"amp applies {want}" if chosen is None else f"they chose {want}"
            out.append(
                Problem(
                    P.CLASS_NOT_ENFORCED,
                    f"{who} are sent by entry {entry_name}, whose failurePolicy is "
                    f"{got} while {where}: when amp cannot be reached the API "
                    f"server applies {got} to them",
                )
            )
    return out


def _protected(named: Sequence[tuple[str, Mapping[str, Any]]], needs: Needs) -> list[Problem]:
    out = []
    narrowing = _narrowing(named, needs)
    for namespace in needs.excluded:
        what = "amp's own namespace" if namespace == needs.own_namespace else "a protected namespace"
        for chosen in (None, *(CLASSES if needs.class_label is not None else ())):
            selecting = _selecting(named, _probe(needs, namespace, chosen, narrowing))
            if selecting:
                out.append(
                    Problem(
                        P.SELECTS_PROTECTED,
                        f"entry {', '.join(selecting)} sends Pods of {namespace} "
                        f"({what}) to amp if it is enabled: add it to the "
                        f"{NAME_LABEL} NotIn list of the namespaceSelector",
                    )
                )
                break
    return out


def _covers(values: Any, want: str) -> bool:
    return isinstance(values, list) and (want in values or "*" in values)


def _rule_matches(rule: Mapping[str, Any], operation: str, resource: str) -> bool:
    return (
        _covers(rule.get("operations"), operation)
        and _covers(rule.get("apiGroups"), "")
        and _covers(rule.get("apiVersions"), "v1")
        and _covers(rule.get("resources"), resource)
        and rule.get("scope") in (None, "*", "Namespaced")
    )


def _rule_extra(rule: Mapping[str, Any], ephemeral: bool) -> Optional[str]:
    wanted = {("CREATE", "pods")} | ({("UPDATE", "pods/ephemeralcontainers")} if ephemeral else set())
    for operation in rule.get("operations") or ():
        for resource in rule.get("resources") or ():
            for group in rule.get("apiGroups") or ():
                if (operation, resource) not in wanted or group != "":
                    shown = f"{group}/{resource}" if group else resource
                    return f"{operation} {shown}"
    return None


def _entry(
    name: str, entry: Mapping[str, Any], needs: Needs, chain: Sequence[x509.Certificate], now: Optional[float]
) -> list[Problem]:
    out: list[Problem] = []
    timeout = _timeout(entry)
    budget = needs.budget(timeout)
    for where, seconds in needs.endpoint_timeouts:
        if seconds > budget:
            out.append(
                Problem(
                    P.TIMEOUT_BELOW_ENDPOINTS,
                    f"entry {name}: timeoutSeconds {timeout} less "
                    f"deadline.margin {needs.margin:g}s leaves amp {budget:g}s, "
                    f"less than {where} {seconds:g}s",
                )
            )
            break
    if needs.default_timeout != timeout:
        out.append(
            Problem(
                P.DEADLINE_DIFFERS,
                f"entry {name}: timeoutSeconds {timeout} is not deadline.default_timeout {needs.default_timeout:g}s",
            )
        )
    rules = [r for r in entry.get("rules") or () if isinstance(r, Mapping)]
    if not any(_rule_matches(r, "CREATE", "pods") for r in rules):
        out.append(Problem(P.RULES_MISSING, f"entry {name}: no rule sends Pod creations (CREATE pods, v1) to amp"))
    if needs.ephemeral and not any(_rule_matches(r, "UPDATE", "pods/ephemeralcontainers") for r in rules):
        out.append(
            Problem(
                P.RULES_MISSING,
                f"entry {name}: ephemeral_containers is on, but no rule sends "
                "UPDATE pods/ephemeralcontainers (kubectl debug) to amp",
            )
        )
    for rule in rules:
        extra = _rule_extra(rule, needs.ephemeral)
        if extra is not None:
            out.append(
                Problem(
                    P.RULES_EXTRA,
                    f"entry {name}: a rule sends {extra} to amp, which answers it "
                    "unchanged: a call on the admission path for nothing",
                )
            )
            break
    side_effects = entry.get("sideEffects")
    if side_effects not in ("None", "NoneOnDryRun"):
        out.append(
            Problem(
                P.SIDE_EFFECTS,
                f"entry {name}: sideEffects {side_effects or '(unset)'} is not None: "
                "the API server refuses dry-run creations in amp's namespaces",
            )
        )
    versions = entry.get("admissionReviewVersions") or ()
    if not any(v in ("v1", "v1beta1") for v in versions):
        out.append(
            Problem(
                P.REVIEW_VERSIONS, f"entry {name}: admissionReviewVersions {list(versions)} has neither v1 nor v1beta1"
            )
        )
    client = entry.get("clientConfig") or {}
    service = client.get("service") if isinstance(client.get("service"), Mapping) else None
    path = (service or {}).get("path") if service is not None else _url_path(client.get("url"))
    if path != "/mutate":
        out.append(Problem(P.WRONG_PATH, f"entry {name}: calls path {path or '/'}, not /mutate"))
    if chain:
        out += _ca_bundle(name, client, service, chain, now)
    return out


def _url_path(url: Any) -> Optional[str]:
    if not isinstance(url, str):
        return None
    rest = url.partition("://")[2]
    slash = rest.find("/")
    return rest[slash:].partition("?")[0] if slash >= 0 else "/"


def bundle_certificates(ca_bundle: Any) -> list[x509.Certificate]:
    """The certificates of a caBundle (base64 PEM, as the API returns it; or PEM bytes); empty if none read."""
    if not ca_bundle:
        return []
    try:
        pem = ca_bundle if isinstance(ca_bundle, bytes) else base64.b64decode(ca_bundle, validate=True)
        return x509.load_pem_x509_certificates(pem)
    except (ValueError, TypeError):
        return []


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except Exception:
        return False
    return True


def verifies(cas: Iterable[x509.Certificate], chain: Sequence[x509.Certificate], now: Optional[float]) -> bool:
    """
    Whether a CA of C{cas} signed C{chain}'s leaf, directly or through the
    chain's intermediates, and every certificate on the way is valid at
    C{now} (when given).
    """
    when = datetime.datetime.fromtimestamp(now, datetime.timezone.utc) if now is not None else None

    def valid(cert: x509.Certificate) -> bool:
        return when is None or cert.not_valid_before_utc <= when <= cert.not_valid_after_utc

    path = [c for c in chain]
    for ca in cas:
        if not valid(ca):
            continue
        for i, cert in enumerate(path):
            if (
                _issued_by(cert, ca)
                and all(valid(c) for c in path[: i + 1])
                and all(_issued_by(path[j], path[j + 1]) for j in range(i))
            ):
                return True
    return False


def _ca_bundle(
    name: str,
    client: Mapping[str, Any],
    service: Optional[Mapping[str, Any]],
    chain: Sequence[x509.Certificate],
    now: Optional[float],
) -> list[Problem]:
    out: list[Problem] = []
    cas = bundle_certificates(client.get("caBundle"))
    if not cas:
        if service is not None or client.get("caBundle"):
            out.append(
                Problem(
                    P.CA_BUNDLE_MISSING,
                    f"entry {name}: the caBundle holds no certificate: the API "
                    "server cannot verify amp's serving certificate",
                )
            )
    elif not verifies(cas, chain, now):
        leaf = chain[0]
        out.append(
            Problem(
                P.CA_BUNDLE_MISMATCH,
                f"entry {name}: no CA of the caBundle "
                f"({', '.join(c.subject.rfc4514_string() for c in cas)}) signed the "
                f"certificate amp serves (serial {leaf.serial_number:#x}, issued by "
                f"{leaf.issuer.rfc4514_string()}), or one on the way has expired",
            )
        )
    if service is not None and service.get("name") and service.get("namespace"):
        host = f"{service['name']}.{service['namespace']}.svc"
        try:
            names = (
                chain[0]
                .extensions.get_extension_for_class(x509.SubjectAlternativeName)
                .value.get_values_for_type(x509.DNSName)
            )
        except x509.ExtensionNotFound:
            names = []
        if host not in names:
            out.append(
                Problem(
                    P.CERTIFICATE_NAME,
                    f"entry {name}: the certificate amp serves does not name {host} "
                    f"(its DNS names: {', '.join(names) or 'none'})",
                )
            )
    return out
