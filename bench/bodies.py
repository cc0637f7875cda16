"""
Request bodies for the benchmark: real AdmissionReview v1 requests for Pod
creation, of a typical Pod (about 4 KiB of JSON) and of a large Pod (about
60 KiB: many containers, many env vars), and the bare Pods that amp forwards
to an endpoint (what mode (a) sends to the endpoint directly).

Everything is deterministic: the same call writes the same bytes, so two runs
of the benchmark send identical requests.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: Label the endpoint's fixed patch adds; every generated Pod has labels, so
#: the patch applies without repair.
PATCH_LABEL = "amp.bench/patched"

TYPICAL_TARGET = 4 * 1024
LARGE_TARGET = 60 * 1024

_UID = "9b1c2d3e-4f50-4a6b-8c7d-0e1f2a3b4c5d"


def _container(name: str, image: str, env_count: int, index: int) -> dict[str, Any]:
    env = [
        {
            "name": f"{name.upper().replace('-', '_')}_SETTING_{i:03d}",
            "value": f"value-{index}-{i:03d}-abcdefghijklmnopqrstuvwxyz",
        }
        for i in range(env_count)
    ]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}})
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}})
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", "--log-format=json", f"--instance={index}"],
        "ports": [{"name": "http", "containerPort": 8080 + index, "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {
                "name": "kube-api-access-x7k2p",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": 8080 + index, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": 8080 + index, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def make_pod(containers: int, env_count: int, namespace: str) -> dict[str, Any]:
    """
    A Pod as a Deployment's ReplicaSet creates it (no name yet, defaults
    filled in by the API server), with C{containers} containers of
    C{env_count} env vars each.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "checkout-api-7d9f8b6c5-",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "checkout-api",
                "app.kubernetes.io/part-of": "shop",
                "pod-template-hash": "7d9f8b6c5",
                "team": "payments",
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2024-05-01T10:00:00Z",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "checkout-api-7d9f8b6c5",
                    "uid": "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                _container(f"app-{i}" if i else "app", f"registry.example.com/shop/checkout:{i}.4.2", env_count, i)
                for i in range(containers)
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "checkout-api-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "checkout-api",
            "serviceAccount": "checkout-api",
            "securityContext": {"runAsUser": 10001, "fsGroup": 10001},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def make_review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """
    The AdmissionReview the API server sends for creating C{pod}.
    """
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": _UID,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "0a1b2c3d-4e5f-4061-8293-a4b5c6d7e8f9",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def managed_fields(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """
    The C{metadata.managedFields} an API server puts in C{pod} before
    admission when a ReplicaSet's controller creates it (the fields the
    controller set, as FieldsV1): what a real review's Pod carries and the
    benchmark's bodies otherwise leave out.
    """

    def keys(values: Any) -> dict[str, Any]:
        return {".": {}, **{f"f:{key}": {} for key in values}}

    def env(var: dict[str, Any]) -> dict[str, Any]:
        source = {"f:value": {}} if "value" in var else {"f:valueFrom": {".": {}, "f:fieldRef": {}}}
        return {".": {}, "f:name": {}, **source}

    containers = {}
    for c in pod["spec"]["containers"]:
        containers[f'k:{{"name":"{c["name"]}"}}'] = {
            ".": {},
            "f:args": {},
            "f:image": {},
            "f:imagePullPolicy": {},
            "f:name": {},
            "f:env": {".": {}, **{f'k:{{"name":"{v["name"]}"}}': env(v) for v in c["env"]}},
            "f:ports": {
                ".": {},
                **{
                    f'k:{{"containerPort":{p["containerPort"]},"protocol":"TCP"}}': {
                        ".": {},
                        "f:containerPort": {},
                        "f:name": {},
                        "f:protocol": {},
                    }
                    for p in c["ports"]
                },
            },
            "f:resources": {
                ".": {},
                "f:limits": keys(c["resources"]["limits"]),
                "f:requests": keys(c["resources"]["requests"]),
            },
            "f:terminationMessagePath": {},
            "f:terminationMessagePolicy": {},
        }
    metadata = pod["metadata"]
    owner = metadata["ownerReferences"][0]["uid"]
    fields = {
        "f:metadata": {
            "f:generateName": {},
            "f:labels": keys(metadata["labels"]),
            "f:annotations": keys(metadata["annotations"]),
            "f:ownerReferences": {".": {}, f'k:{{"uid":"{owner}"}}': {}},
        },
        "f:spec": {
            "f:containers": containers,
            "f:dnsPolicy": {},
            "f:enableServiceLinks": {},
            "f:restartPolicy": {},
            "f:schedulerName": {},
            "f:securityContext": {".": {}, "f:fsGroup": {}, "f:runAsUser": {}},
            "f:serviceAccount": {},
            "f:serviceAccountName": {},
            "f:terminationGracePeriodSeconds": {},
            "f:volumes": {
                ".": {},
                'k:{"name":"config"}': {
                    ".": {},
                    "f:configMap": {".": {}, "f:defaultMode": {}, "f:name": {}},
                    "f:name": {},
                },
            },
        },
    }
    return [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2024-05-01T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
    ]


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def _sized(containers: int, target: int, namespace: str) -> dict[str, Any]:
    """
    The review with C{containers} containers whose env var count brings the
    body closest to C{target} bytes without going over.
    """
    best = None
    for env_count in range(0, 400):
        review = make_review(make_pod(containers, env_count, namespace), namespace)
        if len(_encode(review)) > target:
            break
        best = review
    if best is None:
        raise ValueError(f"{containers} containers are already over {target} bytes")
    return best


BODIES = {
    # name: (containers, target bytes of the AdmissionReview)
    "typical": (1, TYPICAL_TARGET),
    "large": (12, LARGE_TARGET),
}


def review_body(body: str, namespace: str, managed: bool = False) -> bytes:
    """
    The AdmissionReview of body C{body} (C{typical} or C{large}) for a Pod in
    C{namespace}, as bytes; with C{managed}, the same Pod with the
    managedFields a real API server adds (L{managed_fields}: larger than the
    body's nominal size).
    """
    containers, target = BODIES[body]
    review = _sized(containers, target, namespace)
    if managed:
        review["request"]["object"]["metadata"]["managedFields"] = managed_fields(review["request"]["object"])
    return _encode(review)


def pod_body(body: str, namespace: str) -> bytes:
    """
    The Pod alone, as amp forwards it to the endpoint.
    """
    containers, target = BODIES[body]
    return _encode(_sized(containers, target, namespace)["request"]["object"])


def write_bodies(directory: str, namespaces: dict[str, str]) -> dict[str, str]:
    """
    Write every body into C{directory}: C{<body>-pod.json} (the bare Pod)
    and C{<body>-<key>.json} for each C{key: namespace} in C{namespaces}.
    Returns the paths keyed by file stem.
    """
    os.makedirs(directory, exist_ok=True)
    paths: dict[str, str] = {}
    for body in BODIES:
        files = {f"{body}-pod": pod_body(body, next(iter(namespaces.values())))}
        for key, namespace in namespaces.items():
            files[f"{body}-{key}"] = review_body(body, namespace)
        for stem, data in files.items():
            path = os.path.join(directory, f"{stem}.json")
            with open(path, "wb") as f:
                f.write(data)
            paths[stem] = path
    return paths


if __name__ == "__main__":
    for name in BODIES:
        print(name, len(review_body(name, "bench-on")), "bytes")
