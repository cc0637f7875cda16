"""
Untrusted text on the offline paths:

  - every line amp's command line tools print goes through one helper
    (L{amp.text.terminal}): control characters that came from a Pod, a
    namespace, a recording or an endpoint reach the operator's terminal
    escaped, in each command's text output;
  - C{amp replay} handles malformed input one line each, named by
    C{file:line}, in bounded memory: a bounded sample of bad lines and a
    count of the rest, its report streamed in the recording's order.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any, Iterator

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from amp.cli import dispatch
from amp.cli.replay_run import UNREADABLE_SAMPLE, ReplayOptions, read_recording, replay
from amp.metrics import Metrics
from amp.record import decode_line
from amp.text import terminal
from tests.support.helpers import make_config, pod
from tests.unit.cli.test_explain import ENV_OP, Files, config_text, ns, run_sync
from tests.unit.cli.test_replay import _Answers, _recording

#: What a terminal would act on: none of it may be printed raw (a line
#: feed only ends a line).
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

#: Control characters as an attacker would plant them: an escape sequence
#: (clear the screen, set the title), BEL, backspaces, a carriage return
#: that rewrites the line, a line feed that forges one, a C1 CSI, a
#: right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x08\x08\rX\nforged\x9b31m\u202e"


def assertSafe(case: Any, text: str) -> None:
    found = UNSAFE.findall(text)
    case.assertEqual(found, [], f"raw control characters in {text!r}")


# ---------------------------------------------------------------- the helper


class TerminalTests(SynchronousTestCase):
    def test_each_kind_of_control_character_is_escaped(self) -> None:
        for char, shown in (
            ("\x1b", "\\x1b"),
            ("\x07", "\\x07"),
            ("\x08", "\\x08"),
            ("\r", "\\x0d"),
            ("\n", "\\x0a"),
            ("\t", "\\x09"),
            ("\x00", "\\x00"),
            ("\x7f", "\\x7f"),
            ("\x9b", "\\x9b"),
            ("\u2028", "\\u2028"),
            ("\u202e", "\\u202e"),
            ("\u2066", "\\u2066"),
            ("\udc80", "\\udc80"),
        ):
            self.assertEqual(terminal(f"a{char}b"), f"a{shown}b")

    def test_printable_text_is_left_as_it_is(self) -> None:
        for text in ("web-1", "team-a/web (rec.jsonl:3)", "café ☕ 日本", "a\\x1b (a backslash, not an escape)"):
            self.assertEqual(terminal(text), text)

    def test_the_result_is_always_safe_and_encodable(self) -> None:
        text = terminal("".join(map(chr, range(0, 0xE000))))
        assertSafe(self, text)
        text.encode("utf-8")


# ---------------------------------------------------------------- amp explain


class ExplainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.files = Files(self)
        self.config = self.files.write(
            "amp.yaml",
            config_text(
                {"team-a": ns("http://injector.example:8080/mutate")}, endpoints={"allow": ["http://*.example:*/*"]}
            ),
        )

    def test_values_from_the_pod_and_the_endpoint_are_escaped_in_the_text(self) -> None:
        hostile_pod = pod(
            f"web{HOSTILE}",
            labels={"app": HOSTILE},
            annotations={"amp.txn2.com/stauts": HOSTILE, f"note{HOSTILE}": "x"},
        )
        path = self.files.write("pod.json", hostile_pod)
        reply = self.files.write(
            "reply.json",
            {
                "patch": [ENV_OP, {"op": "add", "path": "/metadata/labels/k", "value": HOSTILE}],
                "warnings": [f"careful{HOSTILE}"],
                "auditAnnotations": {"note": HOSTILE},
            },
        )
        ran = run_sync(self, ["--config", self.config, "-n", "team-a", "--reply", reply, path])
        self.assertEqual(ran.status, 0, ran.err)
        assertSafe(self, ran.out)
        self.assertIn(
            "Pod web\\x1b[2J\\x1b]0;owned\\x07\\x08\\x08\\x0dX\\x0aforged\\x9b31m\\u202e in namespace team-a", ran.out
        )
        # The near-miss key, the warning, and the YAML diff of the Pod.
        self.assertIn("annotation amp.txn2.com/stauts is not read by amp", ran.out)
        self.assertIn("careful\\x1b[2J", ran.out)
        # Denied, with the endpoint's message.
        deny = self.files.write("deny.json", {"allowed": False, "status": {"code": 403, "message": HOSTILE}})
        ran = run_sync(self, ["--config", self.config, "-n", "team-a", "--reply", deny, path])
        self.assertEqual(ran.status, 3, ran.err)
        assertSafe(self, ran.out)
        self.assertIn("\\x1b]0;owned\\x07", ran.out)

    def test_json_output_is_ascii(self) -> None:
        path = self.files.write("pod.json", pod(f"web{HOSTILE}"))
        reply = self.files.write("reply.json", [])
        ran = run_sync(self, ["--config", self.config, "-n", "team-a", "--reply", reply, "-o", "json", path])
        self.assertTrue(ran.out.isascii())
        self.assertEqual(ran.json["pod"]["metadata"]["name"], f"web{HOSTILE}")

    def test_an_error_naming_the_input_is_escaped(self) -> None:
        path = self.files.write(f"pod{HOSTILE.replace('/', '')}.json", "{not json")
        ran = run_sync(self, ["--config", self.config, "-n", "team-a", path])
        self.assertEqual(ran.status, 2)
        assertSafe(self, ran.err.rstrip("\n"))

    def test_an_unknown_command_is_escaped(self) -> None:
        out, err = io.StringIO(), io.StringIO()
        status = dispatch([f"expl{HOSTILE}"], Clock(), stdout=out, stderr=err).result
        self.assertEqual(status, 2)
        assertSafe(self, err.getvalue().rstrip("\n"))


# ---------------------------------------------------------------- amp replay


def _hostile_recording() -> bytes:
    """One recorded review whose namespace, Pod name and new keys hold control characters."""
    from tests.unit.cli.test_replay import _recording as lines

    [line] = lines(
        1,
        labels={"amp.txn2.com/enabled": "true"},
        annotations={"amp.txn2.com/ep": "http://127.0.0.1:1/a"},
        namespace=f"team{HOSTILE}",
        request_body=json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE",
                    "namespace": f"team{HOSTILE}",
                    "object": pod(f"web{HOSTILE}", annotations={"a": "b"}),
                },
            }
        ).encode(),
    )
    return line


def _replay(argv: list[str], stdin: bytes = b"", client: Any = None) -> tuple[int, str, str]:
    from amp.cli.replay import run

    out, err = io.StringIO(), io.StringIO()
    done = run(argv, MemoryReactorClock(), stdin=io.BytesIO(stdin), stdout=out, stderr=err, endpoint_client=client)
    return done.result, out.getvalue(), err.getvalue()


class ReplayTextTests(SynchronousTestCase):
    def test_values_from_the_recording_and_the_endpoint_are_escaped_in_the_text(self) -> None:
        client = _Answers({"/a": [{"op": "add", "path": f"/metadata/annotations/k{HOSTILE}", "value": HOSTILE}]})
        files = Files(self)
        name = files.write(f"rec{HOSTILE.replace('/', '')}.jsonl", _hostile_recording() + b"{bad\n")
        status, out, err = _replay([name, "--config", files.write("amp.yaml", config_text({}))], client=client)
        self.assertEqual(status, 2, err)
        assertSafe(self, out.replace("\n", ""))
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("different  team\\x1b[2J"), lines)
        self.assertIn("/web\\x1b[2J", lines[0])
        self.assertIn("    /metadata/annotations/k\\x1b[2J", out)
        self.assertIn("rec\\x1b[2J\\x1b]0;owned\\x07\\x08\\x08\\x0dX\\x0aforged\\x9b31m\\u202e.jsonl:2: ", out)
        self.assertTrue(lines[-1].startswith("replayed 2 reviews"), lines)

    def test_a_file_that_cannot_be_read_is_named_escaped(self) -> None:
        status, _, err = _replay([f"missing{HOSTILE.replace('/', '')}.jsonl"])
        self.assertEqual(status, 2)
        assertSafe(self, err.rstrip("\n"))


# ---------------------------------------------------------------- malformed recordings


def _good(n: int = 1) -> bytes:
    return b"".join(_recording(n))


BAD_LINES: dict[str, bytes] = {
    "not JSON": b"{not json",
    "not UTF-8": b'{"amp_recording": 1, "x": "\xff\xfe"}',
    "nested too deep": b"[" * 200 + b"]" * 200,
    "not an object": b"[1, 2]",
    "another format": b'{"amp_recording": 2}',
    "no review": b'{"amp_recording": 1, "review": {}}',
    "a namespace that is not an object": b'{"amp_recording": 1, "review": {"request": {}}, "namespace": "x", '
    b'"answer": {"result": "r"}}',
    "labels that are not strings": b'{"amp_recording": 1, "review": {"request": {}}, "namespace": {"name": "x", '
    b'"labels": {"a": 1}}, "answer": {"result": "r"}}',
    "a patch that is not a list": b'{"amp_recording": 1, "review": {"request": {}}, "namespace": {"name": "x"}, '
    b'"answer": {"result": "r", "patch": 3}}',
    "no answer": b'{"amp_recording": 1, "review": {"request": {}}, "namespace": {"name": "x"}}',
    "a lone surrogate": _good()
    .replace(b'"namespace":{"name":"team-a"', b'"namespace":{"name":"team\\udc80"')
    .rstrip(b"\n"),
    "a lone surrogate in the review": _good()
    .replace(b'"namespace": "team-a"', b'"namespace": "\\udc80"')
    .rstrip(b"\n"),
    "NaN": _good().replace(b'"amp_recording":1', b'"amp_recording":NaN').rstrip(b"\n"),
}


class MalformedRecordingTests(SynchronousTestCase):
    def test_every_kind_of_bad_line_is_named_by_file_and_line(self) -> None:
        files = Files(self)
        body = _good() + b"\n".join(BAD_LINES.values()) + b"\n" + _good()
        path = files.write("rec.jsonl", body)
        status, out, err = _replay([path, "-o", "json"])
        self.assertEqual(status, 2, err)
        report = json.loads(out)
        self.assertEqual(report["summary"]["unreadable"], len(BAD_LINES))
        self.assertEqual(report["summary"]["same"], 2)
        for (kind, _), (number, message) in zip(BAD_LINES.items(), enumerate(report["unreadable"], start=2)):
            self.assertTrue(message.startswith(f"{path}:{number}: "), (kind, message))
        self.assertIn(
            "not valid Unicode (a lone surrogate escape) at namespace.name",
            report["unreadable"][list(BAD_LINES).index("a lone surrogate")],
        )
        self.assertIn(
            "at review.request.namespace", report["unreadable"][list(BAD_LINES).index("a lone surrogate in the review")]
        )

    def test_a_line_over_the_limit_is_named_and_skipped_unread(self) -> None:
        import amp.cli.replay_run as module

        good = _good()
        self.patch(module, "LINE_LIMIT", len(good))
        items = list(read_recording("rec.jsonl", io.BytesIO(b"x" * (5 * len(good)) + b"\n" + good)))
        self.assertEqual(str(items[0]), f"rec.jsonl:1: line is longer than {len(good)} bytes")
        self.assertEqual(items[1].where, "rec.jsonl:2")

    def test_many_bad_lines_keep_a_bounded_sample_and_count_the_rest(self) -> None:
        count = 20_000
        stdin = b"x\n" * count + _good(3)
        for output in ("text", "json"):
            status, out, err = _replay(["-", "-o", output], stdin=stdin)
            self.assertEqual(status, 2, err)
            if output == "json":
                report = json.loads(out)
                self.assertEqual(
                    report["summary"],
                    {"reviews": count + 3, "same": 3, "different": 0, "failed": 0, "unreadable": count},
                )
                self.assertEqual(len(report["unreadable"]), UNREADABLE_SAMPLE)
                self.assertEqual(report["unreadable_not_shown"], count - UNREADABLE_SAMPLE)
                self.assertEqual(
                    [m.split(": ")[0] for m in report["unreadable"]],
                    [f"stdin:{i}" for i in range(1, UNREADABLE_SAMPLE + 1)],
                )
            else:
                lines = out.splitlines()
                self.assertEqual(len(lines), UNREADABLE_SAMPLE + 2)
                self.assertEqual(
                    lines[UNREADABLE_SAMPLE],
                    f"unreadable ... and {count - UNREADABLE_SAMPLE} more lines (the first "
                    f"{UNREADABLE_SAMPLE} are shown)",
                )
                self.assertEqual(
                    lines[-1],
                    f"replayed {count + 3} reviews against the recorded answers: 3 same, "
                    f"0 different, 0 failed, {count} unreadable",
                )

    def test_a_line_whose_replay_fails_unforeseen_is_one_named_line(self) -> None:
        from amp.cli.replay_run import Replayer

        real = Replayer.replay_one

        def replay_one(self: Any, recorded: Any) -> Any:
            if recorded.where == "rec:2":
                raise KeyError("surprise")
            return real(self, recorded)

        self.patch(Replayer, "replay_one", replay_one)
        recorded = [decode_line(line.rstrip(b"\n"), f"rec:{i}") for i, line in enumerate(_recording(3), start=1)]
        report = replay(MemoryReactorClock(), ReplayOptions(config=make_config()), recorded, None, Metrics()).result
        self.assertEqual(report.counts()["same"], 2)
        self.assertEqual(report.unreadable, ["rec:2: cannot be replayed: KeyError: 'surprise'"])


class _Held:
    """An endpoint client whose calls wait until the test answers them, by path."""

    def __init__(self) -> None:
        self.waiting: list[tuple[str, Deferred]] = []

    def call(self, request: Any, receiver: Any) -> None:
        """Hold C{request} until the test answers it (told to C{receiver} then)."""
        from amp.endpoint import CallReply
        from amp.reply import EndpointDecision

        d: Deferred = Deferred()
        self.waiting.append((request.url.path, d))
        d.addCallback(lambda patch: CallReply(EndpointDecision(patch=patch), lambda outcome: None)).addCallbacks(
            receiver.replied, receiver.failed
        )

    def answer(self, index: int, patch: list) -> None:
        path, d = self.waiting[index]
        d.callback(patch)


def _enabled_recording(count: int) -> list[Any]:
    lines = _recording(
        count, labels={"amp.txn2.com/enabled": "true"}, annotations={"amp.txn2.com/ep": "http://127.0.0.1:1/a"}
    )
    return [decode_line(line.rstrip(b"\n"), f"rec:{i}") for i, line in enumerate(lines, start=1)]


class StreamingTests(SynchronousTestCase):
    CHANGE = [{"op": "add", "path": "/metadata/labels/new", "value": "1"}]

    def test_each_review_is_reported_once_the_ones_before_it_are_done(self) -> None:
        client = _Held()
        seen: list[str] = []
        done = replay(
            MemoryReactorClock(),
            ReplayOptions(config=make_config(), concurrency=3),
            _enabled_recording(3),
            client,
            Metrics(),
            emit=lambda r: seen.append(r.recorded.where),
        )
        self.assertEqual(len(client.waiting), 3)
        client.answer(1, self.CHANGE)  # the second is done first: it waits for the first
        self.assertEqual(seen, [])
        client.answer(0, self.CHANGE)
        self.assertEqual(seen, ["rec:1", "rec:2"])
        self.assertNoResult(done)
        client.answer(2, self.CHANGE)
        report = self.successResultOf(done)
        self.assertEqual(seen, ["rec:1", "rec:2", "rec:3"])
        self.assertEqual((report.different, report.reviews), (3, []))

    def test_reviews_held_for_order_are_bounded(self) -> None:
        client = _Held()
        taken = 0
        recorded = _enabled_recording(100)

        def lines() -> Iterator[Any]:
            nonlocal taken
            for r in recorded:
                taken += 1
                yield r

        replay(
            MemoryReactorClock(),
            ReplayOptions(config=make_config(), concurrency=2),
            lines(),
            client,
            Metrics(),
            emit=lambda r: None,
        )
        # The first review never ends; every later one does at once.
        for i in range(1, 100):
            if i < len(client.waiting):
                client.answer(i, [])
        self.assertEqual(taken, 8)  # 4 x concurrency, the first one included
        self.assertEqual(len(client.waiting), 8)
