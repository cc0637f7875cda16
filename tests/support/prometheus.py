"""
Reading amp's C{/metrics} as Prometheus would: the suite's and the
benchmark's one parser of the text format (C{prometheus_client}'s own).

    scrape = Scrape(text)                 # or Scrape.get(port) from a process
    scrape.value("amp_tls_reloads_total", result="success")   # one series
    scrape.total("amp_endpoint_requests_total", outcome="ok") # summed
    scrape.by("amp_endpoint_requests_total", "outcome", endpoint=origin)
"""

from __future__ import annotations

import http.client
from typing import Any, Optional

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """
    One scrape: every sample by name and label set, and every family by
    name (C{families}; a counter's family name has no C{_total}).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.families: dict[str, Any] = {}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = family
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    @classmethod
    def get(cls, port: int, host: str = "127.0.0.1", path: str = "/metrics", timeout: float = 10.0) -> "Scrape":
        """Scrape C{http://host:port/metrics} (blocking: for another process)."""
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"GET {path} on port {port} answered {response.status}: {body[:200]!r}")
        return cls(body.decode("utf-8"))

    def _matching(self, name: str, labels: dict[str, str]) -> list[tuple[dict[str, str], float]]:
        wanted = labels.items()
        return [(dict(ls), v) for (n, ls), v in self.samples.items() if n == name and wanted <= ls]

    def value(self, name: str, **labels: str) -> Optional[float]:
        """The sample with exactly these labels, or None when there is none."""
        return self.samples.get((name, frozenset(labels.items())))

    def total(self, name: str, **labels: str) -> float:
        """The sum of every sample of C{name} whose labels include C{labels} (0 when none)."""
        return sum(v for _, v in self._matching(name, labels))

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """The samples of C{name} whose labels include C{labels}, summed by the value of C{label}."""
        out: dict[str, float] = {}
        for ls, v in self._matching(name, labels):
            if label in ls:
                out[ls[label]] = out.get(ls[label], 0.0) + v
        return out
