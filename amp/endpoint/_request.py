"""
L{EndpointRequest}: what a caller asks the endpoint client for, as one
value (L{amp.endpoint.EndpointClient.call}).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from amp.config import BreakerConfig, EndpointSettings
from amp.deadline import Deadline
from amp.urls import EndpointURL


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one; one is made for
# every endpoint call, and nothing changes it once made.
@dataclass(slots=True)
class EndpointRequest:
    """
    One endpoint call as its caller asks for it.

    @ivar url: the endpoint.
    @ivar settings: the URL's endpoint settings (timeout, limits, bulkhead).
    @ivar body: the JSON POSTed (the Pod).
    @ivar headers: the request's own headers (the client adds the rest).
    @ivar deadline: the review's one deadline; the call gets what is left
        of it, and its caller's L{amp.waiting.Waiting} enforces it.
    @ivar breaker: the breaker settings of C{url}'s origin (those of its
        root URL, see L{amp.policy.Route.breaker}); None: C{settings.breaker}.
        The first call to an origin sets them.
    """

    url: EndpointURL
    settings: EndpointSettings
    body: bytes
    headers: dict[bytes, bytes]
    deadline: Deadline
    breaker: Optional[BreakerConfig] = None
