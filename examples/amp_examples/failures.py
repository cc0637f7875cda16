"""
Endpoints that misbehave on purpose, to see what amp does when an endpoint
denies, breaks or stalls (``make demo``, the tests, and your own trials of a
failure policy):

=====================  ======================================================
``/deny``              object form, always ``allowed: false`` (403)
``/validate-labels``   object form, deny a Pod without an ``app`` label
``/noop``              ``[]``
``/bad-patch``         a valid JSON Patch that cannot apply (``apply-failed``)
``/error``             HTTP 500 (``http-5xx``)
``/garbage``           HTTP 200 with a body that is not JSON (``invalid-json``)
``/hang``              never answers (``timeout``)
=====================  ======================================================

Run them alone: ``python -m amp_examples.failures --port 8090``.
"""

from __future__ import annotations

from typing import Any, Mapping

from twisted.internet import defer
from twisted.web import http

from amp_examples import serving
from amp_examples.patching import PatchOp, labels

DENY_MESSAGE = "denied by example policy"
REQUIRED_LABEL = "app"
GARBAGE = b"<html>this is not a JSON patch</html>"


def deny(message: str, code: int = 403) -> dict[str, Any]:
    """Object form of a denial."""
    return {"allowed": False, "status": {"code": code, "message": message}}


def deny_reply() -> dict[str, Any]:
    """``/deny``: always deny."""
    return deny(DENY_MESSAGE)


def bad_patch() -> list[PatchOp]:
    """``/bad-patch``: valid JSON Patch that cannot apply to any Pod (removes a missing member)."""
    return [{"op": "remove", "path": "/spec/ampExampleDoesNotExist"}]


def validate_labels_reply(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``/validate-labels``: deny a Pod without an ``app`` label; otherwise allow unchanged."""
    if REQUIRED_LABEL not in labels(pod):
        return deny(f"pod has no {REQUIRED_LABEL} label")
    return {"patch": [], "allowed": True}


class Hang:
    """
    ``/hang``: a reply that never comes. ``pending`` holds the calls still
    waiting; one leaves it when amp gives up and hangs up (the serving layer
    cancels its Deferred), so nothing piles up.
    """

    def __init__(self) -> None:
        self.pending: set[defer.Deferred[Any]] = set()

    def __call__(self, pod: serving.Pod, call: serving.Call) -> "defer.Deferred[Any]":
        d: defer.Deferred[Any] = defer.Deferred(self.pending.discard)
        self.pending.add(d)
        return d


class Options(serving.Options):
    longdesc = "Serve the failure-mode endpoints: /deny, /validate-labels, /noop, /bad-patch, /error, /garbage, /hang."


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    return {
        "deny": lambda pod, call: deny_reply(),
        "validate-labels": lambda pod, call: validate_labels_reply(pod),
        "noop": lambda pod, call: [],
        "bad-patch": lambda pod, call: bad_patch(),
        "error": lambda pod, call: serving.Answer(http.INTERNAL_SERVER_ERROR, b'{"error":"example failure"}', "error"),
        "garbage": lambda pod, call: serving.Answer(http.OK, GARBAGE, "garbage"),
        "hang": Hang(),
    }


if __name__ == "__main__":
    serving.main(Options, endpoints)
