"""
amp's own CA and serving certificate (amp.registration._rotation, _pki),
without a reactor: time is a twisted Clock's, the cluster's caBundle and
the replicas' reports are given.  A whole CA rotation is walked through:
the new CA joins the bundle first, the serving certificate moves to it only
once the cluster holds it (and has settled), and the old CA leaves only
when every live replica serves the new certificate.
"""

from __future__ import annotations

from typing import Optional

from twisted.internet.task import Clock

from amp.registration._pki import (
    Held,
    Report,
    fingerprint,
    issued_by,
    names_of,
    read_reports,
    report_key,
    report_value,
    serving_names,
)
from amp.registration._rotation import SETTLE, Step, carry_out, plan

T0 = 1_767_225_600.0
NAMES = serving_names("amp", "amp-system", "https://127.0.0.1:8443/mutate")
CA_LIFE, CERT_LIFE, TTL = 3000.0, 900.0, 60.0


def step(
    held: Optional[Held],
    clock: Clock,
    *,
    holds: Optional[float] = None,
    reports: Optional[dict[str, Report]] = None,
    rotate: bool = False,
) -> tuple[Step, Optional[Held], float]:
    p = plan(
        held,
        now=clock.seconds(),
        names=NAMES,
        cluster_holds=holds,
        reports=reports or {},
        report_ttl=TTL,
        rotate_requested=rotate,
    )
    new = carry_out(p.step, held, now=clock.seconds(), names=NAMES, ca_validity=CA_LIFE, cert_validity=CERT_LIFE)
    return p.step, new, p.wake


def round_trip(held: Held) -> Held:
    """Through the Secret's data, as the replicas read it."""
    read = Held.read(held.data())
    assert read is not None
    return read


def test_a_missing_or_unusable_secret_is_made_with_a_ca_and_a_certificate_of_it() -> None:
    clock = Clock()
    clock.advance(T0)
    got, held, _ = step(None, clock)
    assert got is Step.CREATE and held is not None
    held = round_trip(held)
    assert len(held.cas) == 1 and held.cert is not None and issued_by(held.cert, held.cas[0])
    assert set(NAMES) <= names_of(held.cert) and "127.0.0.1" in names_of(held.cert)
    assert held.cert.not_valid_after_utc.timestamp() == T0 + CERT_LIFE
    assert step(held, clock)[0] is Step.WAIT
    # The CA's key lost, or garbage: made again.
    data = held.data()
    del data["ca.key"]
    assert step(Held.read(data), clock)[0] is Step.CREATE
    assert Held.read({"ca.crt": "bm90IGEgY2VydA=="}) is None
    assert Held.read(None) is None


def test_the_serving_certificate_is_renewed_at_two_thirds_of_its_life() -> None:
    clock = Clock()
    clock.advance(T0)
    _, held, _ = step(None, clock)
    assert held is not None
    got, _, wake = step(held, clock)
    assert got is Step.WAIT and wake == T0 + (CERT_LIFE + 60) * 2 / 3 - 60
    clock.advance(wake - T0 - 1)
    assert step(held, clock)[0] is Step.WAIT
    clock.advance(1)
    got, renewed, _ = step(held, clock)
    assert got is Step.ISSUE and renewed is not None and renewed.cert is not None and held.cert is not None
    assert renewed.cas == held.cas and renewed.cert.serial_number != held.cert.serial_number
    assert step(renewed, clock)[0] is Step.WAIT


def test_a_certificate_never_outlives_its_ca_nor_misses_a_name() -> None:
    clock = Clock()
    clock.advance(T0)
    _, held, _ = step(None, clock)
    assert held is not None and held.cert is not None
    p = plan(held, now=T0, names=(*NAMES, "amp.other.svc"), cluster_holds=None, reports={}, report_ttl=TTL)
    assert p.step is Step.ISSUE and "amp.other.svc" in p.reason
    new = carry_out(Step.ISSUE, held, now=T0 + 2500, names=NAMES, ca_validity=CA_LIFE, cert_validity=CERT_LIFE)
    assert new is not None and new.cert is not None
    assert new.cert.not_valid_after_utc == held.cas[0].not_valid_after_utc


def test_a_ca_rotation_overlaps_until_every_replica_serves_the_new_certificate() -> None:
    clock = Clock()
    clock.advance(T0)
    _, held, _ = step(None, clock)
    assert held is not None
    # Keep the serving certificate fresh so that only the CA is due.
    clock.advance(1970)
    assert step(held, clock)[0] is Step.ISSUE
    held = carry_out(Step.ISSUE, held, now=clock.seconds(), names=NAMES, ca_validity=CA_LIFE, cert_validity=CERT_LIFE)
    assert held is not None and held.cert is not None
    old_ca, old_cert = held.cas[0], held.cert
    clock.advance(10)  # two thirds of the CA's life (it starts 60 s early)
    got, held, _ = step(held, clock)
    assert got is Step.ADD_CA and held is not None
    held = round_trip(held)
    assert len(held.cas) == 2 and held.cas[0] == old_ca and held.cert == old_cert
    new_ca = held.cas[1]
    # 1. The serving certificate stays the old CA's until the cluster holds both, and settled.
    got, same, wake = step(held, clock)
    assert got is Step.WAIT and same is None and wake <= clock.seconds() + SETTLE
    seen = clock.seconds() + 2
    clock.advance(2)
    got, _, wake = step(held, clock, holds=seen)
    assert got is Step.WAIT and wake == seen + SETTLE
    clock.advance(SETTLE)
    got, held, _ = step(held, clock, holds=seen)
    assert got is Step.ISSUE and held is not None and held.cert is not None
    assert issued_by(held.cert, new_ca) and len(held.cas) == 2
    new = fingerprint(held.cert)
    # 2. The old CA stays while a live replica still serves the old certificate, or none reported.
    assert step(held, clock, holds=seen)[0] is Step.WAIT
    now = clock.seconds()
    reports = {report_key("amp-1"): Report(new, now), report_key("amp-2"): Report(fingerprint(old_cert), now)}
    p = plan(held, now=now, names=NAMES, cluster_holds=seen, reports=reports, report_ttl=TTL)
    assert p.step is Step.WAIT and "amp-2" in p.reason
    # 3. ... until it serves the new one (or its report is so old it is gone).
    reports[report_key("amp-2")] = Report(new, now)
    got, held, _ = step(held, clock, holds=seen, reports=reports)
    assert got is Step.RETIRE_CA and held is not None and held.cas == (new_ca,)
    clock.advance(TTL + 1)
    gone = {report_key("amp-3"): Report(fingerprint(old_cert), now)}
    two = carry_out(Step.ADD_CA, held, now=clock.seconds(), names=NAMES, ca_validity=CA_LIFE, cert_validity=CERT_LIFE)
    assert two is not None
    two = carry_out(Step.ISSUE, two, now=clock.seconds(), names=NAMES, ca_validity=CA_LIFE, cert_validity=CERT_LIFE)
    assert two is not None and two.cert is not None
    live = {report_key("amp-1"): Report(fingerprint(two.cert), clock.seconds())}
    assert step(two, clock, holds=seen, reports={**gone, **live})[0] is Step.RETIRE_CA


def test_an_operator_can_ask_for_a_new_ca_now() -> None:
    clock = Clock()
    clock.advance(T0)
    _, held, _ = step(None, clock)
    got, rotated, _ = step(held, clock, rotate=True)
    assert got is Step.ADD_CA and rotated is not None and len(rotated.cas) == 2
    # During a rotation, another request starts nothing new.
    assert step(rotated, clock, rotate=True)[0] is Step.WAIT


def test_an_expired_serving_certificate_is_issued_again_even_before_the_cluster_holds_the_new_ca() -> None:
    clock = Clock()
    clock.advance(T0)
    _, held, _ = step(None, clock)
    _, held, _ = step(held, clock, rotate=True)
    assert held is not None
    clock.advance(CERT_LIFE)
    got, held, _ = step(held, clock)
    assert got is Step.ISSUE and held is not None and held.cert is not None and issued_by(held.cert, held.cas[1])


def test_reports_are_annotations_with_safe_names() -> None:
    assert report_key("amp-7d9f-x_1a2b") == "serving.amp.txn2.com/amp-7d9f-x_1a2b"
    long = report_key("a" * 200 + "/weird name")
    assert long.startswith("serving.amp.txn2.com/") and len(long.split("/", 1)[1]) <= 63
    assert report_key("a" * 200) != report_key("a" * 199 + "b")
    annotations = {report_key("r1"): report_value("ab12", 1000.7), report_key("r2"): "garbage", "other.io/x": "ab12 1"}
    assert read_reports(annotations) == {report_key("r1"): Report("ab12", 1000.0)}
