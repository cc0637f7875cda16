"""
What amp keeps of the objects it lists and watches (pure; runs in the watch
threads and the thread pool).

Every object the API server sends is cut down here, in the thread that read
it, to the few fields amp uses: the enable label and amp's annotations of a
Namespace, the failurePolicy of amp's own webhook.  Nothing else is kept.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Iterable, Mapping, Optional

from amp.config import KubernetesConfig
from amp.namespaces import NamespaceInfo

_EMPTY: Mapping[str, str] = types.MappingProxyType({})


class Keep:
    """
    The label and annotations amp reads; every other key is dropped.  The
    kept keys are these very string objects, shared by every namespace.
    """

    def __init__(self, config: KubernetesConfig) -> None:
        self.label = config.enabled_label
        self.annotations = tuple(dict.fromkeys((
            *config.endpoint_annotations, config.validation_annotation,
            config.failure_policy_annotation, config.mode_annotation)))

    def namespace(self, obj: Mapping[str, Any]) -> NamespaceInfo:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        value = labels.get(self.label)
        kept_labels: Mapping[str, str] = {self.label: sys.intern(value)} if isinstance(value, str) else _EMPTY
        annotations = meta.get("annotations") or {}
        kept: dict[str, str] = {}
        if annotations:
            for key in self.annotations:
                v = annotations.get(key)
                if isinstance(v, str):
                    kept[key] = v
        return NamespaceInfo(str(meta.get("name", "")), kept_labels, kept or _EMPTY,
                             str(meta.get("resourceVersion", "")))

    def namespaces(self, items: Iterable[NamespaceInfo]) -> dict[str, NamespaceInfo]:
        """A list's namespaces by name (the collector of the namespace watch)."""
        return {info.name: info for info in items}

    def namespace_body(self, body: bytes) -> NamespaceInfo:
        """One GET's answer."""
        return self.namespace(json.loads(body))


def webhook_failure_policy(obj: Optional[Mapping[str, Any]], webhook_name: Optional[str]) -> Optional[str]:
    """
    The C{failurePolicy} of the webhook entry named C{webhook_name} (the
    first entry when None) of a MutatingWebhookConfiguration; C{Fail}, the
    API's default, when the entry has none; None when there is no such entry.
    """
    if not obj:
        return None
    for hook in obj.get("webhooks") or ():
        if webhook_name is None or hook.get("name") == webhook_name:
            policy = hook.get("failurePolicy")
            return policy if isinstance(policy, str) and policy else "Fail"
    return None


class WebhookPolicy:
    """
    What the watch of amp's own MutatingWebhookConfiguration keeps: the
    failurePolicy of its webhook entry, for the configuration named
    C{name} (the list is by field selector, but a server that ignores it
    must not confuse amp).
    """

    def __init__(self, name: str, webhook_name: Optional[str]) -> None:
        self.name = name
        self.webhook_name = webhook_name

    def parse(self, obj: Mapping[str, Any]) -> tuple[str, Optional[str]]:
        name = str((obj.get("metadata") or {}).get("name", ""))
        return name, webhook_failure_policy(obj, self.webhook_name)

    def collect(self, items: Iterable[tuple[str, Optional[str]]]) -> Optional[str]:
        """The policy of the configuration named C{name} in a list, or None."""
        return next((policy for name, policy in items if name == self.name), None)
