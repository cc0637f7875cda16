"""
Matching what was injected with what amp did: the three records of every
review (the chaos endpoint's call log, amp's own log line, the load
generator's record of the answer it got) and amp's endpoint counters.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bench.chaos_endpoint import EXPECTED_OUTCOMES, KINDS
from bench.soak.settings import LOG_PROBLEMS, REVIEW_REASONS


def outcome_keys(kinds: list[str]) -> dict[str, str]:
    """
    Each kind's row in the per-origin reconciliation: the outcomes amp may
    count for it, joined by C{+}.  Of the C{kinds} injected in a run, those
    whose outcomes overlap (a hang, a drip and a header flood may all end in
    C{timeout}) share one row, the union of their outcomes, so that every
    counted call lands in exactly one row.
    """
    groups: list[tuple[list[str], list[str]]] = []  # (kinds, outcomes in first-seen order)
    for kind in kinds:
        outcomes = list(EXPECTED_OUTCOMES[kind])
        kinds = [kind]
        for group in [g for g in groups if set(g[1]) & set(outcomes)]:
            groups.remove(group)
            kinds = group[0] + kinds
            outcomes = group[1] + [o for o in outcomes if o not in group[1]]
        groups.append((kinds, outcomes))
    return {kind: "+".join(outcomes) for kinds, outcomes in groups for kind in kinds}


#: The kinds a call of which amp ends with its own timeout.
#: What amp's bulkhead refuses a review with (its queue full, or the wait too long).
BULKHEAD_REASONS = ("queue-full", "queue-timeout")
ENDS_IN_TIMEOUT = frozenset(kind for kind in KINDS if "timeout" in EXPECTED_OUTCOMES[kind])


def read_records(path: str) -> dict[str, dict[str, Any]]:
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out[r["uid"]] = r
    return out


def read_chaos_log(path: str) -> tuple[dict[str, tuple[str, str]], int]:
    calls: dict[str, tuple[str, str]] = {}
    duplicates = 0
    with open(path) as f:
        for line in f:
            uid, port, kind = line.split()
            if uid in calls:
                duplicates += 1
            calls[uid] = (port, kind)
    return calls, duplicates


#: amp's line for one review (amp.web): uid, namespace/pod, result, (reason),
#: endpoint, patch size, amp's own time.
_REVIEW_LINE = re.compile(
    r"\] review (\S+) ([^/\s]+)/\S* (\w+)(?: \(([^)]*)\))? endpoint=\S+ patch=\d+B "
    r"in ([\d.]+)ms"
)


def scan_log(path: str) -> dict[str, Any]:
    """
    amp's log: lines that fail the soak (L{LOG_PROBLEMS}), warnings by kind,
    and amp's own account of every review (uid -> result, reason, time).
    """
    bad: list[str] = []
    n_bad = 0
    warns: dict[str, int] = {}
    lines = 0
    reviews: dict[str, tuple[str, str, str, float]] = {}
    with open(path, "rb") as f:
        for raw in f:
            lines += 1
            line = raw.decode("utf-8", "replace").rstrip()
            if any(p in line for p in LOG_PROBLEMS):
                n_bad += 1
                if len(bad) < 20:
                    bad.append(line[:400])
                continue
            m = _REVIEW_LINE.search(line)
            if m:
                reviews[m.group(1)] = (m.group(2), m.group(3), m.group(4) or "", float(m.group(5)))
            elif "#warn]" in line:
                text = line.split("#warn]", 1)[1].strip()
                key = re.sub(r"\d+(\.\d+)?", "N", text)[:90]
                warns[key] = warns.get(key, 0) + 1
    top = dict(sorted(warns.items(), key=lambda kv: -kv[1])[:12])
    return {"lines": lines, "problem_lines": n_bad, "problems": bad, "warnings": top, "reviews": reviews}


def reconcile(
    namespaces: list[dict[str, Any]],
    ports: dict[str, int],
    records: dict[str, dict[str, Any]],
    amp_reviews: dict[str, tuple[str, str, str, float]],
    calls: dict[str, tuple[str, str]],
    injected: dict[str, dict[str, int]],
    endpoint_metrics: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """
    Match what was injected with what amp did, for every review and in total.

    Three records of each review: the chaos endpoint's (uid -> what it did,
    from X-Amp-Uid), amp's (uid -> result and reason, from its log) and the
    client's (uid -> the answer it got).  For each review amp's reason must
    follow from what the endpoint did (L{REVIEW_REASONS}; a review that
    never reached the endpoint must say breaker-open) and the client must
    have got what amp says it answered.

    Deviations that only a slow endpoint or a slow amp can cause are told
    apart from miscounts and reported as C{endpoint_timing}: a call the
    endpoint answered (ok, error, ...) that amp ended with its timeout (the
    answer came too late), a call amp timed out before the endpoint had even
    read it, a review refused by amp's bulkhead (C{queue-full} or
    C{queue-timeout}: too many calls still in flight for too long), and a review amp cancelled because the
    client, tired of waiting, hung up.  On a machine that is not busy there
    are none.  Per origin, the chaos endpoint's counts, moved by those, must
    equal amp's C{amp_endpoint_requests_total} by outcome exactly, and amp's
    C{breaker-open} and bulkhead (C{queue-full} + C{queue-timeout}) counts must equal the reviews
    answered so.
    """
    by_ns = {ns["name"]: ns for ns in namespaces}
    problems: list[str] = []
    mismatches: list[str] = []
    n_mismatch = 0
    late: dict[str, dict[str, int]] = {port: {} for port in ports}
    unread: dict[str, int] = {port: 0 for port in ports}
    late_examples: list[str] = []
    breaker_open: dict[str, int] = {port: 0 for port in ports}
    bulkhead: dict[str, int] = {port: 0 for port in ports}
    timing_uids: list[str] = []
    gave_up: dict[str, int] = {port: 0 for port in ports}
    gone_unread: dict[str, int] = {port: 0 for port in ports}
    moved = 0
    matched = 0

    def mismatch(text: str) -> None:
        nonlocal n_mismatch
        n_mismatch += 1
        if len(mismatches) < 20:
            mismatches.append(text)

    for uid, (namespace, result, reason, amp_ms) in amp_reviews.items():
        ns = by_ns.get(namespace)
        if ns is None:
            mismatch(f"{uid}: amp reviewed a Pod in {namespace}, which the client never sent")
            continue
        call = calls.get(uid)
        said = f"{result} ({reason})" if reason else result
        if not ns["enabled"]:
            if result != "skipped" or call is not None:
                mismatch(f"{uid} ({namespace}): not enabled, amp said {said}, endpoint called: {call is not None}")
            continue
        if reason == "cancelled":
            # amp stops a review when the client hangs up; only the client's
            # own give-up (no answer within the timeout and a grace) does so.
            mine = records.get(uid) or {}
            if mine.get("out") != "violation" or not mine.get("late"):
                mismatch(f"{uid} ({namespace}): amp said {said} though the client waited for the answer")
                continue
            gave_up[ns["port"]] += 1
            timing_uids.append(uid)
            if call is None:
                gone_unread[ns["port"]] += 1
            elif call[1] not in ENDS_IN_TIMEOUT:
                late[call[0]][call[1]] = late[call[0]].get(call[1], 0) + 1
                moved += 1
            continue
        if call is None:
            if reason == "breaker-open":
                breaker_open[ns["port"]] += 1
            elif reason in BULKHEAD_REASONS:
                bulkhead[ns["port"]] += 1
                timing_uids.append(uid)
            elif reason in REVIEW_REASONS["hang"]:
                unread[ns["port"]] += 1
                timing_uids.append(uid)
                if len(late_examples) < 10:
                    late_examples.append(
                        f"{uid} ({namespace}): the endpoint never read the call, amp said {said} after {amp_ms}ms"
                    )
            else:
                mismatch(f"{uid} ({namespace}): never reached the endpoint, amp said {said}")
            continue
        matched += 1
        port, kind = call
        if port != ns["port"]:
            mismatch(f"{uid} ({namespace}): called port {port}")
        elif kind in ENDS_IN_TIMEOUT:
            if reason not in REVIEW_REASONS[kind]:
                mismatch(f"{uid} ({namespace}): endpoint {kind}, amp said {said}")
        elif reason in REVIEW_REASONS["hang"]:
            late[port][kind] = late[port].get(kind, 0) + 1
            timing_uids.append(uid)
            if len(late_examples) < 10:
                late_examples.append(f"{uid} ({namespace}): endpoint {kind}, amp said {said} after {amp_ms}ms")
        elif kind in ("ok", "delay"):
            if result != "patched":
                mismatch(f"{uid} ({namespace}): endpoint {kind}, amp said {said}")
        elif reason not in REVIEW_REASONS[kind]:
            mismatch(f"{uid} ({namespace}): endpoint {kind}, amp said {said}")
    for uid in calls:
        if uid not in amp_reviews:
            mismatch(f"{uid}: the endpoint was called for a review amp did not log")
    # The client got what amp says it answered.
    disagree = 0
    for uid, r in records.items():
        if r["out"] == "violation":
            continue
        mine = amp_reviews.get(uid)
        call = calls.get(uid)
        if mine is None:
            disagree += 1
            mismatch(f"{uid} ({r['ns']}): the client got {r['out']}, amp did not log the review")
        elif (mine[1], mine[2]) != (r["out"], r.get("reason", "")) or (
            r["out"] == "patched" and (call is None or call[1] != r.get("kind"))
        ):
            disagree += 1
            mismatch(
                f"{uid} ({r['ns']}): the client got {r['out']} {r.get('reason') or r.get('kind')}, amp logged "
                f"{mine[1]} {mine[2]}, the endpoint did {call[1] if call else 'nothing'}"
            )
    missing = sum(1 for uid in amp_reviews if uid not in records)
    if missing:
        problems.append(f"amp logged {missing} reviews the client has no record of")
    # Per origin.
    # Late answers move into the row of the hang's outcomes.
    active = [k for k in KINDS if k == "hang" or any(by_kind.get(k) for by_kind in injected.values())]
    keys = outcome_keys(active)
    origins = {}
    for port, number in ports.items():
        origin = f"http://127.0.0.1:{number}"
        counted = dict(endpoint_metrics.get(origin, {}))
        got = injected.get(port, {})
        expected: dict[str, int] = {}
        for kind in active:
            key = keys[kind]
            expected[key] = expected.get(key, 0) + got.get(kind, 0) - late[port].get(kind, 0)
        expected[keys["hang"]] += sum(late[port].values()) + unread[port] + gone_unread[port]
        rows = []
        for key, want in expected.items():
            have = sum(counted.pop(o, 0) for o in key.split("+"))
            rows.append({"amp_outcome": key, "expected": want, "amp_counted": have, "match": want == have})
            if want != have:
                problems.append(f"{port}: {want} calls should have ended {key}, amp counted {have}")
        for outcome, said in (("breaker-open", breaker_open[port]), ("+".join(BULKHEAD_REASONS), bulkhead[port])):
            have = sum(counted.pop(o, 0) for o in outcome.split("+"))
            rows.append({"amp_outcome": outcome, "expected": said, "amp_counted": have, "match": have == said})
            if have != said:
                problems.append(f"{port}: amp counted {have} {outcome} calls, {said} reviews say so")
        refused = breaker_open[port]
        for outcome, n in counted.items():
            if n:
                rows.append({"amp_outcome": outcome, "expected": 0, "amp_counted": n, "match": False})
                problems.append(f"{port}: amp counted {n} calls as {outcome}, which nothing injected")
        origins[port] = {
            "origin": origin,
            "injected": got,
            "late": late[port],
            "unread": unread[port],
            "bulkhead": bulkhead[port],
            "rows": rows,
            "breaker_open": refused,
            "reached_endpoint": sum(got.values()),
        }
    unknown = sum(1 for uid in calls if uid not in records)
    if unknown:
        problems.append(f"{unknown} endpoint calls carry a uid the client never sent")
    if n_mismatch:
        problems.append(
            f"{n_mismatch} reviews were answered otherwise than the endpoint's behaviour implies "
            f"({disagree} of them: the client got something else than amp logged)"
        )
    return {
        "origins": origins,
        "review_mismatches": n_mismatch,
        "mismatch_examples": mismatches,
        "reviews_matched_to_calls": matched,
        "amp_reviews_logged": len(amp_reviews),
        "unknown_calls": unknown,
        "endpoint_timing": {
            "late_answers": sum(sum(v.values()) for v in late.values()) - moved,
            "unread_calls": sum(unread.values()),
            "bulkhead_refusals": sum(bulkhead.values()),
            "cancelled_by_client": sum(gave_up.values()),
        },
        "late_examples": late_examples,
        "timing_uids": timing_uids,
        "problems": problems,
    }
