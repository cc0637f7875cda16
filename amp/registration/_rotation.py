"""
What the Lease holder does next with amp's own certificates (pure; the
time, the Secret, the cluster's caBundle and the replicas' reports are
passed in): L{plan} decides one L{Step}, L{carry_out} makes the Secret's
new content for it.

One CA rotation, in order, each step taken only once the one before it is
seen done:

  1. C{add-ca}: at two thirds of the CA's life (or when the Secret is
     annotated L{amp.registration._pki.ROTATE_ANNOTATION}) a new CA joins
     the bundle (old + new); the serving certificate stays the old CA's.
     The keeper applies the bundle to the webhook configuration.
  2. C{issue}: once the configuration in the cluster has held the new CA in
     every entry for L{SETTLE} seconds, the serving certificate is issued
     again from the new CA; every replica reads it from the Secret.
  3. C{retire-ca}: once every replica (with a report younger than the
     report lifetime) serves that certificate, the old CA leaves the bundle.

The serving certificate alone is renewed at two thirds of its life (from
the newest CA).  A Secret without a usable CA (missing, expired, its key
lost) is made again (C{create}): reviews fail until the new bundle is
applied, which the log line says.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Optional, Sequence

from cryptography import x509

from amp.registration._pki import Held, Report, fingerprint, issue, issued_by, make_ca, names_of

__all__ = ["RENEW_AT", "SETTLE", "Plan", "Step", "carry_out", "plan"]

#: A certificate (or a CA) is replaced at this share of its life.
RENEW_AT = 2 / 3
#: Seconds the cluster's caBundle must have held a new CA before a certificate of it is served (every API
#: server's informer has it by then).
SETTLE = 5.0


class Step(StrEnum):
    """What the holder does next."""

    CREATE = "create"
    ADD_CA = "add-ca"
    ISSUE = "issue"
    RETIRE_CA = "retire-ca"
    WAIT = "wait"


@dataclass(frozen=True)
class Plan:
    """The next L{Step}, why (in words, for the log line), and when to look again at the latest (unix time)."""

    step: Step
    reason: str
    wake: float


def _life(cert: x509.Certificate) -> tuple[float, float]:
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def _due(cert: x509.Certificate) -> float:
    start, end = _life(cert)
    return start + RENEW_AT * (end - start)


def _valid(cert: x509.Certificate, now: float) -> bool:
    start, end = _life(cert)
    return start <= now < end


def plan(
    held: Optional[Held],
    *,
    now: float,
    names: Sequence[str],
    cluster_holds: Optional[float],
    reports: Mapping[str, Report],
    report_ttl: float,
    rotate_requested: bool = False,
) -> Plan:
    """
    The next step for the Secret's content C{held} (None: none usable).

    @param names: the names the serving certificate must carry.
    @param cluster_holds: since when (unix time) every entry of the
        webhook configuration in the cluster holds the newest CA of
        C{held}; None when it does not (or is not known).
    @param reports: the replicas' reports (L{amp.registration._pki.read_reports}).
    @param report_ttl: a report older than this is of a replica gone.
    @param rotate_requested: the Secret asks for a new CA now.
    """
    if held is None:
        return Plan(Step.CREATE, "no CA yet", now)
    newest = held.cas[-1]
    if held.ca_key is None:
        return Plan(Step.CREATE, "the newest CA's key is missing or not its own", now)
    if not _valid(newest, now):
        return Plan(Step.CREATE, "the newest CA has expired (or is not valid yet)", now)
    cert = held.cert
    wake = _due(newest) if len(held.cas) == 1 else now + report_ttl
    if len(held.cas) == 1 and (rotate_requested or now >= _due(newest)):
        return Plan(
            Step.ADD_CA,
            "requested by the annotation"
            if rotate_requested and now < _due(newest)
            else "two thirds of the CA's life passed",
            now,
        )
    if cert is None or held.key is None:
        return Plan(Step.ISSUE, "no serving certificate (or its key is missing)", now)
    trusted = [ca for ca in held.cas if _valid(ca, now)]
    if not _valid(cert, now) or not any(issued_by(cert, ca) for ca in trusted):
        return Plan(Step.ISSUE, "the serving certificate has expired or no CA of the bundle signed it", now)
    if not issued_by(cert, newest):
        if cluster_holds is None:
            return Plan(
                Step.WAIT, "waiting for the caBundle in the cluster to hold the new CA", min(wake, now + SETTLE)
            )
        if now < cluster_holds + SETTLE:
            return Plan(Step.WAIT, "the caBundle in the cluster holds the new CA; settling", cluster_holds + SETTLE)
        return Plan(Step.ISSUE, "the caBundle in the cluster holds the new CA", now)
    missing = set(names) - names_of(cert)
    if missing:
        return Plan(Step.ISSUE, f"the serving certificate does not name {', '.join(sorted(missing))}", now)
    if now >= _due(cert):
        return Plan(Step.ISSUE, "two thirds of the serving certificate's life passed", now)
    wake = min(wake, _due(cert))
    if len(held.cas) > 1:
        serving = fingerprint(cert)
        live = {k: r for k, r in reports.items() if now - r.at <= report_ttl}
        stale = sorted(k for k, r in live.items() if r.fingerprint != serving)
        if live and not stale:
            return Plan(Step.RETIRE_CA, f"every replica ({len(live)}) serves a certificate of the new CA", now)
        if not any(_valid(ca, now) for ca in held.cas[:-1]):
            return Plan(Step.RETIRE_CA, "the old CA has expired", now)
        left = ", ".join(k.rsplit("/", 1)[-1] for k in stale) or "none reported yet"
        return Plan(Step.WAIT, f"waiting for every replica to serve the new certificate ({left})", wake)
    return Plan(Step.WAIT, "nothing due", wake)


def carry_out(
    step: Step, held: Optional[Held], *, now: float, names: Sequence[str], ca_validity: float, cert_validity: float
) -> Optional[Held]:
    """The Secret's content after C{step} (None for L{Step.WAIT}); keys are made here."""
    if step is Step.WAIT:
        return None
    if step is Step.CREATE or held is None:
        ca, ca_key = make_ca(now, ca_validity)
        cert, key = issue(ca, ca_key, names, now, cert_validity)
        return Held((ca,), ca_key, cert, key)
    if step is Step.ADD_CA:
        ca, ca_key = make_ca(now, ca_validity)
        return Held((*held.cas, ca), ca_key, held.cert, held.key)
    if step is Step.ISSUE:
        cert, key = issue(held.cas[-1], held.ca_key, names, now, cert_validity)
        return Held(held.cas, held.ca_key, cert, key)
    return Held(held.cas[-1:], held.ca_key, held.cert, held.key)
