"""
What a traced review's spans say (L{amp.tracing}): the route's, and an
endpoint call's as it begins and ends (pure).
"""

from __future__ import annotations

from typing import Any, Optional

from amp.endpoint import Call
from amp.policy import Route
from amp.urls import shown_url


def route_attributes(r: Route) -> dict[str, Any]:
    """What a traced review's route span says: enabled, the chain's length, the failure policy and mode."""
    return {
        "amp.enabled": r.enabled,
        "amp.chain.length": len(r.steps),
        "amp.failure_policy": str(r.failure_policy),
        "amp.mode": str(r.mode),
    }


def call_attributes(step: Any, index: int) -> dict[str, Any]:
    """
    An endpoint call's span attributes as it begins (the semantic
    conventions' HTTP client ones and amp's), the URL shown as amp shows
    every URL: never its query, user information or fragment.
    """
    url = step.url
    shown = shown_url(url)
    return {
        "http.request.method": "POST",
        "url.full": shown,
        "server.address": url.host,
        "server.port": url.port,
        "amp.endpoint": shown,
        "amp.chain.position": index + 1,
    }


def call_ended_attributes(call: Optional[Call]) -> dict[str, Any]:
    """What a traced call's span learns at its end: its connection's reuse and the request's resends."""
    attributes: dict[str, Any] = {}
    exchange = call.exchange if call is not None else None
    if exchange is not None:
        attributes["amp.connection"] = "reused" if exchange.reused else "new"
        if exchange.resends:
            attributes["http.request.resend_count"] = exchange.resends
    return attributes
