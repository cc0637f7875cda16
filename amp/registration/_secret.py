"""
amp's own CA and serving certificate in their Secret (C{registration.secret}),
reactor side: L{SecretCertificates}.

Every replica reads the Secret every C{tls.reload_interval} (one GET in the
reactor's thread pool), serves the pair it holds (L{amp.tls.ReloadingCertificate}
in memory mode: a pair that does not load never replaces a good one), and
reports what it serves in an annotation of the Secret,
C{serving.amp.txn2.com/<replica>: <sha256 of the certificate> <unix time>}
(a merge patch, when that changes and every quarter of the report
lifetime).  The replica holding the Lease also decides the next step of the
rotation (L{amp.registration._rotation.plan}, pure) from the Secret, the
time, the caBundle its watch sees in the webhook configuration and those
reports, and writes the Secret's new content (the keys are made and the
write is done in the thread pool; a write carries the resourceVersion it
read, so a report written meanwhile makes it a conflict, tried again at the
next read).  A new caBundle in the Secret tells the registration keeper to
apply it.  Nothing here makes amp unready but having no certificate yet.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import Config
from amp.kube import describe
from amp.metrics import Metrics
from amp.registration._check import bundle_certificates
from amp.registration._pki import (
    CA_BUNDLE,
    ROTATE_ANNOTATION,
    Held,
    fingerprint,
    read_reports,
    report_key,
    report_value,
    serving_names,
)
from amp.registration._rotation import Plan, Step, carry_out, plan
from amp.tls import ReloadingCertificate

if TYPE_CHECKING:
    from amp.kube import KubeClient
    from amp.reactors import IAmpReactor

__all__ = ["SecretCertificates", "report_ttl"]


def report_ttl(interval: float) -> float:
    """How old a replica's report may be before it counts as a replica gone (a minute, or 12 reads)."""
    return max(60.0, 12 * interval)


def cluster_cas(obj: Optional[Mapping[str, Any]]) -> Optional[frozenset[str]]:
    """The fingerprints of the CAs every entry's caBundle of the webhook configuration C{obj} holds."""
    if not obj:
        return None
    held: Optional[frozenset[str]] = None
    for entry in obj.get("webhooks") or ():
        if not isinstance(entry, Mapping):
            continue
        client = entry.get("clientConfig") if isinstance(entry.get("clientConfig"), Mapping) else {}
        fps = frozenset(fingerprint(c) for c in bundle_certificates((client or {}).get("caBundle")))
        held = fps if held is None else held & fps
    return held


class SecretCertificates(Service):
    """
    @param config: amp's config (C{registration}, C{tls.reload_interval},
        C{kubernetes.request_timeout}).
    @param certificate: the serving certificate, in memory mode.
    @param client: reads and writes the Secret (blocking; used in the
        thread pool).
    @param namespace: amp's namespace, the Secret's.
    @param identity: this replica's name in its report.
    @param metrics: where the holder's steps and the CAs held are counted.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        *,
        reactor: IAmpReactor,
        clock: IReactorTime,
        certificate: ReloadingCertificate,
        client: KubeClient,
        namespace: str,
        identity: str,
        metrics: Optional[Metrics] = None,
    ) -> None:
        reg = config.registration
        assert reg.secret is not None
        self._config = config
        self._reactor = reactor
        self._clock = clock
        self._certificate = certificate
        self._client = client
        self.namespace = namespace
        self.name: str = reg.secret
        self.identity = identity
        self._metrics = metrics
        self.names = serving_names(reg.service, namespace, reg.url)
        self.interval = config.tls.reload_interval
        self.ttl = report_ttl(self.interval)
        #: The caBundle the Secret holds (PEM), once read.
        self.bundle: Optional[bytes] = None
        #: Told (no arguments) each time the Secret's caBundle changes.
        self.on_bundle: list[Callable[[], None]] = []
        self.active = False
        self._term = 0
        self._busy = False
        self._again = False
        self._timer: Optional[IDelayedCall] = None
        self._cluster: dict[str, float] = {}
        self._last_plan = ""
        self._last_error = ""
        self.last_plan: Optional[Plan] = None

    # ------------------------------------------------------------ what the daemon tells it

    def startService(self) -> None:
        Service.startService(self)
        self._soon(0)

    def stopService(self) -> Any:
        Service.stopService(self)
        self.end_term()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        return None

    def start_term(self, client: KubeClient) -> None:
        """This replica holds the Lease: it keeps the Secret (with its own client)."""
        self.active = True
        self._term += 1
        self._last_plan = ""
        self.log.info(
            "Keeping amp's certificates in Secret {namespace}/{name} (registration.secret)",
            namespace=self.namespace,
            name=self.name,
        )
        self._soon(0)

    def end_term(self) -> None:
        self.active = False
        self._term += 1

    def seen(self, obj: Optional[Mapping[str, Any]]) -> None:
        """The webhook configuration as the watch has it now: which CAs the cluster trusts, since when."""
        now = self._clock.seconds()
        held = cluster_cas(obj) or frozenset()
        before = self._cluster
        self._cluster = {fp: before.get(fp, now) for fp in held}
        if self.active and set(self._cluster) != set(before):
            self._soon(0)

    # ------------------------------------------------------------ the loop

    def _soon(self, delay: float) -> None:
        if not self.running:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self._clock.seconds() + delay:
                return
            self._timer.cancel()
        self._timer = self._clock.callLater(max(0.0, delay), self._tick)

    def _in_thread(self, f: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return deferToThreadPool(self._reactor, self._reactor.getThreadPool(), f, *args)

    def _tick(self) -> None:
        self._timer = None
        if not self.running:
            return
        if self._busy:
            self._again = True  # news while reading: read again as soon as this read is done
            return
        self._busy = True
        term = self._term
        timeout = self._config.kubernetes.request_timeout
        d = self._in_thread(self._client.read_secret, self.namespace, self.name, timeout)
        d.addCallback(self._got, term)
        d.addErrback(self._failed)
        d.addBoth(self._done)

    def _done(self, _: Any) -> None:
        self._busy = False
        wake = 0.0 if self._again else self.interval
        self._again = False
        if self.active and self.last_plan is not None:
            wake = min(wake, max(0.0, self.last_plan.wake - self._clock.seconds()))
        self._soon(max(wake, 0.05))

    def _failed(self, failure: Failure) -> None:
        error = failure.value
        text = describe(error) if error is not None else "failed"
        body = getattr(error, "body", None)
        if isinstance(body, (bytes, str)):
            try:
                message = json.loads(body).get("message")
            except (ValueError, AttributeError):
                message = None
            if isinstance(message, str):
                text += f": {message[:300]}"
        if text != self._last_error:
            self.log.warn(
                "Secret {namespace}/{name}: {error}; amp's certificates are read again in {interval}s",
                namespace=self.namespace,
                name=self.name,
                error=text,
                interval=self.interval,
            )
        self._last_error = text

    def _got(self, obj: Optional[dict[str, Any]], term: int) -> Any:
        if self._last_error:
            self.log.info("Secret {namespace}/{name}: read again", namespace=self.namespace, name=self.name)
            self._last_error = ""
        self._serve(obj)
        if not self.active or term != self._term:
            return self._report(obj)
        meta = (obj or {}).get("metadata") or {}
        annotations = meta.get("annotations") or {}
        held = Held.read((obj or {}).get("data"))
        now = self._clock.seconds()
        newest = fingerprint(held.cas[-1]) if held is not None else None
        p = plan(
            held,
            now=now,
            names=self.names,
            cluster_holds=self._cluster.get(newest or ""),
            reports=read_reports(annotations),
            report_ttl=self.ttl,
            rotate_requested=ROTATE_ANNOTATION in annotations,
        )
        self.last_plan = p
        if p.step is Step.WAIT:
            if p.reason != self._last_plan:
                self.log.info("amp's certificates: {reason}", reason=p.reason, certificate_step=str(p.step))
            self._last_plan = p.reason
            return self._report(obj)
        self._last_plan = ""
        d = self._in_thread(self._write, obj, held, p, now)
        d.addCallback(self._written, p, term)
        return d

    def _written(self, obj: dict[str, Any], p: Plan, term: int) -> Any:
        level = self.log.warn if p.step is Step.CREATE and self.bundle is not None else self.log.info
        if self._metrics is not None:
            self._metrics.certificate_steps.labels(step=str(p.step)).inc()
        level(
            "Secret {namespace}/{name}: {step} ({reason})",
            namespace=self.namespace,
            name=self.name,
            step=str(p.step),
            reason=p.reason,
            certificate_step=str(p.step),
        )
        # What was just written may call for the next step: read again at once (L{_done}, p.wake is now).
        self._serve(obj)
        return self._report(obj)

    def _write(self, obj: Optional[dict[str, Any]], held: Optional[Held], p: Plan, now: float) -> dict[str, Any]:
        """In the thread pool: the keys made, the Secret written."""
        reg = self._config.registration
        new = carry_out(
            p.step, held, now=now, names=self.names, ca_validity=reg.ca_validity, cert_validity=reg.cert_validity
        )
        assert new is not None
        timeout = self._config.kubernetes.request_timeout
        annotations = {
            k: v
            for k, v in ((obj or {}).get("metadata", {}).get("annotations") or {}).items()
            if k != ROTATE_ANNOTATION
        }
        stale = {k for k, r in read_reports(annotations).items() if now - r.at > self.ttl}
        for key in stale:
            annotations.pop(key)
        if obj is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "amp"},
                },
                "data": new.data(),
            }
            return self._client.create_secret(self.namespace, body, timeout)
        body = dict(obj)
        body["metadata"] = {**obj["metadata"], "annotations": annotations}
        body["data"] = new.data()
        return self._client.replace_secret(self.namespace, self.name, body, timeout)

    def _serve(self, obj: Optional[Mapping[str, Any]]) -> None:
        """Serve the Secret's pair; tell the keeper of a new caBundle."""
        data = (obj or {}).get("data") or {}
        raw: dict[str, bytes] = {}
        for key in ("tls.crt", "tls.key", CA_BUNDLE):
            try:
                raw[key] = base64.b64decode(data.get(key) or "", validate=True)
            except (binascii.Error, ValueError):
                raw[key] = b""
        if raw["tls.crt"] and raw["tls.key"]:
            self._certificate.offer(raw["tls.crt"], raw["tls.key"], f"Secret {self.namespace}/{self.name} changed")
        if raw[CA_BUNDLE] and raw[CA_BUNDLE] != self.bundle:
            self.bundle = raw[CA_BUNDLE]
            if self._metrics is not None:
                self._metrics.certificate_authorities.set(len(bundle_certificates(self.bundle)))
            for told in self.on_bundle:
                told()

    def _report(self, obj: Optional[Mapping[str, Any]]) -> Deferred[Any]:
        """Tell the holder what this replica serves, when that changed or the last report is getting old."""
        chain = self._certificate.chain
        if obj is None or not chain:
            return succeed(None)
        serving = fingerprint(chain[0])
        key = report_key(self.identity)
        now = self._clock.seconds()
        last = read_reports((obj.get("metadata") or {}).get("annotations")).get(key)
        if last is not None and last.fingerprint == serving and now - last.at < self.ttl / 4:
            return succeed(None)
        d = self._in_thread(
            self._client.annotate_secret,
            self.namespace,
            self.name,
            {key: report_value(serving, now)},
            self._config.kubernetes.request_timeout,
        )
        d.addErrback(self._failed)
        return d
