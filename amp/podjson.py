"""
A Pod as the webhook's hot path holds it (pure): a dict of its top-level
members, C{metadata} decoded and every other member (C{spec}, C{status})
kept as its raw JSON (C{msgspec.Raw}) until something reads it.

Most patches change only labels and annotations, and the Pod goes to the
endpoint as JSON anyway: decoding all of a Pod to Python objects was the
largest single cost of a review (a quarter of a 60 KiB Pod's review in
memory, and more under load, where every decoded object is fresh memory;
bench/README.md, "Figures behind the code").  A raw
member costs a skip over its bytes, which L{amp.admission_review} validated already
(UTF-8, nesting, JSON syntax); its numbers are checked when it is read.

One part of the metadata may be raw too: C{metadata.managedFields}
(L{RAW_IN_METADATA}), which an API server fills in before admission (a
kilobyte or more of nested JSON for a controller's Pod) and which neither
amp nor a patch normally reads.

This module owns reading such a member: L{member} decodes it on first use
and keeps the decoded value in the Pod's dict (the same JSON, so the Pod
is unchanged as a document), L{read} does so for any container holding
one (the metadata's); L{whole} decodes them all.  The raw value is
encoded back as it came (C{msgspec.json.encode} writes a C{Raw} as its
bytes), so a Pod that still holds raw members is forwarded and patched
without ever decoding them.  Code that walks a Pod beyond its metadata
goes through these functions: the patch's dry-apply (L{amp.patch}), its
Pod checks and the comparison of two Pods (L{amp.record}).
"""

from __future__ import annotations

from typing import Any

import msgspec

from amp.admission_review import RAW_IN_METADATA, decode_bounded, long_digits

__all__ = ["MemberError", "RAW", "RAW_IN_METADATA", "decoded", "json_object", "member", "read", "read_all", "whole"]

#: The type of a member kept as raw JSON.
RAW = msgspec.Raw

_decode = msgspec.json.Decoder().decode


class MemberError(ValueError):
    """
    A raw member that does not decode: only a number out of range gets
    this far (an integer past 64 bits or a float past a double, which
    skipping over it does not check and an API server never sends).
    """


def json_object(value: object) -> dict[str, Any]:
    """
    C{value} when it is a JSON object (a dict), else an empty one: an
    optional member (C{metadata}, C{status}) read without a check at every
    use.
    """
    return value if isinstance(value, dict) else {}


def member(pod: dict[str, Any], key: str, default: Any = None) -> Any:
    """
    C{pod[key]} decoded (C{default} when absent); a raw member is decoded
    once and kept decoded in C{pod}.

    @raise MemberError: the raw member does not decode, with the reason.
    """
    value = pod.get(key, default)
    if type(value) is RAW:
        value = pod[key] = decoded(value, key)
    return value


def read(container: Any, key: Any, where: str) -> Any:
    """
    C{container[key]}, decoded and kept decoded in C{container} when it is
    raw; C{where} names it in the error (C{metadata.managedFields}).

    @raise MemberError: the raw value does not decode, with the reason.
    """
    value = container[key]
    if type(value) is RAW:
        value = container[key] = decoded(value, where)
    return value


def read_all(container: dict[str, Any], where: str = "") -> dict[str, Any]:
    """
    C{container} with its raw members decoded in place (the Pod's, or the
    metadata's when the metadata itself is read as a value); C{where} is
    its name (none for the Pod).

    @raise MemberError: a raw member does not decode.
    """
    for key, value in container.items():
        if type(value) is RAW:
            read(container, key, f"{where}.{key}" if where else key)
    return container


def decoded(value: RAW, where: str) -> Any:
    """
    The raw JSON C{value} decoded, as an API server reads it; C{where}
    names it in the error.

    @raise MemberError: it does not decode, with the reason.
    """
    try:
        if long_digits(value):
            # An integer msgspec would read past 64 bits: the careful
            # decoder reads it as an API server would, or names it.
            return decode_bounded(bytes(value).decode("utf-8"))
        return _decode(value)
    except (ValueError, RecursionError) as e:
        raise MemberError(f"the Pod's {where} cannot be read: {e}") from None


def whole(pod: Any) -> Any:
    """
    C{pod} with every raw member decoded (in place); anything that is not
    a dict is returned as it is.

    @raise MemberError: a raw member does not decode.
    """
    if type(pod) is dict:
        read_all(pod)
        metadata = pod.get("metadata")
        if type(metadata) is dict:
            read_all(metadata, "metadata")
    return pod
