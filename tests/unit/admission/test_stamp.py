"""
The status stamp across the rounds of one admission (L{amp.stamp}): the
API server calls amp again when something changed the Pod after it
(C{reinvocationPolicy: IfNeeded}), and once per webhook entry that
registers amp.  Every sequence of two rounds, mutated, unchanged or
failed in each, for one endpoint and for two entries with an endpoint
each: first as the pure merge, then through the Admitter on a Clock with
endpoints in memory (see tests/unit/admission/test_admission.py).
"""

from __future__ import annotations

import itertools
import json
from typing import Optional

from twisted.trial.unittest import SynchronousTestCase

from amp.reasons import Status
from amp.stamp import STATUS_ANNOTATION, STATUS_LIMIT, Mark, next_stamp, parse_stamp, render_stamp
from tests.support.helpers import apply_patch, make_config, namespace, pod, review_bytes
from tests.unit.admission.test_admission import Canned, Harness, answered

X = "http://127.0.0.1:8091"
Y = "http://127.0.0.1:8092"

#: A round's outcome for one endpoint, by letter: Mutated, Unchanged, Failed.
KINDS = "MUF"


def outcome(name: str, kind: str, reason: str = "http-5xx") -> tuple[str, Status, str]:
    status = {"M": Status.MUTATED, "U": Status.UNCHANGED, "F": Status.SKIPPED}[kind]
    return (name, status, reason if kind == "F" else "")


#: What one endpoint's stamp says after two rounds (the second round's
#: failure, if any, is a timeout).
ONE_ENDPOINT = {
    "MM": "mutated X",
    "MU": "mutated X",
    "MF": "skipped timeout X; mutated X",
    "UM": "mutated X",
    "UU": "unchanged X",
    "UF": "skipped timeout X",
    "FM": "mutated X",
    "FU": "unchanged X",
    "FF": "skipped timeout X",
}

#: The second rounds (of one endpoint) that change nothing, not even the stamp.
NOTHING_CHANGES = {"MU", "UU", "FF"}

#: The stamp after a round of one webhook entry (endpoint X), then a round
#: of another (endpoint Y): neither erases the other's; the last round's
#: endpoints come first.
TWO_ENTRIES = {
    "MM": "mutated Y X",
    "MU": "mutated X; unchanged Y",
    "MF": "skipped timeout Y; mutated X",
    "UM": "mutated Y; unchanged X",
    "UU": "unchanged Y X",
    "UF": "skipped timeout Y; unchanged X",
    "FM": "skipped http-5xx X; mutated Y",
    "FU": "skipped http-5xx X; unchanged Y",
    "FF": "skipped timeout Y; skipped http-5xx X",
}


def named(value: str) -> str:
    return value.replace(" X", f" {X}").replace(" Y", f" {Y}")


class MergeTests(SynchronousTestCase):
    """L{next_stamp}: the stamp the Pod came with and this round's outcomes."""

    def test_every_two_rounds_of_one_endpoint(self) -> None:
        for first, second in itertools.product(KINDS, repeat=2):
            with self.subTest(rounds=first + second):
                after_first = next_stamp(None, [outcome(X, first)])
                after_second = next_stamp(after_first, [outcome(X, second, "timeout")])
                self.assertEqual(after_second, named(ONE_ENDPOINT[first + second]))

    def test_every_two_rounds_of_two_webhook_entries(self) -> None:
        for first, second in itertools.product(KINDS, repeat=2):
            with self.subTest(rounds=first + second):
                after_first = next_stamp(None, [outcome(X, first)])
                after_second = next_stamp(after_first, [outcome(Y, second, "timeout")])
                self.assertEqual(after_second, named(TWO_ENTRIES[first + second]))

    def test_a_mutation_is_remembered_through_a_failed_round(self) -> None:
        """Mutated, failed, then unchanged: the first round's change is on the Pod."""
        value = None
        for kind in "MFU":
            value = next_stamp(value, [outcome(X, kind)])
        self.assertEqual(value, f"mutated {X}")

    def test_a_chain_names_each_step_by_what_it_did(self) -> None:
        value = next_stamp(None, [outcome(X, "M"), outcome(Y, "U"), outcome("http://z", "F")])
        self.assertEqual(value, f"skipped http-5xx http://z; mutated {X}; unchanged {Y}")
        value = next_stamp(value, [outcome(X, "U"), outcome(Y, "U"), outcome("http://z", "M")])
        self.assertEqual(value, f"mutated {X} http://z; unchanged {Y}")
        # Another entry's round: its endpoint first, then the ones before.
        self.assertEqual(
            next_stamp(value, [("http://w", Status.UNCHANGED, "")]), f"mutated {X} http://z; unchanged http://w {Y}"
        )

    def test_what_a_round_stamps_reads_back_as_it_was_written(self) -> None:
        marks = {X: Mark(True, "timeout"), Y: Mark(), "(none)": Mark(False, "no-endpoint"), "http://z": Mark(True)}
        self.assertEqual(parse_stamp(render_stamp(marks)), marks)
        for value in ONE_ENDPOINT.values():
            self.assertEqual(render_stamp(parse_stamp(named(value))), named(value))


class HandWrittenStampTests(SynchronousTestCase):
    """
    A Pod may be created with a stamp in its manifest (written by hand, or
    copied from another Pod): amp cannot tell it from an earlier round's.
    """

    def test_a_hand_written_mutated_stays_when_the_endpoint_changes_nothing(self) -> None:
        self.assertEqual(next_stamp(f"mutated {X}", [outcome(X, "U")]), f"mutated {X}")

    def test_it_cannot_hide_a_failure_of_this_round(self) -> None:
        self.assertEqual(next_stamp(f"mutated {X}", [outcome(X, "F")]), f"skipped http-5xx {X}; mutated {X}")
        self.assertEqual(
            next_stamp(f"unchanged {X}; mutated {X}", [outcome(X, "F")]), f"skipped http-5xx {X}; mutated {X}"
        )

    def test_what_cannot_be_read_is_dropped(self) -> None:
        for value in (
            "all good",
            "",
            "skipped",
            "skipped Not-A-Reason http://a",
            "mutated",
            ";;; ; ",
            "MUTATED http://a",
            "\x00",
        ):
            with self.subTest(value=value):
                self.assertEqual(next_stamp(value, [outcome(X, "U")]), f"unchanged {X}")
        self.assertEqual(next_stamp("garbage; mutated http://a", [outcome(X, "U")]), f"mutated http://a; unchanged {X}")
        self.assertEqual(
            next_stamp("mutated http://a\x1b[2J http://b", [outcome(X, "U")]), f"mutated http://b; unchanged {X}"
        )

    def test_a_long_value_leaves_out_other_endpoints_before_this_rounds(self) -> None:
        others = "; ".join(f"mutated http://other-{i}.example" for i in range(40))
        value = next_stamp(others + " " + "x" * 5000, [outcome(X, "F"), outcome(Y, "M")])
        self.assertLessEqual(len(value), STATUS_LIMIT)
        self.assertTrue(value.startswith(f"skipped http-5xx {X}; mutated {Y} http://other-0.example "), value)
        self.assertNotIn("http://other-39.example", value)
        self.assertNotIn("x" * 10, value)


# ---------------------------------------------------------------- through the Admitter


class Behaviour:
    """Sets a Canned endpoint to mutate (a label it adds again each time), change nothing, or fail."""

    @staticmethod
    def set(endpoint: Canned, kind: str, label: str, failure: int = 500) -> None:
        endpoint.code = failure if kind == "F" else 200
        endpoint.body = json.dumps(
            [{"op": "add", "path": f"/metadata/labels/{label}", "value": "1"}] if kind == "M" else []
        ).encode()


def review_round(case: SynchronousTestCase, h: Harness, the_pod: dict) -> tuple[dict, Optional[list]]:
    """One round: the Pod as the API server stores it after amp's answer, and amp's patch (None without one)."""
    response, _ = answered(case, h.review(review_bytes(the_pod)))
    patch = response.get("_patch")
    return apply_patch(the_pod, patch), patch


class AdmissionRoundsTests(SynchronousTestCase):
    """
    Two rounds of reviews for one Pod, each on the Pod as the round before
    left it (as the API server reinvokes amp); the second round answers no
    patch at all when it changes nothing, its stamp included.
    """

    def harness(self, origin: str, endpoint: Canned) -> Harness:
        config = make_config({"team-a": namespace(origin + "/test/ep", failure_policy="Ignore")})
        return Harness(config, ep=endpoint)

    def test_every_two_rounds_of_one_endpoint(self) -> None:
        for first, second in itertools.product(KINDS, repeat=2):
            with self.subTest(rounds=first + second):
                endpoint = Canned()
                h = self.harness(X, endpoint)
                Behaviour.set(endpoint, first, "x")
                the_pod, _ = review_round(self, h, pod(labels={"app": "web"}))
                Behaviour.set(endpoint, second, "x")
                stored, patch = review_round(self, h, the_pod)
                # Both failures here are http-5xx.
                expected = named(ONE_ENDPOINT[first + second].replace("timeout", "http-5xx"))
                self.assertEqual(stored["metadata"]["annotations"], {STATUS_ANNOTATION: expected})
                self.assertEqual(stored["metadata"]["labels"].get("x"), "1" if "M" in first + second else None)
                if first + second in NOTHING_CHANGES:
                    # Nothing changed, the stamp included: no patch to record.
                    self.assertIsNone(patch)
                else:
                    self.assertIsNotNone(patch)

    def test_every_two_rounds_of_two_webhook_entries(self) -> None:
        """Two amps (two entries, an endpoint each) review the one Pod in turn."""
        for first, second in itertools.product(KINDS, repeat=2):
            with self.subTest(rounds=first + second):
                x, y = Canned(), Canned()
                Behaviour.set(x, first, "x")
                Behaviour.set(y, second, "y", failure=404)
                the_pod, _ = review_round(self, self.harness(X, x), pod(labels={"app": "web"}))
                stored, _ = review_round(self, self.harness(Y, y), the_pod)
                expected = named(TWO_ENTRIES[first + second].replace("timeout", "http-4xx"))
                self.assertEqual(stored["metadata"]["annotations"][STATUS_ANNOTATION], expected)

    def test_a_round_that_changes_nothing_sends_no_patch(self) -> None:
        """The reinvoked round of an idempotent endpoint: allowed, no patch, the first round's stamp stays."""
        h = Harness(make_config({"team-a": namespace(X + "/user-env")}))
        first, patch = review_round(self, h, pod(annotations={"hub.jupyter.org/username": "alice"}))
        self.assertIsNotNone(patch)
        response, outcome = answered(self, h.review(review_bytes(first)))
        self.assertNotIn("patch", response)
        self.assertNotIn("patchType", response)
        self.assertEqual((outcome.result, outcome.patch_size), ("allowed", 0))
        self.assertEqual(first["metadata"]["annotations"][STATUS_ANNOTATION], f"mutated {X}")

    def test_the_legacy_annotation_is_still_removed_when_the_stamp_stays(self) -> None:
        the_pod = pod(annotations={STATUS_ANNOTATION: f"unchanged {X}", "amp.txn2.com/skipped": "http-5xx: x"})
        stored, patch = review_round(self, Harness(make_config({"team-a": namespace(X + "/noop")})), the_pod)
        self.assertEqual(patch, [{"op": "remove", "path": "/metadata/annotations/amp.txn2.com~1skipped"}])
        self.assertEqual(stored["metadata"]["annotations"], {STATUS_ANNOTATION: f"unchanged {X}"})
