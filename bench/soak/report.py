"""
The soak's verdict: every criterion evaluated from what the driver
collected (L{evaluate}), and the report printed at the end
(L{text_report}).

Behaviour criteria are judged in every run: every review answered
well-formed (C{answers}), outcomes reconciled with the faults injected
(C{outcomes}), a clean log (C{log}), amp's RSS under its bound and, in a
long run, flat (C{rss}), no file descriptor left behind once the load is
over (C{fds}), every certificate rotation put into service (C{tls}), the
watch faults survived (C{watch}), and with C{--hostile} every hostile config
file swapped in refused and the config in force unchanged (C{configs}).
Timing criteria (L{TIMING_CRITERIA}) are judged in a full run and only
reported in a --quick one.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.chaos_endpoint import HOSTILE_KINDS
from bench.soak.reconcile import read_chaos_log, read_records, reconcile
from bench.soak.settings import FD_SLACK, FLATNESS_MIN_DURATION, RSS_GROWTH_MAX_PCT, TIMING_CRITERIA


def median_growth(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """
    The median of the middle third of the samples against that of the last
    third (the first third is warm-up), and a least-squares slope over both.
    """
    n = len(samples)
    if not n:
        return {"samples": 0}
    out: dict[str, Any] = {
        "samples": n,
        "first": samples[0][key],
        "last": samples[-1][key],
        "max": max(s[key] for s in samples),
    }
    third = n // 3
    middle = [s[key] for s in samples[third : 2 * third]]
    last = [s[key] for s in samples[2 * third :]]
    if not middle or not last:
        return out
    m_mid, m_last = statistics.median(middle), statistics.median(last)
    tail = samples[third:]
    xs = [s["t"] for s in tail]
    ys = [s[key] for s in tail]
    slope = 0.0
    if len(xs) > 1:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        den = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
    return dict(
        out,
        median_middle_third=m_mid,
        median_last_third=m_last,
        growth=m_last - m_mid,
        growth_pct=round(100.0 * (m_last - m_mid) / m_mid, 2) if m_mid else 0.0,
        slope_per_minute=round(slope * 60, 2),
    )


def evaluate(soak: Any, run: dict[str, Any], after: dict[str, Any], log: dict[str, Any]) -> dict[str, Any]:
    """
    Every criterion of the soak (see the module docstring), each with
    C{passed}, C{judged} (False for timing criteria in a --quick run) and
    its figures.
    """
    load = run.get("load") or {}
    judge_timing = not soak.args.quick
    criteria: dict[str, dict[str, Any]] = {}

    def criterion(name: str, passed: bool, **detail: Any) -> None:
        judged = judge_timing or name not in TIMING_CRITERIA
        criteria[name] = {"passed": bool(passed), "judged": judged, **detail}

    records = read_records(soak.records) if os.path.exists(soak.records) else {}
    amp_reviews = log.pop("reviews")

    def with_amp_time(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(e, amp_ms=amp_reviews.get(e["uid"], (None, None, None, None))[3]) for e in examples[:10]]

    # 1. Every review got a well-formed answer consistent with its
    # namespace's policy (the load generator waits well past the API
    # server's timeout, so that a late answer is timing, not a loss) ...
    criterion(
        "answers",
        bool(load.get("sent"))
        and load.get("violations") == 0
        and load.get("unanswered") == 0
        and load.get("answered") == load.get("sent")
        and not soak.problems,
        sent=load.get("sent"),
        answered=load.get("answered"),
        violations=load.get("violations"),
        unanswered=load.get("unanswered"),
        examples=with_amp_time(load.get("violation_examples", [])),
        problems=soak.problems,
    )
    # ... before its deadline (the API server's own timeout).
    criterion(
        "deadlines",
        bool(load.get("sent")) and load.get("late") == 0 and load.get("unanswered") == 0,
        late=load.get("late"),
        unanswered=load.get("unanswered"),
        examples=with_amp_time(load.get("late_examples", [])),
    )

    # 2. Outcome counts match the injected faults.
    calls, duplicates = read_chaos_log(soak.chaos_log)
    injected = after["chaos"]["ports"]
    rec = reconcile(
        soak.namespaces, soak.ports, records, amp_reviews, calls, injected, endpoint_counts(after["metrics"])
    )
    rec.pop("timing_uids")
    client: dict[str, int] = {}
    for r in records.values():
        client[r["out"]] = client.get(r["out"], 0) + 1
    amp_results = {k: int(v) for k, v in after["metrics"].by("amp_admission_requests_total", "result").items()}
    logged: dict[str, int] = {}
    for _, result, _, _ in amp_reviews.values():
        logged[result] = logged.get(result, 0) + 1
    results_match = amp_results == logged and set(amp_results) <= {"patched", "ignored", "failed", "skipped"}
    totals = {k: sum(p.get(k, 0) for p in injected.values()) for k in soak.kinds}
    breaker_open = rec["origins"].get("flaky", {}).get("breaker_open", 0)
    criterion(
        "outcomes",
        not rec["problems"]
        and results_match
        and duplicates == 0
        and all(totals.values())
        and breaker_open > 0
        and after["chaos"]["hung_now"] == 0,
        injected_total=totals,
        reconciliation=rec,
        amp_review_results=amp_results,
        amp_logged_results=logged,
        client_results=client,
        endpoint_called_twice=duplicates,
        endpoint_requests_still_hanging=after["chaos"]["hung_now"],
    )
    criterion(
        "endpoint_timing",
        not any(rec["endpoint_timing"].values()),
        **rec["endpoint_timing"],
        examples=rec["late_examples"],
    )

    # 3. No unhandled error in amp's log.
    criterion("log", log["problem_lines"] == 0, **log)

    # 4. RSS under its bound (and flat in a long run); no file descriptor
    # left open once the load is over.
    rss = median_growth(soak.samples, "rss_kib")
    limit_kib = soak.args.rss_limit_mib * 1024
    flatness = soak.args.duration >= FLATNESS_MIN_DURATION
    under = bool(soak.samples) and rss["max"] <= limit_kib
    flat = not flatness or ("growth_pct" in rss and rss["growth_pct"] <= RSS_GROWTH_MAX_PCT)
    criterion(
        "rss",
        under and flat,
        limit_mib=soak.args.rss_limit_mib,
        under_limit=under,
        flatness_checked=flatness,
        flat=flat,
        growth_max_pct=RSS_GROWTH_MAX_PCT,
        **rss,
    )
    fds = median_growth(soak.samples, "fds")
    threads = median_growth(soak.samples, "threads")
    criterion(
        "fds",
        after["fds_idle"] <= soak.fds_before + FD_SLACK and after["open_connections"] == 0,
        before_load=soak.fds_before,
        after_load_idle=after["fds_idle"],
        slack=FD_SLACK,
        open_client_connections_after=after["open_connections"],
        threads={k: threads.get(k) for k in ("first", "last", "max")},
        **fds,
    )

    # 5. The certificate rotations were all put into service.
    reloads = {k: int(v) for k, v in after["metrics"].by("amp_tls_reloads_total", "result").items()}
    issued = {f"{s:x}" for s in soak.volume.serials}
    seen = {f"{s:x}" for s in soak.served_serials}
    criterion(
        "tls",
        reloads.get("success", 0) == soak.rotations
        and soak.rotations > 0
        and after["final_serial"] == after["last_serial"]
        and len(seen) >= 2
        and seen <= issued,
        rotations=soak.rotations,
        reloads=reloads,
        certificates_served=len(seen),
        served_unknown=sorted(seen - issued),
        serves_last_certificate=after["final_serial"] == after["last_serial"],
    )

    # 6. The watch faults happened and the cache caught up.
    m = after["metrics"]
    restarts = {k: int(v) for k, v in m.by("amp_namespace_watch_restarts_total", "reason").items()}
    misses = {k: int(v) for k, v in m.by("amp_namespace_cache_misses_total", "result").items()}
    cached = m.value("amp_namespace_cache_namespaces")
    criterion(
        "watch",
        restarts.get("dropped", 0) >= 1
        and restarts.get("expired", 0) >= 1
        and cached == after["api_namespaces"]
        and not sum(misses.values())
        and not after["api"].get("errors"),
        drops=soak.faults["drop"],
        expiries=soak.faults["expire"],
        touches=soak.faults["touch"],
        streams_cut=soak.streams_cut,
        amp_restarts=restarts,
        amp_events={k: int(v) for k, v in m.by("amp_namespace_events_total", "type").items()},
        relists=after["api"].get("lists"),
        cache_namespaces=cached,
        api_namespaces=after["api_namespaces"],
        cache_misses=misses,
        fake_api_errors=after["api"].get("errors"),
    )
    # 7. With --hostile: every hostile config swapped in was refused,
    # counted and logged once per content, and the config in force never
    # changed.
    configs = after.get("configs")
    if configs is not None:
        reloads = configs["amp_reloads"]
        criterion(
            "configs",
            configs["hostile_swaps"] > 0
            and reloads.get("error", 0) == configs["hostile_swaps"]
            and reloads.get("success", 0) == configs["restored"]
            and configs["hash_after"] == configs["hash_before"] is not None
            and configs["refusals_logged"] == min(configs["kinds"], configs["hostile_swaps"]),
            **configs,
        )
    return criteria


def endpoint_counts(scrape: Any) -> dict[str, dict[str, int]]:
    """amp_endpoint_requests_total as {origin: {outcome: count}}."""
    out: dict[str, dict[str, int]] = {}
    for (name, labels), value in scrape.samples.items():
        if name == "amp_endpoint_requests_total":
            ls = dict(labels)
            by = out.setdefault(ls["endpoint"], {})
            by[ls["outcome"]] = by.get(ls["outcome"], 0) + int(value)
    return out


def busy_machine(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """
    How much CPU other processes used during the run (% of one CPU): context
    for the timing figures.
    """
    other = [x["other_cpu_pct"] for x in samples if "other_cpu_pct" in x]
    amp = [x["amp_cpu_pct"] for x in samples if "amp_cpu_pct" in x]
    if not other:
        return {}
    return {
        "other_cpu_pct_mean": round(statistics.fmean(other), 1),
        "other_cpu_pct_max": max(other),
        "seconds_other_over_50pct": sum(1 for x in other if x > 50),
        "amp_cpu_pct_mean": round(statistics.fmean(amp), 1) if amp else None,
        "amp_seconds_without_cpu": sum(1 for x in amp if x == 0),
    }


def _mib(kib: Any) -> str:
    return f"{kib / 1024:.1f}" if isinstance(kib, (int, float)) else "?"


def text_report(result: dict[str, Any]) -> str:
    c = result["criteria"]
    load = result["load"]
    lines = [
        f"amp soak — {result['date']} — {result['settings']['duration_s']:g}s at "
        f"{result['settings']['rate']:g} reviews/s (seed {result['settings']['seed']}): {result['verdict']}",
        "",
    ]
    busy = result.get("busy", {})
    if busy:
        lines += [
            f"Other processes used {busy['other_cpu_pct_mean']}% of a CPU on average (max "
            f"{busy['other_cpu_pct_max']}%, over 50% in {busy['seconds_other_over_50pct']} seconds); amp "
            f"{busy['amp_cpu_pct_mean']}%, {busy['amp_seconds_without_cpu']} seconds without any CPU.",
            "",
        ]
    for name, crit in c.items():
        mark = (
            ("ok" if crit["passed"] else "FAIL")
            if crit.get("judged", True)
            else ("ok" if crit["passed"] else "late") + ", not judged in a quick run"
        )
        lines.append(f"  [{mark}] {name}")
    d = c["deadlines"]
    lines += [
        "",
        f"Reviews: {load.get('sent')} sent, {load.get('answered')} answered; {load.get('violations')} "
        f"malformed or refused, {d['late']} answered after the API server's timeout, {d['unanswered']} "
        f"not answered; {load.get('reviews_per_s')} reviews/s; max in flight {load.get('max_in_flight')}; "
        f"load generator at most {load.get('scheduler_max_behind_ms')} ms behind schedule.",
    ]
    for ex in c["answers"].get("examples", []):
        lines.append(f"    violation: {ex}")
    for p in c["answers"].get("problems", []):
        lines.append(f"    problem: {p}")
    for ex in d.get("examples", []):
        lines.append(f"    late: {ex}")
    lines.append("Latency by namespace (ms, as the client saw it; the API server's timeout):")
    for ns in result["namespaces"]:
        lat = load.get("latency_ms", {}).get(ns["name"], {})
        lines.append(
            f"    {ns['name']:18} {ns['policy'] or 'off':6} {ns['timeout']:>2}s  n={lat.get('n')}  "
            f"p50 {lat.get('p50')}  p99 {lat.get('p99')}  max {lat.get('max')}"
        )
    o = c["outcomes"]
    rec = o["reconciliation"]
    lines += [
        "",
        "Endpoint calls by outcome, per origin: expected from what the chaos endpoint injected (and the "
        "reviews answered breaker-open), counted by amp (amp_endpoint_requests_total):",
    ]
    for port, info in rec["origins"].items():
        lines.append(
            f"  {port} ({info['origin']}): {info['reached_endpoint']} calls reached the endpoint "
            f"{info['injected']}, {info['breaker_open']} refused by the open breaker"
            + (f"; late answers {info['late']}" if info["late"] else "")
            + (f"; {info['unread']} calls timed out unread" if info["unread"] else "")
            + (f"; {info['bulkhead']} refused by the bulkhead" if info["bulkhead"] else "")
        )
        for row in info["rows"]:
            lines.append(
                f"    {row['amp_outcome']:28} expected {row['expected']:>6}  amp {row['amp_counted']:>6}  "
                f"{'=' if row['match'] else '≠'}"
            )
    lines.append(
        f"  per review: {rec['amp_reviews_logged']} reviews in amp's log, {rec['reviews_matched_to_calls']} "
        f"matched to their endpoint call by uid; {rec['review_mismatches']} mismatches, "
        f"endpoint timing {rec['endpoint_timing']}, "
        f"{rec['unknown_calls']} unknown calls, {o['endpoint_called_twice']} calls made twice, "
        f"{o['endpoint_requests_still_hanging']} endpoint requests still open at the end"
    )
    for m in rec["mismatch_examples"]:
        lines.append(f"    mismatch: {m}")
    for m in rec["late_examples"]:
        lines.append(f"    endpoint timing: {m}")
    for p in rec["problems"]:
        lines.append(f"    problem: {p}")
    lines.append(
        f"  review results: amp's metrics {o['amp_review_results']}, amp's log {o['amp_logged_results']}, "
        f"client {o['client_results']}"
    )
    lines.append(f"  injected in total: {o['injected_total']}")
    r, f = c["rss"], c["fds"]
    lines += [
        "",
        f"amp RSS: start {_mib(r.get('first'))} MiB, end {_mib(r.get('last'))} MiB, max "
        f"{_mib(r.get('max'))} MiB (bound {r['limit_mib']:g} MiB); median middle third "
        f"{_mib(r.get('median_middle_third'))} → last third {_mib(r.get('median_last_third'))} MiB "
        f"({r.get('growth_pct')}%"
        + (f", limit +{RSS_GROWTH_MAX_PCT:g}%" if r["flatness_checked"] else ", not judged in a short run")
        + f"); trend after warm-up {r.get('slope_per_minute')} KiB/min",
        f"amp fds: {f['before_load']} before the load, {f['after_load_idle']} once idle after it (slack "
        f"{f['slack']}), max {f.get('max')} during it; client connections open after: "
        f"{f['open_client_connections_after']}; threads {f.get('threads')}",
    ]
    hostile = {k: n for k, n in o["injected_total"].items() if k in HOSTILE_KINDS and n}
    if hostile:
        verdict = "held" if r["under_limit"] else "was EXCEEDED"
        lines.append(
            f"Hostile endpoints mixed in: {hostile} (heads of up to {result['settings']['flood_mib']} MiB "
            f"per header-flood or huge-header call); amp's RSS bound of {r['limit_mib']:g} MiB {verdict} "
            f"(max {_mib(r.get('max'))} MiB)."
        )
        if not r["under_limit"]:
            lines.append(
                "    amp buffered more than its bound while endpoints flooded it with header bytes: without "
                "a per-call limit on a reply's head (bytes and lines) and a cap on what all replies may "
                "buffer at once, each such call holds its whole head until amp's timeout."
            )
    if "configs" in c:
        g = c["configs"]
        lines.append(
            f"Config swaps: {g['hostile_swaps']} hostile files swapped in ({g['by_kind']}), the good file "
            f"{g['restored']} times back; amp counted {g['amp_reloads']}, logged {g['refusals_logged']} "
            f"refusals (one per content), config {g['hash_before']} in force before, {g['hash_after']} "
            f"after."
        )
    t = c["tls"]
    lines.append(
        f"TLS: {t['rotations']} rotations, amp reloads {t['reloads']}, new connections were served "
        f"{t['certificates_served']} certificates"
        + (f" ({len(t['served_unknown'])} not issued by the soak!)" if t["served_unknown"] else "")
        + f"; serves the last one: {t['serves_last_certificate']}"
    )
    w = c["watch"]
    lines.append(
        f"Watch: {w['drops']} drops and {w['expiries']} forced 410s ({w['streams_cut']} streams cut), "
        f"{w['touches']} touches; amp restarts {w['amp_restarts']}, events {w['amp_events']}, "
        f"{w['relists']} namespace lists; cache {w['cache_namespaces']} of {w['api_namespaces']} "
        f"namespaces; misses {w['cache_misses']}"
    )
    lg = c["log"]
    lines.append(f"amp log: {lg['lines']} lines, {lg['problem_lines']} with an error or traceback")
    for p in lg["problems"][:10]:
        lines.append(f"    {p}")
    if lg["warnings"]:
        lines.append("  warnings by kind: " + "; ".join(f"{n}× {k}" for k, n in lg["warnings"].items()))
    return "\n".join(lines)
