"""
JSON Patch (RFC 6902) checks for the patches that custom endpoints return (pure).

This module owns everything amp does to an endpoint's patch before it goes
back to the API server:

  - validation of the operations (shape, JSON pointers, JSON values);
  - refusal of operations that would change a denied path (C{patch.denied_paths},
    with C{patch.allowed_paths} as exceptions);
  - a dry-apply to the Pod, operation by operation, with the RFC 6902
    semantics the API server applies, only stricter where the two differ;
  - repair: an C{add} whose parent does not exist (C{/spec/volumes/-} on a Pod
    without volumes) gets the C{add} operations that create the missing
    parents inserted before it;
  - a structural sanity check of the patched Pod, so that a patch which would
    make the Pod undecodable or invalid is blamed on the endpoint here rather
    than rejected by the API server whatever the failure policy;
  - composition of a chain (L{compose}): each endpoint's checked patch was
    made for the Pod as the previous ones left it; their concatenation,
    checked and dry-applied again as a whole against the Pod as it came, is
    the one patch the API server applies, and equals applying each in turn.

The API server rejects the whole request, whatever the failure policy, when a
patch decodes but fails to apply; L{check_patch} therefore either returns a
patch that applies to the Pod or raises L{PatchError}.

The dry-apply copies on write: only the containers along the changed paths are
copied, so the caller's Pod is never mutated and the patched Pod shares all
unchanged parts with it (treat L{CheckedPatch.pod} as read-only).
"""

from amp.patch._check import DEFAULT_DENIED, CheckedPatch, check_patch, unchanged
from amp.patch._compose import annotate, annotation_ops, compose
from amp.patch._ops import PatchError
from amp.pointer import escape_pointer_token, parse_pointer

__all__ = [
    "DEFAULT_DENIED",
    "PatchError",
    "CheckedPatch",
    "check_patch",
    "compose",
    "unchanged",
    "annotation_ops",
    "annotate",
    "escape_pointer_token",
    "parse_pointer",
]
