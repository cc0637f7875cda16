"""
A candidate version of the example sidecar injector, for the tests of
replay and the canary: the same injection, except that Pods labelled
C{track: canary} get the sidecar image C{CANDIDATE_IMAGE}, as a release
that changes an image tag for some workloads would.
"""

from __future__ import annotations

from typing import Any, Mapping

from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint

from amp_examples import serving
from amp_examples.sidecar import SIDECAR_IMAGE, sidecar_reply
from tests.support.helpers import ConnectionTracker, RunningExample

CANDIDATE_IMAGE = "envoyproxy/envoy:v1.28.0"


def candidate_reply(pod: Mapping[str, Any]) -> dict[str, Any]:
    """L{sidecar_reply}, with the candidate's image for Pods labelled C{track: canary}."""
    reply = sidecar_reply(pod)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get("track") == "canary":
        for op in reply["patch"]:
            value = op.get("value")
            if isinstance(value, dict) and value.get("image") == SIDECAR_IMAGE:
                value["image"] = CANDIDATE_IMAGE
    return reply


@inlineCallbacks
def start_live_and_candidate(test: Any, reactor: Any) -> Any:
    """
    The example endpoints (the live sidecar injector among them) and the
    candidate, each stopped when C{test} ends; resolves to C{(example, candidate)}.
    """
    from tests.support.helpers import start_example

    example = yield start_example(reactor)
    test.addCleanup(example.stop)
    candidate = yield start_candidate(reactor)
    test.addCleanup(candidate.stop)
    return example, candidate


@inlineCallbacks
def start_candidate(reactor: Any) -> Any:
    """The candidate at C{/sidecar} on 127.0.0.1 port 0; a L{RunningExample}."""
    root = serving.build_root({"sidecar": lambda pod, call: candidate_reply(pod)})
    site = serving.build_site(root, reactor=reactor)
    site.log = lambda request: None  # type: ignore[method-assign]
    tracker = ConnectionTracker(site, reactor)
    port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(tracker)
    return RunningExample(port, tracker, root)
