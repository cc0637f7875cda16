"""
The MutatingWebhookConfiguration amp needs, built from its config (pure):
L{desired}, the object the managed mode (C{registration.managed}) applies,
in the shape the chart renders (one entry per failure class, selecting
enabled namespaces by the failure-class label and never amp's own or a
protected namespace), from the same L{amp.registration.Needs} the check
judges a registration by, so the two cannot disagree; and L{drifted}, what
of it the object in the cluster no longer has.
"""

from __future__ import annotations

import base64
from typing import Any, Mapping, Optional

from amp.config import Config
from amp.registration._check import NAME_LABEL
from amp.registration._needs import Needs
from amp.registration._needs import needs as needs_of

__all__ = ["desired", "drifted"]


def _entry_names(config: Config, need: Needs) -> list[tuple[str, str, Optional[tuple[str, str]]]]:
    """(name, failurePolicy, (operator, value) on the class label or None) of each entry, default first."""
    reg = config.registration
    policy = need.failure_policy
    default = policy if policy in ("Fail", "Ignore") else reg.default_class
    if need.class_label is None:
        return [(need.default_entry or reg.entry_name, default, None)]
    other = "Fail" if default == "Ignore" else "Ignore"
    names = need.default_entry or f"{default.lower()}.{reg.entry_name}", f"{other.lower()}.{reg.entry_name}"
    if names[0] == names[1]:
        raise ValueError(
            f"kubernetes.webhook_name {names[0]} names the entry of class {other}, but namespaces "
            f"without the label are of class {default}: unset it or name another entry"
        )
    return [(names[0], default, ("NotIn", other)), (names[1], other, ("In", other))]


def desired(config: Config, ca_bundle: bytes, own_namespace: Optional[str] = None) -> dict[str, Any]:
    """
    The MutatingWebhookConfiguration C{config} needs, its C{caBundle}
    C{ca_bundle} (PEM); C{own_namespace} (else C{kubernetes.own_namespace})
    is amp's namespace, where its Service is.

    @raise ValueError: when the config cannot name it (no
        C{kubernetes.webhook_configuration} or own namespace, a
        C{deadline.default_timeout} that is no whole number of seconds
        from 1 to 30).
    """
    need = needs_of(config, own_namespace)
    if not need.configuration:
        raise ValueError("kubernetes.webhook_configuration is not set: the managed registration has no name")
    if not need.own_namespace:
        raise ValueError("amp's own namespace is unknown (kubernetes.own_namespace): the Service cannot be named")
    timeout = need.default_timeout
    if timeout != int(timeout) or not 1 <= timeout <= 30:
        raise ValueError(f"deadline.default_timeout {timeout:g}s is no whole number of seconds from 1 to 30")
    kube = config.kubernetes
    reg = config.registration
    rules: list[dict[str, Any]] = [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    if need.ephemeral:
        rules.append(
            {
                "operations": ["UPDATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods/ephemeralcontainers"],
                "scope": "Namespaced",
            }
        )
    where: dict[str, Any] = (
        {"url": reg.url}
        if reg.url
        else {
            "service": {
                "name": reg.service,
                "namespace": need.own_namespace,
                "path": "/mutate",
                "port": reg.service_port,
            }
        }
    )
    entries = []
    for name, policy, on_class in _entry_names(config, need):
        expressions: list[dict[str, Any]] = []
        if need.excluded:
            expressions.append({"key": NAME_LABEL, "operator": "NotIn", "values": list(need.excluded)})
        if on_class is not None and need.class_label is not None:
            expressions.append({"key": need.class_label, "operator": on_class[0], "values": [on_class[1]]})
        # The operator's own requirements, after amp's (as the chart's static entries have them).
        for key, operator, values in reg.match_expressions:
            expressions.append({"key": key, "operator": operator, **({"values": list(values)} if values else {})})
        selector: dict[str, Any] = {"matchLabels": {need.enabled_label: need.enabled_value}}
        if expressions:
            selector["matchExpressions"] = expressions
        entries.append(
            {
                "name": name,
                "admissionReviewVersions": ["v1", "v1beta1"],
                "sideEffects": "None",
                "timeoutSeconds": int(timeout),
                "failurePolicy": policy,
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "namespaceSelector": selector,
                "objectSelector": {
                    "matchExpressions": [
                        {"key": kube.enabled_label, "operator": "NotIn", "values": [kube.opt_out_value]}
                    ]
                },
                "rules": rules,
                "clientConfig": {"caBundle": base64.b64encode(ca_bundle).decode("ascii"), **where},
            }
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        # No labels: those of the chart or the overlay that made it stay
        # theirs (managed-by would otherwise flip between them and amp).
        "metadata": {"name": need.configuration},
        "webhooks": entries,
    }


def _has(have: Any, want: Any, where: str) -> Optional[str]:
    """The first place (a path) where C{have} lacks what C{want} sets, or None."""
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            return where
        for key, value in want.items():
            found = _has(have.get(key), value, f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return where
        for i, (h, w) in enumerate(zip(have, want)):
            found = _has(h, w, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    return None if have == want else where


def drifted(obj: Optional[Mapping[str, Any]], want: Mapping[str, Any]) -> Optional[str]:
    """
    Where the object in the cluster (C{obj}, None: it does not exist)
    differs from C{want} (L{desired}), as a path such as
    C{webhooks[fail.mutate.amp.txn2.com].timeoutSeconds}; None when it has
    everything amp applies (fields others set beside it, and the defaults
    the API server fills in, are no drift).  An entry amp does not apply is
    drift: it would send Pods to amp twice or from other namespaces.
    """
    if not obj:
        return "(missing)"
    # The metadata is not judged: the watch follows the object by its name,
    # and what it keeps of it (amp.kube) is the webhooks.
    have = {e.get("name"): e for e in obj.get("webhooks") or () if isinstance(e, Mapping)}
    wanted = {e["name"]: e for e in want["webhooks"]}
    for name in have:
        if name not in wanted:
            return f"webhooks[{name}] (not amp's)"
    for name, entry in wanted.items():
        if name not in have:
            return f"webhooks[{name}] (missing)"
        found = _has(have[name], entry, f"webhooks[{name}]")
        if found is not None:
            return found
    return None
