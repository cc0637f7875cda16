"""
Tests for monitoring as code (deploy/monitoring, rendered from the chart's
templates and deploy/chart/amp/files): the alerting rules pass C{promtool
check rules}, every alert has a promtool unit test that fires it and one
that keeps it quiet (tests/integration/deploy/alerts-test.yaml) and those tests
pass; every metric name, label name and result or outcome value that the
rules and the Grafana dashboard use is one amp exports (read from amp's own
Metrics registry in-process), except the few that Prometheus and the API
server export; the dashboard covers what an operator looks at; the
ServiceMonitor scrapes the Service's metrics port under the job the rules
select; amp exports its process metrics and no C{*_created} series; and
docs/metrics.md describes every alert.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import promql_parser
import yaml

from amp.canary import CanaryResult
from amp.metrics import CONFIG_RELOAD_RESULTS, RECORD_RESULTS, TLS_RELOAD_RESULTS, Metrics
from amp.reasons import ENDPOINT_OUTCOMES, Reason, Result
from tests.support.deploytools import APISERVER_METRICS, CHART, DEPLOY, ROOT, kustomize_build, one, run, tool

ALERT_TESTS = Path(__file__).resolve().parent / "alerts-test.yaml"
DASHBOARD = CHART / "files" / "amp-dashboard.json"

#: Metric names the rules or the dashboard use that amp does not export, and
#: who does.
FOREIGN_METRICS = {
    "up": "Prometheus, for every scrape target",
    **{name: "kube-apiserver (tests/e2e/test_chart.py reads it from a real one)" for name in APISERVER_METRICS},
}
#: Labels Prometheus adds to every series of a target it scrapes through the
#: ServiceMonitor (amp's own `endpoint` and `namespace` win: honorLabels).
TARGET_LABELS = {"job", "instance", "pod", "namespace", "service", "container", "endpoint"}


# ---------------------------------------------------------------- what there is


def monitoring() -> list[dict[str, Any]]:
    return kustomize_build(DEPLOY / "monitoring")


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file."""
    return one(monitoring(), "PrometheusRule")["spec"]


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def grafana_to_promql(expr: str) -> str:
    """A dashboard query as PromQL: Grafana's interval variables filled in."""
    return expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")


def dashboard_queries() -> list[str]:
    queries = [grafana_to_promql(t["expr"]) for p in dashboard_panels() for t in p.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["definition"])
            assert match, variable["definition"]
            queries.append(match.group(1))
    return queries


def selectors(node: Any) -> Iterator[Any]:
    """Every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None:
            yield from selectors(child)
    for arg in getattr(node, "args", None) or ():
        yield from selectors(arg)


def exported() -> dict[str, set[str]]:
    """
    Every sample name amp's Metrics registry exports, with its label names,
    read from the registry itself (a scrape of an unused registry would
    leave out labelled metrics that have no series yet).
    """
    out: dict[str, set[str]] = {}
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
        "unknown": ("",),
    }
    metrics = Metrics()
    for family in metrics.registry.collect():
        labels = {label for sample in family.samples for label in sample.labels}
        labels |= set(_label_names(metrics, family.name))
        for suffix in suffixes[family.type]:
            out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def _label_names(metrics: Metrics, family: str) -> tuple[str, ...]:
    """
    The label names of one of amp's metrics (also when it has no series yet).
    prometheus_client has no public accessor for a metric's name and label
    names (its families only carry the labels of series that exist), hence
    C{_name} and C{_labelnames}.
    """
    for value in vars(metrics).values():
        name = getattr(value, "_name", None)
        if name == family:
            return tuple(getattr(value, "_labelnames", ()))
    return ()


# ---------------------------------------------------------------- promtool


def write_rules(directory: Path) -> Path:
    path = directory / "amp-rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    return path


def test_promtool_check_rules(tmp_path: Path) -> None:
    promtool = tool("promtool")
    result = run([promtool, "check", "rules", str(write_rules(tmp_path))])
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout
    # The chart's own file (what the PrometheusRule wraps) is a rule file as it is.
    run([promtool, "check", "rules", str(CHART / "files" / "amp-rules.yaml")])


def promtool_test(directory: Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(ALERT_TESTS, directory / ALERT_TESTS.name)
    return subprocess.run(
        [tool("promtool"), "test", "rules", ALERT_TESTS.name],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_promtool_unit_tests_of_the_alerts_pass(tmp_path: Path) -> None:
    write_rules(tmp_path)
    result = promtool_test(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_an_alert_changes(tmp_path: Path) -> None:
    """The unit tests really check the rules: a changed threshold fails them."""
    groups = rule_groups()
    for rule in groups["groups"][0]["rules"]:
        if rule.get("alert") == "AmpEndpointErrors":
            rule["expr"] = rule["expr"].replace("> 0.05", "> 0.5")
    (tmp_path / "amp-rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    result = promtool_test(tmp_path)
    assert result.returncode != 0
    assert "alertname: AmpEndpointErrors" in result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired, quiet = set(), set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts no test fires"
    assert names - quiet == set(), "alerts no test keeps quiet"
    assert (fired | quiet) - names == set(), "tests of alerts that do not exist"
    for a in alerts():
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]
        assert {"summary", "description"} <= set(a["annotations"]), a["alert"]


# ---------------------------------------------------------------- metric names


def used_selectors() -> list[tuple[str, Any]]:
    """(where, vector selector) for every selector in the rules and the dashboard."""
    out = []
    for alert in alerts():
        out += [(f"alert {alert['alert']}", s) for s in selectors(promql_parser.parse(alert["expr"]))]
    for query in dashboard_queries():
        out += [(f"dashboard {query}", s) for s in selectors(promql_parser.parse(query))]
    return out


def test_every_metric_the_rules_and_dashboard_use_is_one_amp_exports() -> None:
    amp = exported()
    used = {s.name for _, s in used_selectors()}
    assert all(used), "every selector names its metric"
    unknown = used - set(amp) - set(FOREIGN_METRICS)
    assert unknown == set(), f"metrics amp does not export: {sorted(unknown)}"
    assert set(FOREIGN_METRICS) <= used, "a foreign metric is listed that nothing uses"
    # The config and bypass alerts rest on metrics amp really exports.
    assert {"amp_config_reloads_total", "amp_config_info", "amp_bypassed_pods_total"} <= used & set(amp)
    # The process metrics the dashboard shows.
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= used & set(amp)


def test_label_names_and_values_the_rules_and_dashboard_use_exist() -> None:
    """
    A selector on one of amp's metrics only uses labels it has (or that the
    scrape adds), and the result and outcome values it matches are ones amp
    reports: a renamed reason cannot leave an alert silently matching nothing.
    """
    amp = exported()
    reported = {
        ("amp_admission_requests_total", "result"): {r.value for r in Result},
        ("amp_admission_requests_total", "reason"): {r.value for r in Reason} | {""},
        ("amp_endpoint_requests_total", "outcome"): set(ENDPOINT_OUTCOMES),
        ("amp_tls_reloads_total", "result"): set(TLS_RELOAD_RESULTS),
        ("amp_config_reloads_total", "result"): set(CONFIG_RELOAD_RESULTS),
        ("amp_canary_reviews_total", "result"): {str(r) for r in CanaryResult},
        ("amp_recorded_reviews_total", "result"): set(RECORD_RESULTS),
    }
    for where, selector in used_selectors():
        if selector.name not in amp:
            continue
        for matcher in selector.matchers.matchers:
            assert matcher.name in amp[selector.name] | TARGET_LABELS, f"{where}: no label {matcher.name}"
            if matcher.name in ("result", "outcome") and "$" not in matcher.value:
                known = reported[(selector.name, matcher.name)]
                values = set(matcher.value.split("|"))
                assert values <= known, f"{where}: {matcher.name} {values - known} is never reported"


def test_metric_name_check_sees_a_typo() -> None:
    """The check above is really looking: a misspelt metric is not one amp exports."""
    [selector] = list(selectors(promql_parser.parse('rate(amp_admission_request_total{result="ignored"}[5m])')))
    assert selector.name not in exported()
    assert "amp_admission_requests_total" in exported()


def test_amp_exports_process_metrics_and_no_created_series() -> None:
    metrics = Metrics()
    metrics.admission_requests.labels("Pod", "CREATE", Result.PATCHED, "").inc()
    metrics.admission_duration.observe(0.01)
    text = metrics.render().decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert "amp_admission_requests_total" in names
    assert not [n for n in names if n.endswith("_created")]


# ---------------------------------------------------------------- the dashboard and the scrape


def test_dashboard_shows_what_an_operator_looks_at() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] == "amp"
    panels = [p for p in dashboard_panels() if p["type"] != "row"]
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: set[tuple[int, int]] = set()
    for p in dashboard_panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p.get("description"), p["title"]
    queries = [t["expr"] for p in panels for t in p["targets"]]

    def shown(pattern: str) -> bool:
        return any(re.search(pattern, q) for q in queries)

    assert shown(r"sum by \(result\) \(rate\(amp_admission_requests_total"), "throughput and results"
    assert shown(r"sum by \(outcome\) \(rate\(amp_endpoint_requests_total"), "failures by reason"
    for q in ("0.5", "0.9", "0.99"):
        assert shown(rf"histogram_quantile\({q}, sum by \(le\) \(rate\(amp_admission_duration_seconds_bucket"), q
    assert shown(r"sum by \(endpoint, outcome\) \(rate\(amp_endpoint_requests_total"), "endpoint outcomes"
    assert shown(r"amp_circuit_breaker_state"), "breaker states"
    assert shown(r"amp_tls_certificate_not_after_timestamp_seconds.*- time\(\)"), "certificate expiry"
    [breakers] = [p for p in panels if "amp_circuit_breaker_state" in p["targets"][0]["expr"]]
    [mapping] = breakers["fieldConfig"]["defaults"]["mappings"]
    assert {k: v["text"] for k, v in mapping["options"].items()} == {"0": "closed", "1": "half-open", "2": "open"}


def test_dashboard_configmap_carries_the_chart_file() -> None:
    [configmap] = [d for d in monitoring() if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["name"] == "amp-dashboard", "no hash suffix: the sidecar would load old copies"
    assert json.loads(configmap["data"]["amp-dashboard.json"]) == dashboard()


def test_service_monitor_scrapes_amp_under_the_job_the_rules_select() -> None:
    base = kustomize_build(DEPLOY / "base")
    service = one(base, "Service")
    monitor = one(monitoring(), "ServiceMonitor")
    spec = monitor["spec"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert spec["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True, "amp's endpoint and namespace labels must not be renamed"
    job = service["metadata"]["labels"][spec["jobLabel"]]
    for alert in alerts():
        for s in selectors(promql_parser.parse(alert["expr"])):
            for m in s.matchers.matchers:
                if m.name == "job":
                    assert m.value == job, alert["alert"]
    assert set(one(monitoring(), "PrometheusRule")["spec"]) == {"groups"}


def test_docs_describe_every_alert() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in {a["alert"] for a in alerts()}:
        assert f"`{name}`" in text, name
