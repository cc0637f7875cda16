"""
The soak's load generator: what the API server does to amp.  It sends
AdmissionReviews at a fixed rate over TLS keep-alive connections (treq over
Twisted's connection pool, trusting the soak's CA and checking amp's
certificate), with the API server's C{?timeout=}, and checks every answer as
the API server would (L{check_answer}).  Now and then a review asks amp to
close its connection afterwards, so that new TLS handshakes keep meeting the
rotated certificate.

Run by the driver as C{python -m bench.soak.load PLAN.json}: it prints
C{{"started": true}}, writes one JSON line per review to the plan's
C{records} file and, at the end, prints its summary as one JSON line.
"""

from __future__ import annotations

import base64
import json
import random
import re
import sys
import uuid
from typing import Any

import jsonpatch
import treq
from twisted.internet.defer import Deferred, DeferredList, DeferredSemaphore, TimeoutError, inlineCallbacks
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import LoopingCall, react
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from bench import bodies
from bench.soak.settings import STATUS_ANNOTATION

VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

_IGNORED_WARNING = re.compile(r"^amp: (\S+) ([a-z0-9-]+); admitted without the endpoint's patch$")
_DENIED_MESSAGE = re.compile(r"^amp: endpoint (\S+) failed \(([a-z0-9-]+)\): ")


class Violation(Exception):
    """An answer the API server would reject, or one that contradicts the namespace's policy."""


def check_answer(
    ns: dict[str, Any], version: str, uid: str, status: int, headers: dict[str, str], data: bytes, pod: dict[str, Any]
) -> tuple[str, str, str]:
    """
    Check one answer as the API server would, and say what it was:
    C{(outcome, reason, kind)} with outcome C{patched} (the endpoint's
    patch; C{kind} is the label value the chaos endpoint set), C{ignored}
    (failure policy Ignore: the Pod admitted with amp's C{skipped} status;
    C{reason} is amp's name for the failure), C{failed} (failure policy Fail)
    or C{skipped} (a namespace that is not enabled).

    @raise Violation: for an answer the API server would reject, or one
        that contradicts the namespace's failure policy.
    """
    if status != 200:
        raise Violation(f"HTTP {status}: {data[:200]!r}")
    if not headers.get("content-type", "").startswith("application/json"):
        raise Violation(f"Content-Type {headers.get('content-type')!r}")
    try:
        doc = json.loads(data)
    except ValueError:
        raise Violation(f"not JSON: {data[:200]!r}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or doc.get("apiVersion") != version:
        raise Violation(f"not an AdmissionReview {version}: {data[:200]!r}")
    resp = doc.get("response")
    if not isinstance(resp, dict) or resp.get("uid") != uid:
        raise Violation(f"response uid {resp.get('uid') if isinstance(resp, dict) else None!r} is not {uid}")
    allowed = resp.get("allowed")
    if not isinstance(allowed, bool):
        raise Violation(f"allowed is {allowed!r}")
    warnings = resp.get("warnings") or []
    if not allowed:
        if "patch" in resp or "patchType" in resp:
            raise Violation("a denial carries a patch")
        if ns["policy"] != "Fail":
            raise Violation(f"denied in a namespace with failure policy {ns['policy']}: {resp.get('status')}")
        message = (resp.get("status") or {}).get("message", "")
        m = _DENIED_MESSAGE.match(message if isinstance(message, str) else "")
        if not m:
            raise Violation(f"denial without amp's reason: {message!r}")
        return "failed", m.group(2), ""
    ops: list[Any] = []
    patched = pod
    if "patch" in resp or "patchType" in resp:
        if resp.get("patchType") != "JSONPatch":
            raise Violation(f"patchType {resp.get('patchType')!r}")
        try:
            ops = json.loads(base64.b64decode(resp["patch"], validate=True))
            patched = jsonpatch.JsonPatch(ops).apply(pod)
        except Exception as e:
            raise Violation(f"patch does not apply: {type(e).__name__}: {e}") from None
    if not ns["enabled"]:
        if ops or warnings:
            raise Violation(f"a namespace that is not enabled got a patch {ops} or warnings {warnings}")
        return "skipped", "", ""
    status = str(((patched.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION, ""))
    label = [op for op in ops if op.get("path") == "/metadata/labels/amp.soak~1patched"]
    if len(label) == 1 and len(ops) == 2:
        if warnings:
            raise Violation(f"patched with warnings {warnings}")
        if not status.startswith("mutated "):
            raise Violation(f"patched with the status {status!r}")
        return "patched", "", str(label[0].get("value"))
    if status.startswith("skipped ") and len(ops) == 1:
        if ns["policy"] != "Ignore":
            raise Violation(f"admitted without the endpoint's patch under failure policy {ns['policy']}")
        m = _IGNORED_WARNING.match(warnings[0]) if len(warnings) == 1 and isinstance(warnings[0], str) else None
        if not m:
            raise Violation(f"admitted without the endpoint's patch and without amp's warning: {warnings}")
        reason = m.group(2)
        if not status.startswith(f"skipped {reason} "):
            raise Violation(f"status {status!r} does not name {reason}")
        if not (resp.get("auditAnnotations") or {}).get("error"):
            raise Violation("admitted without the endpoint's patch and without the audit annotation")
        return "ignored", reason, ""
    raise Violation(f"unexpected answer: allowed with patch {ops} and warnings {warnings}")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@implementer(IPolicyForHTTPS)
class TrustCA:
    """Trust only the soak's CA, and check amp's certificate for the address connected to."""

    def __init__(self, ca_pem: bytes) -> None:
        self._root = Certificate.loadPEM(ca_pem)

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return optionsForClientTLS(hostname.decode("ascii"), trustRoot=self._root)


class LoadGenerator:
    """
    One run of the load: L{run} resolves to the summary once every review
    sent has been answered or given up on.
    """

    def __init__(self, reactor: Any, plan: dict[str, Any]) -> None:
        self.reactor = reactor
        self.plan = plan
        self.rng = random.Random(plan["seed"])
        with open(plan["ca"], "rb") as f:
            ca = f.read()
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = plan["max_connections"]
        self.pool.cachedConnectionTimeout = plan["idle_close"]
        self.pool.retryAutomatically = False
        self.http = treq.client.HTTPClient(Agent(reactor, contextFactory=TrustCA(ca), pool=self.pool))
        # At most this many reviews in flight (and so connections open);
        # the others wait here, in the client, as the API server's own
        # requests would: amp never holds a request the client has not
        # finished sending because the client fell behind.
        self.slots = DeferredSemaphore(plan["max_connections"])
        self.namespaces = plan["namespaces"]
        self.weights = [ns["share"] for ns in self.namespaces]
        self.templates: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        self.pods: dict[str, Any] = {}
        for ns in self.namespaces:
            review = json.loads(bodies.review_body("typical", ns["name"]))
            self.pods[ns["name"]] = review["request"]["object"]
            review["request"]["uid"] = "@UID@"
            for version in VERSIONS:
                review["apiVersion"] = version
                prefix, suffix = json.dumps(review, separators=(",", ":")).encode().split(b"@UID@")
                self.templates[ns["name"], version] = (prefix, suffix)
        self.out = open(plan["records"], "w", buffering=1 << 16)
        self.counts: dict[str, dict[str, int]] = {ns["name"]: {} for ns in self.namespaces}
        self.latencies: dict[str, list[float]] = {ns["name"]: [] for ns in self.namespaces}
        self.examples: dict[str, list[dict[str, Any]]] = {"violations": [], "late": []}
        self.tally = {"violations": 0, "late": 0, "unanswered": 0}
        self.in_flight = self.max_in_flight = self.answered = self.sent = self.asked_to_close = 0
        self.behind = 0.0
        self.t0 = 0.0
        self.pending: set[Deferred] = set()

    def note(self, kind: str, record: dict[str, Any], examples: str) -> None:
        self.tally[kind] += 1
        if len(self.examples[examples]) < 20:
            self.examples[examples].append(dict(record))

    @inlineCallbacks
    def exchange(self, url: bytes, body: bytes, close: bool) -> Any:
        headers = {b"Content-Type": [b"application/json"], b"Accept": [b"application/json"]}
        if close:
            headers[b"Connection"] = [b"close"]
        response = yield self.http.post(url, data=body, headers=headers)
        data = yield treq.content(response)
        content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0].decode("latin-1")
        return response.code, {"content-type": content_type}, data

    @inlineCallbacks
    def one(self, ns: dict[str, Any], version: str, uid: str) -> Any:
        prefix, suffix = self.templates[ns["name"], version]
        body = prefix + uid.encode() + suffix
        url = b"https://127.0.0.1:%d/mutate?timeout=%ds" % (self.plan["port"], ns["timeout"])
        close = self.rng.random() < self.plan["close_share"]
        self.asked_to_close += close
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = self.reactor.seconds()
        record: dict[str, Any] = {
            "uid": uid,
            "ns": ns["name"],
            "v": version.rsplit("/", 1)[1],
            "at": round(started - self.t0, 3),
        }
        wait = ns["timeout"] + self.plan["grace"]
        try:
            yield self.slots.acquire()
            sent = self.reactor.seconds()
            record["queued_ms"] = round((sent - started) * 1000, 2)
            try:
                status, headers, data = yield self.exchange(url, body, close).addTimeout(wait, self.reactor)
            finally:
                self.slots.release()
            # From sending the request to the answer's last byte: the
            # client's own queue is not amp's time.
            elapsed = self.reactor.seconds() - sent
            record["ms"] = round(elapsed * 1000, 2)
            outcome, reason, kind = check_answer(ns, version, uid, status, headers, data, self.pods[ns["name"]])
            record.update(out=outcome, reason=reason, kind=kind)
            self.latencies[ns["name"]].append(elapsed)
            if elapsed > ns["timeout"]:
                record["late"] = True
                self.note("late", record, "late")
        except Exception as e:  # every way a review can go wrong is recorded with it
            if isinstance(e, TimeoutError):
                record.update(out="violation", late=True, err=f"no answer within {wait:g}s")
                self.note("unanswered", record, "late")
            else:
                text = str(e) if isinstance(e, Violation) else f"{type(e).__name__}: {e}"
                record.update(out="violation", err=text[:500])
                self.note("violations", record, "violations")
        finally:
            self.in_flight -= 1
        self.answered += 1
        key = record["out"] + (f":{record['reason']}" if record.get("reason") else "")
        self.counts[ns["name"]][key] = self.counts[ns["name"]].get(key, 0) + 1
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def send_due(self, loop: LoopingCall) -> None:
        elapsed = self.reactor.seconds() - self.t0
        total = int(self.plan["duration"] * self.plan["rate"])
        # Everything due by now; at the end, everything the run owes (a
        # late last tick on a busy machine must not shorten the run).
        due = total if elapsed >= self.plan["duration"] else min(total, int(elapsed * self.plan["rate"]) + 1)
        self.behind = max(self.behind, elapsed - (due - 1) / self.plan["rate"])
        while self.sent < due:
            ns = self.rng.choices(self.namespaces, self.weights)[0]
            version = VERSIONS[1] if self.rng.random() < self.plan["v1beta1_share"] else VERSIONS[0]
            uid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            d = self.one(ns, version, uid)
            self.pending.add(d)
            d.addBoth(lambda result, d=d: (self.pending.discard(d), result)[1])
            self.sent += 1
        if self.sent >= total:
            loop.stop()

    @inlineCallbacks
    def run(self) -> Any:
        print(json.dumps({"started": True}), flush=True)
        self.t0 = self.reactor.seconds()
        loop = LoopingCall(lambda: self.send_due(loop))
        loop.clock = self.reactor
        yield loop.start(0.005, now=True)
        elapsed = self.reactor.seconds() - self.t0
        while self.pending:
            yield DeferredList(list(self.pending))
        yield self.pool.closeCachedConnections()
        self.out.close()
        return {
            "sent": self.sent,
            "answered": self.answered,
            "seconds": round(elapsed, 2),
            "reviews_per_s": round(self.sent / elapsed, 1) if elapsed else 0.0,
            **self.tally,
            "violation_examples": self.examples["violations"],
            "late_examples": self.examples["late"],
            "counts": self.counts,
            "latency_ms": {
                name: {
                    "n": len(v),
                    "p50": round(_percentile(v, 0.5) * 1000, 2),
                    "p99": round(_percentile(v, 0.99) * 1000, 2),
                    "max": round(max(v) * 1000, 2) if v else 0.0,
                }
                for name, v in self.latencies.items()
            },
            "max_in_flight": self.max_in_flight,
            "asked_to_close": self.asked_to_close,
            "scheduler_max_behind_ms": round(self.behind * 1000, 1),
        }


def main(reactor: Any, plan_path: str) -> Deferred:
    with open(plan_path) as f:
        plan = json.load(f)
    return LoadGenerator(reactor, plan).run().addCallback(lambda summary: print(json.dumps(summary), flush=True))


if __name__ == "__main__":
    react(main, sys.argv[1:2])
