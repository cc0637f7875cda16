"""
Redaction of recorded reviews (pure).

A recording holds Pod specs as the API server sent them; with
C{record.redact} on, the values most likely to be secrets are replaced
before a line is written: every container's C{env[].value} (init and
ephemeral containers included), every Pod annotation's value and every
namespace annotation's value, except amp's own annotations (C{amp.txn2.com/}
and the configured endpoint and policy keys), which replay needs to route
the review as amp did.

A redacted value becomes a marker, C{amp-redacted:<16 hex digits>}, an HMAC
of the value under a key of the recorder's: the same value gives the same
marker everywhere in one recording (in the request and in the patch the
endpoint answered with), so a replayed endpoint that copies a value sees
the marker and its answer compares equal to the recorded one, while the
marker does not reveal the value.  The key is random per amp process
(the recorder's, handed to each of its writer processes over their pipe)
and never written down.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["KeptAnnotations", "Redactor", "MARKER_PREFIX", "is_marker"]

#: What every redacted value starts with.
MARKER_PREFIX = "amp-redacted:"

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class KeptAnnotations:
    """
    The annotation keys whose values redaction keeps (amp's own): those
    starting with one of C{prefixes}, and C{names}.  Data, not a function,
    so that it reaches the writer process.
    """

    prefixes: tuple[str, ...] = ("amp.txn2.com/",)
    names: frozenset[str] = frozenset()

    def __call__(self, key: str) -> bool:
        return key.startswith(self.prefixes) or key in self.names


def is_marker(value: Any) -> bool:
    """Whether C{value} is a redaction marker."""
    return isinstance(value, str) and value.startswith(MARKER_PREFIX)


class Redactor:
    """
    Replaces secret-looking values by stable markers.

    @param keep_annotation: annotation keys whose values are kept (amp's
        own); by default those under C{amp.txn2.com/}.
    @param key: the HMAC key; random when not given.
    """

    def __init__(self, keep_annotation: Optional[Callable[[str], bool]] = None, key: Optional[bytes] = None) -> None:
        self._key = key if key is not None else os.urandom(32)
        self._keep = keep_annotation or (lambda name: name.startswith("amp.txn2.com/"))

    def marker(self, value: Any) -> Any:
        """The marker of C{value} (a string); other JSON values are kept."""
        if not isinstance(value, str) or is_marker(value):
            return value
        digest = hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return MARKER_PREFIX + digest[:16]

    def annotations(self, annotations: Any) -> Any:
        """A copy of C{annotations} with every value not amp's own redacted."""
        if not isinstance(annotations, dict):
            return annotations
        return {k: (v if self._keep(str(k)) else self.marker(v)) for k, v in annotations.items()}

    def _env(self, env: Any) -> Any:
        if not isinstance(env, list):
            return env
        return [self._env_var(var) for var in env]

    def _env_var(self, var: Any) -> Any:
        if isinstance(var, dict) and "value" in var:
            var = dict(var)
            var["value"] = self.marker(var["value"])
        return var

    def _container(self, container: Any) -> Any:
        if isinstance(container, dict) and "env" in container:
            container = dict(container)
            container["env"] = self._env(container["env"])
        return container

    def pod(self, pod: Any) -> Any:
        """A copy of C{pod} with env values and annotation values redacted."""
        if not isinstance(pod, dict):
            return pod
        out = dict(pod)
        metadata = out.get("metadata")
        if isinstance(metadata, dict) and "annotations" in metadata:
            metadata = dict(metadata)
            metadata["annotations"] = self.annotations(metadata["annotations"])
            out["metadata"] = metadata
        spec = out.get("spec")
        if isinstance(spec, dict):
            spec = dict(spec)
            for name in _CONTAINER_LISTS:
                if isinstance(spec.get(name), list):
                    spec[name] = [self._container(c) for c in spec[name]]
            out["spec"] = spec
        return out

    def patch(self, operations: Any) -> Any:
        """
        A copy of a JSON Patch with the values it writes into env vars or
        annotations redacted, so that it stays the patch of the redacted Pod.
        """
        if not isinstance(operations, list):
            return operations
        return [self._operation(op) for op in operations]

    def _operation(self, op: Any) -> Any:
        if not isinstance(op, dict) or "value" not in op or not isinstance(op.get("path"), str):
            return op
        tokens = op["path"].split("/")[1:]
        value = op["value"]
        if not tokens:
            value = self.pod(value)  # the whole Pod
        elif tokens[:2] == ["metadata", "annotations"]:
            if len(tokens) == 2:
                value = self.annotations(value)
            elif not self._keep(tokens[2].replace("~1", "/").replace("~0", "~")):
                value = self.marker(value)
        elif "env" in tokens:
            at = tokens.index("env")
            rest = tokens[at + 1 :]
            if not rest:
                value = self._env(value)
            elif len(rest) == 1:
                value = self._env_var(value)
            elif rest[1:] == ["value"]:
                value = self.marker(value)
        elif tokens and tokens[-1] in _CONTAINER_LISTS or (len(tokens) >= 2 and tokens[-2] in _CONTAINER_LISTS):
            value = [self._container(c) for c in value] if isinstance(value, list) else self._container(value)
        elif tokens == ["metadata"] and isinstance(value, dict) and "annotations" in value:
            value = dict(value, annotations=self.annotations(value["annotations"]))
        elif tokens == ["spec"]:
            value = self.pod({"spec": value}).get("spec", value)
        if value is op["value"]:
            return op
        return dict(op, value=value)
