"""
The benchmark's answer checks: L{post_review} sends amp (or a floor proxy)
one review and L{check_answer} judges the answer a mode must give, raising
L{ModeFailed}; L{EXPECTED_RESULT} is the C{result} label each mode's
reviews must be counted under.  L{bench.harness} re-exports them.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from typing import Any

from bench import bodies


class ModeFailed(Exception):
    pass


def post_review(port: int, ca: str, body_file: str, who: str) -> dict[str, Any]:
    """
    POST one review to C{https://127.0.0.1:port/mutate} (trusting C{ca});
    the decoded C{response} of the answer.
    """
    with open(body_file, "rb") as f:
        data = f.read()
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    try:
        conn.request("POST", "/mutate?timeout=10s", body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ModeFailed(f"{who} answered HTTP {resp.status}: {text[:300]!r}")
    return json.loads(text)["response"]


def _patch_of(response: dict[str, Any]) -> list[Any]:
    if "patch" not in response:
        return []
    return json.loads(base64.b64decode(response["patch"]))


def check_answer(mode: str, response: dict[str, Any]) -> None:
    """
    The answer a mode must give: (b), (c), (t), (u) and the floors (f),
    (g) the patch, (d) an unchanged Pod.
    """
    label_path = "/metadata/labels/" + bodies.PATCH_LABEL.replace("/", "~1")
    if not response.get("allowed"):
        raise ModeFailed(f"mode ({mode}): amp denied the Pod: {response.get('status')}")
    patch = _patch_of(response)
    if mode in ("b", "c", "f", "g", "t", "u"):
        if not any(op.get("path") == label_path for op in patch) or response.get("warnings"):
            raise ModeFailed(
                f"mode ({mode}): expected the endpoint's patch, got {patch} with warnings {response.get('warnings')}"
            )
    elif patch:
        raise ModeFailed(f"mode ({mode}): expected no patch for a namespace that is not enabled, got {patch}")


EXPECTED_RESULT = {
    "b": "result=patched",
    "c": "result=patched",
    "d": "result=skipped",
    "t": "result=patched",
    "u": "result=patched",
}
