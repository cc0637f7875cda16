"""
Whether a Pod bypassed amp, and the Event that records it (pure: no clock,
no I/O; the reporter, L{amp.kube._bypass}, asks and acts).

A Pod without amp's status stamp bypassed amp when it was created while its
namespace was enabled.  The API server gives two orders to tell "while":

  - times, in whole seconds: the Pod's C{creationTimestamp} and the time of
    the last write by the manager that owns the namespace's enable label
    (its managed fields, L{amp.kube._keep.label_set_at});
  - resourceVersions, which order every write the API server makes (one
    etcd revision counter), to the write: the revision of the namespace
    write that enabled it, when this replica's namespace watch saw it happen
    (L{EnableRevisions}), and a Pod's revision, exact when the Pod watch saw
    it created (an C{ADDED} event) and an upper bound when it came in a list
    (the Pod may have changed since it was created).

The verdict (L{Judge}):

  1. a namespace this replica saw created already enabled: every Pod in it
     came later, so every unstamped Pod bypassed amp, whatever the seconds;
  2. a namespace this replica saw enabled: an C{ADDED} Pod's revision after
     the enabling write bypassed amp, before it did not; a listed Pod whose
     revision is before the enabling write did not;
  3. otherwise the seconds: created in a later second than the enable, it
     bypassed amp; in an earlier second, it did not (the enable time is the
     label owner's last write, never earlier than the enable itself);
  4. created in the same second as the enable, or in a namespace whose
     enable time is unknown (no managed field owns the label): the order
     cannot be known, and the Pod is reported as I{possibly} bypassed
     (L{Verdict.SAME_SECOND}, L{Verdict.ENABLE_UNKNOWN}), never left out.

The record of a report is the Event itself: its name is made from the Pod's
uid (L{event_name}), so the API server creates it once and answers every
later attempt, by any replica, with 409 AlreadyExists.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from amp.config import KubernetesConfig
from amp.kube._keep import PodSeen, format_time
from amp.namespaces import NamespaceInfo
from amp.reasons import Mode
from amp.rules import STATUS_ANNOTATION, is_enabled, mode, protected_namespaces

#: Event reason and the component that reports it.
REASON = "AmpBypassed"
COMPONENT = "amp"
#: The middle of every report's Event name: C{<pod>.amp-bypassed.<uid>}.
NAME_TAG = "amp-bypassed"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


class Verdict(enum.StrEnum):
    """Why a Pod is reported."""

    #: created while its namespace was enabled.
    BYPASSED = "bypassed"
    #: created in the second its namespace was enabled; which came first is unknown.
    SAME_SECOND = "same-second"
    #: its namespace is enabled, but when it was enabled is unknown.
    ENABLE_UNKNOWN = "enable-time-unknown"

    @property
    def possibly(self) -> bool:
        return self is not Verdict.BYPASSED


def revision(value: Any) -> Optional[int]:
    """A resourceVersion as the revision it is; None when it is not a number."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


@dataclass(frozen=True, slots=True)
class Enabled:
    """
    The write that enabled a namespace, as this replica's namespace watch
    saw it: its C{revision}, and whether it was the namespace's creation.
    """

    revision: int
    at_creation: bool


class EnableRevisions:
    """
    The namespaces whose enabling this replica's namespace watch saw happen
    (reactor side; fed by the namespace source with each event and list).
    One entry per such namespace, dropped when it is disabled or deleted, or
    changed unseen (a relist that shows a new resourceVersion).
    """

    def __init__(self, config: KubernetesConfig) -> None:
        self._config = config
        self._seen: dict[str, Enabled] = {}

    def get(self, name: str) -> Optional[Enabled]:
        return self._seen.get(name)

    def changed(self, kind: str, before: Optional[NamespaceInfo], after: NamespaceInfo, rv: str) -> None:
        """One watch event on a namespace (C{before}: what the cache held)."""
        name = after.name
        if kind == "DELETED" or not is_enabled(after, self._config):
            self._seen.pop(name, None)
            return
        at = revision(rv)
        if kind == "ADDED" and at is not None:
            self._seen[name] = Enabled(at, at_creation=True)
        elif not is_enabled(before, self._config):
            if at is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = Enabled(at, at_creation=False)

    def replaced(self, before: Mapping[str, NamespaceInfo], after: Mapping[str, NamespaceInfo]) -> None:
        """A relist: keep only what did not change unseen."""
        for name in list(self._seen):
            old, new = before.get(name), after.get(name)
            if old is None or new is None or old.resource_version != new.resource_version:
                del self._seen[name]


class Judge:
    """
    The report's rules: whom amp acts on, the horizon, and the order of a
    Pod and its namespace's enabling (see the module docstring).

    @param own_namespace: amp's own namespace (never reported, like the
        protected ones, unless C{kubernetes.allow_protected_namespaces}).
    """

    def __init__(self, config: KubernetesConfig, own_namespace: str) -> None:
        self._config = config
        self.horizon = config.bypass.horizon
        # The namespaces amp does not act on are not reported either (the
        # webhook's namespaceSelector leaves them out).
        self._ignored = protected_namespaces(config, own_namespace)

    def __call__(
        self, pod: PodSeen, ns: Any, enabled: Optional[Enabled], *, exact: bool, now: float
    ) -> Optional[Verdict]:
        """
        The verdict on C{pod} (no stamp, not opted out), or None when it did
        not bypass amp or is not reported.

        @param ns: the namespace cache's answer for the Pod's namespace.
        @param enabled: the enabling this replica saw, if it did.
        @param exact: C{pod.revision} is the Pod's creation (an C{ADDED}
            event), not a later one (a list).
        """
        kube = self._config
        if pod.created < now - self.horizon or pod.namespace in self._ignored:
            return None
        if not isinstance(ns, NamespaceInfo) or not is_enabled(ns, kube) or mode(ns, kube) is Mode.SHADOW:
            return None
        if enabled is not None:
            if enabled.at_creation:
                return Verdict.BYPASSED
            if pod.revision is not None:
                if exact:
                    return Verdict.BYPASSED if pod.revision > enabled.revision else None
                if pod.revision < enabled.revision:
                    return None
        since = ns.enabled_since
        if since is None:
            return Verdict.ENABLE_UNKNOWN
        if int(pod.created) > int(since):
            return Verdict.BYPASSED
        if int(pod.created) < int(since):
            return None
        return Verdict.SAME_SECOND


# ---------------------------------------------------------------- the record


def event_name(pod: PodSeen) -> str:
    """
    The name of the Event that reports C{pod}: one per Pod (by uid), a
    valid DNS subdomain, readable with the Pod's name in front.
    """
    uid = pod.uid if _DNS_LABEL.match(pod.uid) else hashlib.sha256(pod.uid.encode()).hexdigest()[:40]
    return f"{pod.name[:190].rstrip('-.') or 'pod'}.{NAME_TAG}.{uid}"


def event_message(pod: PodSeen, verdict: Verdict) -> str:
    """The Event's message: what happened and how to recover."""
    if pod.controller:
        recover = f"Delete the Pod so that its {pod.controller} recreates it through amp."
    else:
        recover = "Delete and create the Pod again so that amp reviews it."
    stamp = f"it has no {STATUS_ANNOTATION} annotation, so amp did not review it"
    if verdict is Verdict.BYPASSED:
        return (
            f"Pod was admitted without amp: {stamp} (amp was unreachable and the webhook's failurePolicy "
            f"Ignore let the Pod in unchanged). {recover}"
        )
    why = (
        "it was created in the same second as its namespace was enabled, and the API server's times do "
        "not tell which came first"
        if verdict is Verdict.SAME_SECOND
        else "the namespace's managed fields do not say when it was enabled"
    )
    return (
        f"Pod was possibly admitted without amp: {stamp}, and {why}. If the namespace was enabled first, "
        f"amp was unreachable and the webhook's failurePolicy Ignore let the Pod in unchanged: {recover}"
    )


def log_line(verdict: Verdict) -> str:
    """The warning logged with each report (fields: namespace, pod, annotation)."""
    if verdict is Verdict.BYPASSED:
        return (
            "Pod {namespace}/{pod} was created without amp's review (no {annotation} annotation): "
            "amp was unreachable and the API server admitted it unchanged"
        )
    why = (
        "in the same second as its namespace was enabled"
        if verdict is Verdict.SAME_SECOND
        else "in a namespace whose enable time is unknown"
    )
    return (
        "Pod {namespace}/{pod} was possibly created without amp's review (no {annotation} annotation): "
        "it was created " + why + ", so which came first cannot be told"
    )


def event_body(pod: PodSeen, verdict: Verdict, *, identity: str, now: float) -> dict[str, Any]:
    """The Event that reports C{pod}, named by L{event_name}."""
    when = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod), "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "reason": REASON,
        "type": "Warning",
        "message": event_message(pod, verdict),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": identity[:128],
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
    }
