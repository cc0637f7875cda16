"""
The summary of py-spy's collapsed stacks for C{bench/run --profile}: the
functions that cost most (own and total time) and the breakdown of a
review's time by subsystem (L{BREAKDOWN}).
"""

from __future__ import annotations

import os
import re
from typing import Any

from bench.harness import REPO


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    return path


_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")


def _frame_key(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m.group(1)} ({_short(m.group(2))})"


#: Where the time goes, by subsystem: a stack counts for a row when any of
#: its frames matches (so rows overlap, and are inclusive of callees).  Each
#: row lists the functions of amp's its pattern stands for (C{module:qualname}),
#: which the tests find on a typical review's path: a function renamed, or
#: taken off the path, fails them instead of leaving a row that reads 0%.
BREAKDOWN: tuple[tuple[str, "re.Pattern[str]", tuple[str, ...]], ...] = (
    ("TLS record layer (pyOpenSSL)", re.compile(r"\(OpenSSL/"), ()),
    (
        "the webhook's HTTP parsing (amp.http's llhttp callbacks; amp/http/ in the own time per file has the rest)",
        re.compile(r"^HTTPServerProtocol\.(on_\w+|_check_partial_head) "),
        ("amp.http._server:HTTPServerProtocol.on_header",),
    ),
    (
        "AdmissionReview parsing (amp.admission_review.parse_review)",
        re.compile(r"^parse_review \(amp/"),
        ("amp.admission_review:parse_review",),
    ),
    (
        "JSON decoding (msgspec, or json.loads on the careful path)",
        re.compile(r"\(json/decoder\.py|^_decode_fast \(amp/|^_decode \(amp/reply"),
        ("amp.admission_review:_decode_fast", "amp.reply:_decode"),
    ),
    (
        "the depth scan (amp.admission_review.nesting_exceeds, of the review and of the reply)",
        re.compile(r"^nesting_exceeds \(amp/"),
        ("amp.admission_review:nesting_exceeds",),
    ),
    (
        "endpoint call set-up (amp.endpoint.EndpointClient.call)",
        re.compile(r"^EndpointClient\.call "),
        ("amp.endpoint._client:EndpointClient.call",),
    ),
    (
        "the endpoint's reply read (amp.http's client llhttp callbacks and head count)",
        re.compile(r"^(ClientConnection\.on_\w+|HeadCounter\.count) "),
        ("amp.http._client:ClientConnection.on_header", "amp.http._replyhead:HeadCounter.count"),
    ),
    ("patch checks (amp.patch.check_patch)", re.compile(r"^check_patch \(amp/"), ("amp.patch._check:check_patch",)),
    (
        "the answer with its stamp (amp.admission's Answering.chain_done)",
        re.compile(r"^Answering\.chain_done "),
        ("amp.admission._answering:Answering.chain_done",),
    ),
    (
        "JSON encoding (msgspec, json.dumps)",
        re.compile(r"\(json/encoder\.py|^encode_response \(amp/"),
        ("amp.admission_response:encode_response",),
    ),
    (
        "writing the answer (HTTPServerProtocol.respond)",
        re.compile(r"^HTTPServerProtocol\.respond "),
        ("amp.http._server:HTTPServerProtocol.respond",),
    ),
    (
        "accounting after the answer (ReviewHandler._account: log line, metrics, recent decisions)",
        re.compile(r"^ReviewHandler\._account "),
        ("amp.web:ReviewHandler._account",),
    ),
    ("per-review log line (Logger.info in ReviewHandler._account)", re.compile(r"^Logger\.(info|emit) "), ()),
    (
        "metrics (amp.metrics; prometheus_client off the hot path)",
        re.compile(r"\(amp/metrics\.py|\(prometheus_client/"),
        ("amp.metrics:Metrics.count_review",),
    ),
    (
        "timers (reactor.callLater / DelayedCall.cancel)",
        re.compile(r"^(ReactorBase\.callLater|DelayedCall\.cancel) "),
        (),
    ),
    ("socket send (Connection.writeSomeData)", re.compile(r"^Connection\.writeSomeData "), ()),
)


def _package(path: str) -> str:
    """
    C{twisted/web/http.py} -> C{twisted.web}; C{json/decoder.py} -> C{json};
    C{amp/web.py} -> C{amp}.
    """
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "twisted":
        return ".".join(parts[:2])
    if len(parts) > 1:
        return parts[0]
    return path.rsplit(".", 1)[0] or "?"


def summarise_collapsed(path: str, top_n: int = 15) -> dict[str, Any]:
    """
    Own and total time per function from collapsed stacks (py-spy's
    C{--format raw}: C{frame;frame;...;leaf COUNT} per line).
    """
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    parts = {label: 0 for label, _, _ in BREAKDOWN}
    files: dict[str, int] = {}
    packages: dict[str, int] = {}
    samples = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [_frame_key(x) for x in stack.split(";") if x and not x.startswith(("process ", "thread "))]
            if not frames:
                continue
            samples += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            leaf_file = _FRAME.match(frames[-1])
            leaf_file = leaf_file.group(2) if leaf_file else "?"
            files[leaf_file] = files.get(leaf_file, 0) + n
            package = _package(leaf_file)
            packages[package] = packages.get(package, 0) + n
            for key in set(frames):
                total[key] = total.get(key, 0) + n
            for label, pattern, _ in BREAKDOWN:
                if any(pattern.search(frame) for frame in frames):
                    parts[label] += n
    top = sorted(own.items(), key=lambda kv: kv[1], reverse=True)[:top_n]
    return {
        "samples": samples,
        "top": [
            {
                "function": k,
                "own_pct": round(100 * v / samples, 1) if samples else 0.0,
                "total_pct": round(100 * total[k] / samples, 1) if samples else 0.0,
            }
            for k, v in top
        ],
        "breakdown": [
            {"part": label, "total_pct": round(100 * v / samples, 1) if samples else 0.0}
            for label, v in sorted(parts.items(), key=lambda kv: kv[1], reverse=True)
        ],
        "own_by_package": [
            {"package": k, "own_pct": round(100 * v / samples, 1) if samples else 0.0}
            for k, v in sorted(packages.items(), key=lambda kv: kv[1], reverse=True)[:top_n]
        ],
        "own_by_file": [
            {"file": k, "own_pct": round(100 * v / samples, 1) if samples else 0.0}
            for k, v in sorted(files.items(), key=lambda kv: kv[1], reverse=True)[:top_n]
        ],
        "top_total": [
            {"function": k, "total_pct": round(100 * v / samples, 1) if samples else 0.0}
            for k, v in sorted(total.items(), key=lambda kv: kv[1], reverse=True)[:top_n]
        ],
    }
