"""
A Pod as the webhook's hot path holds it (pure): a dict of its top-level
members, C{metadata} decoded and every other member (C{spec}, C{status})
kept as its raw JSON (C{msgspec.Raw}) until something reads it.

Most patches change only labels and annotations, and the Pod goes to the
endpoint as JSON anyway: decoding all of a Pod to Python objects was the
largest single cost of a review (a 60 KiB Pod: 160 us of 600 in memory,
and more under load, where every decoded object is fresh memory).  A raw
member costs a skip over its bytes, which L{amp.review} validated already
(UTF-8, nesting, JSON syntax); its numbers are checked when it is read.

This module owns reading such a member: L{member} decodes it on first use
and keeps the decoded value in the Pod's dict (the same JSON, so the Pod
is unchanged as a document); L{whole} decodes them all.  The raw value is
encoded back as it came (C{msgspec.json.encode} writes a C{Raw} as its
bytes), so a Pod that still holds raw members is forwarded and patched
without ever decoding them.  Code that walks a Pod beyond its metadata
goes through these functions: the patch's dry-apply (L{amp.patch}), its
Pod checks and the comparison of two Pods (L{amp.record}).
"""

from __future__ import annotations

from typing import Any

import msgspec

from amp.review import decode_bounded, long_digits

__all__ = ["MemberError", "RAW", "member", "whole"]

#: The type of a member kept as raw JSON.
RAW = msgspec.Raw

_decode = msgspec.json.Decoder().decode


class MemberError(ValueError):
    """
    A raw member that does not decode: only a number out of range gets
    this far (an integer past 64 bits or a float past a double, which
    skipping over it does not check and an API server never sends).
    """


def member(pod: dict, key: str, default: Any = None) -> Any:
    """
    C{pod[key]} decoded (C{default} when absent); a raw member is decoded
    once and kept decoded in C{pod}.

    @raise MemberError: the raw member does not decode, with the reason.
    """
    value = pod.get(key, default)
    if type(value) is RAW:
        try:
            if long_digits(value):
                # An integer msgspec would read past 64 bits: the careful
                # decoder reads it as an API server would, or names it.
                value = decode_bounded(bytes(value).decode("utf-8"))
            else:
                value = _decode(value)
        except (ValueError, RecursionError) as e:
            raise MemberError(f"the Pod's {key} cannot be read: {e}") from None
        pod[key] = value
    return value


def whole(pod: Any) -> Any:
    """
    C{pod} with every raw member decoded (in place); anything that is not
    a dict is returned as it is.

    @raise MemberError: a raw member does not decode.
    """
    if type(pod) is dict:
        for key, value in pod.items():
            if type(value) is RAW:
                member(pod, key)
    return pod
