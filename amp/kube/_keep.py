"""
What amp keeps of the objects it lists and watches (pure; runs in the watch
threads and the thread pool).

Every object the API server sends is cut down here, in the thread that read
it, to the few fields amp uses: the enable and failure-class labels, amp's annotations and the
time the label was set of a Namespace; the failurePolicy of amp's own
webhook; name, uid, creation time and controller of a Pod that carries no
status stamp, and its resourceVersion.  Nothing else is kept.
"""

from __future__ import annotations

import datetime
import json
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from amp.config import KubernetesConfig
from amp.hints import AmpKeys
from amp.namespaces import NamespaceInfo
from amp.reasons import FailurePolicy
from amp.rules import labels_opt_out, stamps

_EMPTY: Mapping[str, str] = types.MappingProxyType({})


def parse_time(value: Any) -> Optional[float]:
    """An RFC 3339 time as the API server writes it, in seconds since the epoch; None if unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def format_time(seconds: float, micro: bool = False) -> str:
    """Seconds since the epoch as the API server's C{Time} (or C{MicroTime})."""
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def label_set_at(meta: Mapping[str, Any], label: str) -> Optional[float]:
    """
    When C{label} was last written, from the object's managed fields: the
    latest C{time} of an entry whose fields own C{metadata.labels[label]}.
    An entry's time is that of its manager's last change to the object, so
    this is never earlier than the label's own change.
    """
    key = "f:" + label
    latest: Optional[float] = None
    for entry in meta.get("managedFields") or ():
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        if key in fields:
            when = parse_time(entry.get("time"))
            if when is not None and (latest is None or when > latest):
                latest = when
    return latest


class Keep:
    """
    The label and annotations amp reads; every other key is dropped.  The
    kept keys are these very string objects, shared by every namespace.
    """

    def __init__(self, config: KubernetesConfig) -> None:
        self.label = config.enabled_label
        self.enabled_value = config.enabled_value
        self.keys = AmpKeys(config)
        self.annotations = self.keys.namespace_annotations
        #: The failure-class label, kept beside the enable label.
        self.class_label = config.failure_class_label

    def namespace(self, obj: Mapping[str, Any]) -> NamespaceInfo:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        value = labels.get(self.label)
        kept_labels: Mapping[str, str] = {self.label: sys.intern(value)} if isinstance(value, str) else _EMPTY
        if self.class_label is not None and isinstance(labels, dict):
            chosen = labels.get(self.class_label)
            if isinstance(chosen, str):
                kept_labels = {**kept_labels, self.class_label: sys.intern(chosen)}
        annotations = meta.get("annotations") or {}
        kept: dict[str, str] = {}
        if annotations:
            for key in self.annotations:
                v = annotations.get(key)
                if isinstance(v, str):
                    kept[key] = v
        since = label_set_at(meta, self.label) if value == self.enabled_value else None
        hints = (
            self.keys.near_misses(labels, annotations)
            if isinstance(labels, dict) and isinstance(annotations, dict)
            else ()
        )
        return NamespaceInfo(
            str(meta.get("name", "")), kept_labels, kept or _EMPTY, str(meta.get("resourceVersion", "")), since, hints
        )

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
            return policy if isinstance(policy, str) and policy else FailurePolicy.FAIL
    return None


@dataclass(frozen=True, slots=True)
class WebhookSeen:
    """
    What the watch keeps of amp's own MutatingWebhookConfiguration: the
    C{policy} amp follows (L{webhook_failure_policy}) and the C{webhooks}
    entries, which the registration check reads (L{amp.registration}).
    """

    policy: Optional[str]
    webhooks: tuple[Mapping[str, Any], ...] = ()

    @property
    def obj(self) -> Mapping[str, Any]:
        """The configuration as the registration check reads it."""
        return {"webhooks": list(self.webhooks)}


class WebhookPolicy:
    """
    What the watch of amp's own MutatingWebhookConfiguration keeps
    (L{WebhookSeen}), for the configuration named C{name} (the list is by
    field selector, but a server that ignores it must not confuse amp).
    """

    def __init__(self, name: str, webhook_name: Optional[str]) -> None:
        self.name = name
        self.webhook_name = webhook_name

    def parse(self, obj: Mapping[str, Any]) -> tuple[str, WebhookSeen]:
        name = str((obj.get("metadata") or {}).get("name", ""))
        hooks = tuple(h for h in obj.get("webhooks") or () if isinstance(h, dict))
        return name, WebhookSeen(webhook_failure_policy(obj, self.webhook_name), hooks)

    def collect(self, items: Iterable[tuple[str, WebhookSeen]]) -> Optional[WebhookSeen]:
        """What is kept of the configuration named C{name} in a list, or None."""
        return next((seen for name, seen in items if name == self.name), None)


@dataclass(frozen=True, slots=True)
class PodSeen:
    """
    What the bypass report keeps of a Pod that carries no status stamp:
    enough to judge it and to name it in a report.

    @ivar created: its creationTimestamp, in seconds since the epoch.
    @ivar controller: the kind of its controlling owner (C{ReplicaSet},
        C{Job}, ...), or empty.
    @ivar revision: its resourceVersion as a number (None if it is not
        one): the revision of its creation in an C{ADDED} event, of a later
        change in a list.
    """

    namespace: str
    name: str
    uid: str
    created: float
    controller: str = ""
    revision: Optional[int] = None


class PodKeep:
    """
    Cuts a Pod's metadata down to a L{PodSeen}, or to nothing when it
    cannot be a bypassed Pod: it carries amp's status stamp (or the legacy
    one), it opted out (the enable label set to C{kubernetes.opt_out_value}), it is being
    deleted, or it was created before C{cutoff()} (the report's horizon, on
    the wall clock; the reactor checks again on its own clock).
    """

    def __init__(self, config: KubernetesConfig, cutoff: Callable[[], float]) -> None:
        self.config = config
        self.cutoff = cutoff

    def pod(self, obj: Mapping[str, Any]) -> Optional[PodSeen]:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if stamps(annotations):
            return None
        if labels_opt_out(meta.get("labels") or {}, self.config) or meta.get("deletionTimestamp"):
            return None
        created = parse_time(meta.get("creationTimestamp"))
        if created is None or created < self.cutoff():
            return None
        controller = next(
            (str(o.get("kind") or "") for o in meta.get("ownerReferences") or () if o.get("controller")), ""
        )
        rv = meta.get("resourceVersion")
        return PodSeen(
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            created,
            controller,
            int(rv) if isinstance(rv, str) and rv.isdigit() else None,
        )
