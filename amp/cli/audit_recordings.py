"""
Bare Pods' recorded reviews, for C{amp audit --recordings DIR} (blocking:
run in a thread).

A Pod without a controller has no template to review again; when amp
recorded its creation (L{amp.record}), the Pod the API server sent then is
what the endpoint would be given now.  L{bare_pod_reviews} reads a
recording directory's files once, line by line (a line over the
recording's limit is skipped), and keeps, for each namespace and Pod name,
the latest recorded Pod that has no controller: only those, so the index
stays small whatever the recordings hold.
"""

from __future__ import annotations

from typing import Any

from amp.cli.audit_owners import controller_of
from amp.cli.replay_run import read_recording
from amp.podjson import json_object
from amp.record import recording_files

__all__ = ["bare_pod_reviews"]


def bare_pod_reviews(directory: str) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """
    The latest recorded Pod of each bare Pod by (namespace, name), and
    one line per file or line that could not be used.
    """
    found: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    problems: list[str] = []
    try:
        paths = recording_files(directory)
    except OSError as e:
        return {}, [f"recordings {directory}: {e.strerror or e}"]
    for path in paths:
        try:
            stream = open(path, "rb")
        except OSError as e:
            problems.append(f"{path}: {e.strerror or e}")
            continue
        with stream:
            for recorded in read_recording(path, stream):
                if isinstance(recorded, Exception):
                    problems.append(str(recorded))
                    continue
                request = recorded.review.get("request") if isinstance(recorded.review, dict) else None
                pod = recorded.pod
                if not isinstance(request, dict) or request.get("operation") != "CREATE" or not isinstance(pod, dict):
                    continue
                meta = json_object(pod.get("metadata"))
                name = meta.get("name") or request.get("name")
                if not isinstance(name, str) or not name or controller_of(pod) is not None:
                    continue
                key = (recorded.namespace, name)
                if key not in found or found[key][0] <= recorded.time:
                    found[key] = (recorded.time, pod)
    return {key: pod for key, (_, pod) in found.items()}, problems
