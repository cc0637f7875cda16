"""
What C{amp explain} reviews (pure): the input file's documents in, the one
Pod the API server would send amp out.

A Pod is reviewed as written, and so is the Pod of a recorded
AdmissionReview (in its namespace).  A workload (Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job, CronJob) is turned into the Pod its controller
would create from its Pod template: the template's metadata and spec, the
namespace, the name or C{generateName} the controller gives it, the labels
and annotations the controller adds (C{pod-template-hash},
C{controller-revision-hash}, C{job-name}, ...) and an owner reference.
Hashes and uids have the controller's form but not its values (Kubernetes
hashes its Go structures; amp cannot), so an endpoint must not depend on
them.

Everything the API server's defaulting and its built-in admission plugins
would add before amp sees the Pod (default fields, the service account
token volume) is not added: the Pod is what the file says.
"""

from __future__ import annotations

import copy
import datetime
import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from amp.files import FileError, parse_documents

__all__ = ["InputError", "PodInput", "WORKLOAD_KINDS", "load_documents", "pod_for", "select_object", "without_stamps"]

#: The kinds whose Pod template amp explain reviews, by kind.
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")

_REVIEWABLE = frozenset(("Pod", "AdmissionReview", *WORKLOAD_KINDS))

#: Metadata only the API server sets; a file copied from
#: C{kubectl get -o yaml} has them, a create never sends them.
_SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "generation",
    "selfLink",
)

#: Kubernetes' C{rand.SafeEncodeString} alphabet (no vowels, no 0, 1, 3).
_SAFE = "bcdfghjklmnpqrstvwxz2456789"

#: Tolerations the DaemonSet controller adds to every daemon Pod.
_DAEMON_TOLERATIONS = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
)


class InputError(ValueError):
    """
    The input cannot be reviewed; the message says what is wrong, on one line.
    """


@dataclass(frozen=True)
class PodInput:
    """
    The Pod to review and where it came from.

    @ivar pod: the Pod as the API server would send it at CREATE.
    @ivar namespace: the namespace it is created in.
    @ivar source: C{"Pod web"} or C{"Deployment web"}: what the file held.
    """

    pod: dict[str, Any]
    namespace: str
    source: str
    #: Neither C{--namespace} nor the input named a namespace: C{default}.
    defaulted_namespace: bool = False


# ---------------------------------------------------------------- reading


def load_documents(data: bytes, name: str) -> list[Any]:
    """
    The documents of a YAML or JSON file (C{name} is for messages), read
    by L{amp.files.parse_documents} within its limits; a C{List}
    (C{kubectl get -o yaml}) counts as its items.

    @raise InputError: not UTF-8, not YAML or JSON, beyond a limit, or empty.
    """
    try:
        docs = parse_documents(data, name)
    except FileError as e:
        raise InputError(str(e)) from None
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    out: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    if not out:
        raise InputError(f"{name} holds no document")
    return out


def select_object(docs: list[Any], name: str) -> dict[str, Any]:
    """
    The one Pod or workload among C{docs}; other kinds (a Service, a
    ConfigMap) are passed over.

    @raise InputError: none, or more than one.
    """
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") in _REVIEWABLE]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(_describe(d) for d in found)
        raise InputError(f"{name} holds {len(found)} objects amp could review ({names}); give it one")
    kinds = sorted(
        {
            (f"kind {d['kind']}" if d.get("kind") is not None else "a mapping without kind")
            if isinstance(d, dict)
            else type(d).__name__
            for d in docs
        }
    )
    raise InputError(
        f"{name} holds no Pod, workload ({', '.join(WORKLOAD_KINDS)}) or AdmissionReview; found {', '.join(kinds)}"
    )


def _describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{obj.get('kind')} {name}" if name else str(obj.get("kind"))


# ---------------------------------------------------------------- the Pod


def pod_for(obj: dict[str, Any], namespace: Optional[str], now: Optional[float] = None) -> PodInput:
    """
    The Pod the API server would send amp for C{obj}: a Pod as it is, or
    the Pod the workload's controller would create.

    @param namespace: C{--namespace}; None: the object's own, else
        C{default}.
    @param now: for a CronJob, the time of the run (the Job's name holds it
        in minutes); None: the current time.
    @raise InputError: the object is not usable, or its namespace is not
        C{namespace}.
    """
    kind = obj.get("kind")
    if kind == "AdmissionReview":
        return _from_review(obj, namespace)
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InputError(f"{kind}: metadata is not a mapping")
    name = meta.get("name")
    if name is not None and not isinstance(name, str):
        raise InputError(f"{kind}: metadata.name is not a string")
    own_ns = meta.get("namespace")
    if own_ns is not None and not isinstance(own_ns, str):
        raise InputError(f"{kind} {name}: metadata.namespace is not a string")
    if namespace and own_ns and own_ns != namespace:
        raise InputError(f"the namespace of {kind} {name} ({own_ns}) does not match --namespace {namespace}")
    ns = namespace or own_ns or "default"
    if kind == "Pod":
        pod = _clean(obj)
        pod.setdefault("apiVersion", "v1")
        pod["metadata"]["namespace"] = ns
        _need_spec(pod, f"Pod {name or ''}".strip())
        return PodInput(pod, ns, f"Pod {name}" if name else "Pod")
    if not name:
        raise InputError(f"{kind}: metadata.name is missing")
    source = f"{kind} {name}"
    spec = _mapping(obj.get("spec"), f"{source}: spec")
    if kind == "CronJob":
        job_template = _mapping(spec.get("jobTemplate"), f"{source}: spec.jobTemplate")
        job_spec = _mapping(job_template.get("spec"), f"{source}: spec.jobTemplate.spec")
        minutes = int((now if now is not None else datetime.datetime.now(datetime.timezone.utc).timestamp()) // 60)
        job_name = f"{name}-{minutes}"
        template = _template(job_spec, f"{source}: spec.jobTemplate.spec.template")
        pod = _job_pod(template, job_name, ns, job_spec)
        return PodInput(pod, ns, source)
    template = _template(spec, f"{source}: spec.template")
    if kind == "Job":
        return PodInput(_job_pod(template, name, ns, spec), ns, source)
    pod = _from_template(template, ns)
    pmeta = pod["metadata"]
    labels = pmeta.setdefault("labels", {})
    if kind == "Deployment":
        h = _hash(template)
        rs = f"{name}-{h}"
        labels["pod-template-hash"] = h
        pmeta["generateName"] = f"{rs}-"
        _owner(pmeta, "apps/v1", "ReplicaSet", rs, ns)
    elif kind == "ReplicaSet":
        pmeta["generateName"] = f"{name}-"
        _owner(pmeta, "apps/v1", "ReplicaSet", name, ns)
    elif kind == "StatefulSet":
        pod_name = f"{name}-0"
        pmeta["name"] = pod_name
        labels["controller-revision-hash"] = f"{name}-{_hash(template)}"
        labels["statefulset.kubernetes.io/pod-name"] = pod_name
        labels["apps.kubernetes.io/pod-index"] = "0"
        pod["spec"]["hostname"] = pod_name
        if isinstance(spec.get("serviceName"), str) and spec["serviceName"]:
            pod["spec"]["subdomain"] = spec["serviceName"]
        _claim_volumes(pod["spec"], spec.get("volumeClaimTemplates"), name, pod_name, source)
        _owner(pmeta, "apps/v1", "StatefulSet", name, ns)
    elif kind == "DaemonSet":
        pmeta["generateName"] = f"{name}-"
        labels["controller-revision-hash"] = _hash(template)
        labels["pod-template-generation"] = str(meta.get("generation") or 1)
        _daemon_tolerations(pod["spec"])
        _owner(pmeta, "apps/v1", "DaemonSet", name, ns)
    return PodInput(pod, ns, source)


def names_namespace(obj: dict[str, Any]) -> bool:
    """Whether C{obj} (a Pod, a workload or an AdmissionReview) says which namespace it is in."""
    if obj.get("kind") == "AdmissionReview":
        request = obj.get("request")
        return isinstance(request, dict) and bool(request.get("namespace"))
    meta = obj.get("metadata")
    return isinstance(meta, dict) and bool(meta.get("namespace"))


def _from_review(review: dict[str, Any], namespace: Optional[str]) -> PodInput:
    """
    The Pod of a recorded AdmissionReview, in the review's namespace.
    """
    request = _mapping(review.get("request"), "AdmissionReview: request")
    obj = request.get("object")
    if not isinstance(obj, dict) or obj.get("kind", "Pod") != "Pod":
        raise InputError("AdmissionReview: request.object is not a Pod")
    own = request.get("namespace")
    if namespace and own and own != namespace:
        raise InputError(f"the namespace of the AdmissionReview ({own}) does not match --namespace {namespace}")
    got = pod_for({**obj, "kind": "Pod"}, namespace or (own if isinstance(own, str) else None))
    return PodInput(got.pod, got.namespace, f"{got.source} (from an AdmissionReview)")


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{what} is missing or not a mapping")
    return value


def _template(spec: dict[str, Any], what: str) -> dict[str, Any]:
    template = _mapping(spec.get("template"), what)
    _mapping(template.get("spec"), f"{what}.spec")
    if template.get("metadata") is not None:
        _mapping(template["metadata"], f"{what}.metadata")
    return template


def _need_spec(pod: dict[str, Any], what: str) -> None:
    if not isinstance(pod.get("spec"), dict):
        raise InputError(f"{what}: spec is missing or not a mapping")


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    """
    A deep copy of a Pod without what only the API server sets.
    """
    pod = copy.deepcopy(obj)
    pod.pop("status", None)
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = pod["metadata"] = {}
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    return pod


def _from_template(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    tmeta = copy.deepcopy(template.get("metadata") or {})
    meta: dict[str, Any] = {"namespace": namespace}
    for key in ("labels", "annotations", "finalizers"):
        if tmeta.get(key):
            meta[key] = tmeta[key]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}


def _job_pod(template: dict[str, Any], job: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """
    The Pod of a Job: the labels the API server puts on the Job's template
    (unless the Job picks its own selector), C{generateName}, the
    tracking finalizer, the completion index of an Indexed Job.
    """
    pod = _from_template(template, namespace)
    meta = pod["metadata"]
    labels = meta.setdefault("labels", {})
    uid = _uid(namespace, "Job", job)
    if not spec.get("manualSelector"):
        labels.setdefault("batch.kubernetes.io/controller-uid", uid)
        labels.setdefault("batch.kubernetes.io/job-name", job)
        labels.setdefault("controller-uid", uid)
        labels.setdefault("job-name", job)
    meta["generateName"] = f"{job}-"
    finalizers = meta.setdefault("finalizers", [])
    if "batch.kubernetes.io/job-tracking" not in finalizers:
        finalizers.append("batch.kubernetes.io/job-tracking")
    if spec.get("completionMode") == "Indexed":
        meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = "0"
        labels["batch.kubernetes.io/job-completion-index"] = "0"
    _owner(meta, "batch/v1", "Job", job, namespace)
    return pod


def _owner(meta: dict[str, Any], api_version: str, kind: str, name: str, namespace: str) -> None:
    meta["ownerReferences"] = [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": _uid(namespace, kind, name),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _uid(namespace: str, kind: str, name: str) -> str:
    """
    A uid of the right form, the same for the same object on every run.
    """
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"amp-explain:{namespace}/{kind}/{name}"))


def _hash(template: dict[str, Any]) -> str:
    """
    A template hash in the form of Kubernetes' C{ComputeHash}: FNV-1a (32
    bit) of the template, its decimal digits through C{SafeEncodeString}.
    """
    h = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True, separators=(",", ":")).encode("utf-8"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(h))


def _claim_volumes(spec: dict[str, Any], claims: Any, sts: str, pod_name: str, source: str) -> None:
    """
    The StatefulSet controller's volume per claim template,
    C{<claim>-<pod name>}, replacing a template volume of the same name.
    """
    if not claims:
        return
    if not isinstance(claims, list):
        raise InputError(f"{source}: spec.volumeClaimTemplates is not a list")
    volumes = spec.get("volumes") or []
    for i, claim in enumerate(claims):
        cname = claim.get("metadata", {}).get("name") if isinstance(claim, dict) else None
        if not isinstance(cname, str) or not cname:
            raise InputError(f"{source}: spec.volumeClaimTemplates[{i}] has no metadata.name")
        volumes = [v for v in volumes if not (isinstance(v, dict) and v.get("name") == cname)]
        volumes.append({"name": cname, "persistentVolumeClaim": {"claimName": f"{cname}-{pod_name}"}})
    spec["volumes"] = volumes


def _daemon_tolerations(spec: dict[str, Any]) -> None:
    tolerations = spec.get("tolerations") or []
    wanted = list(_DAEMON_TOLERATIONS)
    if spec.get("hostNetwork"):
        wanted.append(("node.kubernetes.io/network-unavailable", "NoSchedule"))
    have = {(t.get("key"), t.get("effect")) for t in tolerations if isinstance(t, dict)}
    for key, effect in wanted:
        if (key, effect) not in have:
            tolerations.append({"key": key, "operator": "Exists", "effect": effect})
    spec["tolerations"] = tolerations


def without_stamps(pod: Optional[dict[str, Any]], stamps: Any) -> Optional[dict[str, Any]]:
    """
    C{pod} without the annotations named in C{stamps} (amp's status stamps,
    which every review rewrites), for comparing two reviews' Pods.
    """
    if pod is None:
        return None
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return pod
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict) or not any(k in annotations for k in stamps):
        return pod
    kept = {k: v for k, v in annotations.items() if k not in stamps}
    meta = dict(meta)
    if kept:
        meta["annotations"] = kept
    else:
        meta.pop("annotations", None)
    return {**pod, "metadata": meta}
