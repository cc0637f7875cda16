"""
Recording reviews (amp.record): what a line holds, redaction, the files on
disk within their budget, and the recorder that never delays an answer.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from typing import Any

import pytest
from twisted.logger import LogLevel, globalLogPublisher

from amp.config import ConfigError, RecordConfig
from amp.metrics import Metrics
from amp.poddiff import MISSING, pod_differences
from amp.record import (
    MARKER_PREFIX,
    Capture,
    Recorder,
    RecordFiles,
    RecordingError,
    Redactor,
    decode_line,
    encode_line,
    recording_files,
)
from tests.support.helpers import make_config, pod, review_bytes
from tests.support.inline_writer import InlineWriters, recorded_lines
from tests.support.prometheus import Scrape


def sample(text: bytes, name: str, **labels: str) -> float:
    return Scrape(text.decode()).total(name, **labels)


# ---------------------------------------------------------------- comparing Pods


def test_differences_are_named_by_json_pointer_in_document_order() -> None:
    before = pod(containers=[{"name": "app", "image": "app:1"}, {"name": "proxy", "image": "proxy:1.4"}])
    after = json.loads(json.dumps(before))
    after["spec"]["containers"][1]["image"] = "proxy:1.5"
    after["spec"]["containers"].append({"name": "log", "image": "log:1"})
    after["metadata"]["labels"] = {"a/b": "x"}
    found = pod_differences(before, after)
    assert [(d.path, d.before, d.after) for d in found] == [
        ("/metadata/labels", MISSING, {"a/b": "x"}),
        ("/spec/containers/1/image", "proxy:1.4", "proxy:1.5"),
        ("/spec/containers/2", MISSING, {"name": "log", "image": "log:1"}),
    ]


def test_keys_are_escaped_and_the_stamp_is_not_compared() -> None:
    before = pod(annotations={"amp.txn2.com/status": "mutated http://a/x", "x~y/z": "1"})
    after = pod(annotations={"amp.txn2.com/status": "mutated http://b/x", "x~y/z": "2"})
    found = pod_differences(before, after, ignore_annotations=("amp.txn2.com/status",))
    assert [d.path for d in found] == ["/metadata/annotations/x~0y~1z"]
    assert (
        pod_differences(
            pod(annotations={"amp.txn2.com/status": "a"}), pod(), ignore_annotations=("amp.txn2.com/status",)
        )
        == ()
    )


def test_a_denied_side_differs_at_the_root_and_types_matter() -> None:
    assert pod_differences(None, None) == ()
    assert [d.path for d in pod_differences(pod(), None)] == [""]
    a, b = pod(), pod()
    b["spec"]["priority"], a["spec"]["priority"] = 1, 1.0
    assert [d.path for d in pod_differences(a, b)] == ["/spec/priority"]


def test_deep_documents_compare_without_recursion() -> None:
    deep: Any = "x"
    other: Any = "y"
    for _ in range(5000):
        deep, other = [deep], [other]
    found = pod_differences({"a": deep}, {"a": other})
    assert len(found) == 1 and found[0].path.count("/0") == 5000


# ---------------------------------------------------------------- redaction


def _env_pod() -> dict[str, Any]:
    return pod(
        annotations={"secret-ish": "s3cr3t", "amp.txn2.com/record": "true"},
        containers=[
            {
                "name": "app",
                "image": "app",
                "env": [
                    {"name": "TOKEN", "value": "hunter2"},
                    {"name": "REF", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ],
            }
        ],
        initContainers=[{"name": "init", "image": "i", "env": [{"name": "T", "value": "hunter2"}]}],
    )


def test_redaction_replaces_env_and_annotation_values_with_stable_markers() -> None:
    redactor = Redactor(key=b"k" * 32)
    out = redactor.pod(_env_pod())
    env = out["spec"]["containers"][0]["env"]
    assert env[0]["value"].startswith(MARKER_PREFIX) and "hunter2" not in json.dumps(out)
    assert env[1] == {"name": "REF", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert out["spec"]["initContainers"][0]["env"][0]["value"] == env[0]["value"]
    assert out["metadata"]["annotations"]["amp.txn2.com/record"] == "true"
    assert out["metadata"]["annotations"]["secret-ish"].startswith(MARKER_PREFIX)
    assert redactor.marker(env[0]["value"]) == env[0]["value"], "a marker is kept as it is"
    assert _env_pod()["spec"]["containers"][0]["env"][0]["value"] == "hunter2", "the input is not changed"


def test_a_patch_is_redacted_as_its_pod_is() -> None:
    redactor = Redactor(key=b"k" * 32)
    marker = redactor.marker("hunter2")
    patch = [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "COPY", "value": "hunter2"}},
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "hunter2"}]},
        {"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "hunter2"},
        {"op": "add", "path": "/metadata/annotations/note", "value": "hunter2"},
        {"op": "add", "path": "/metadata/annotations/amp.txn2.com~1status", "value": "mutated x"},
        {"op": "add", "path": "/metadata/annotations", "value": {"note": "hunter2", "amp.txn2.com/status": "m"}},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "s", "env": [{"name": "B", "value": "hunter2"}]}},
        {"op": "add", "path": "/spec/volumes/-", "value": {"name": "hunter2"}},
    ]
    out = redactor.patch(patch)
    assert out[0]["value"]["value"] == marker and out[1]["value"][0]["value"] == marker
    assert out[2]["value"] == marker and out[3]["value"] == marker
    assert out[4]["value"] == "mutated x"
    assert out[5]["value"] == {"note": marker, "amp.txn2.com/status": "m"}
    assert out[6]["value"]["env"][0]["value"] == marker
    assert out[7] == patch[7], "values outside env and annotations are kept"
    assert Redactor(key=b"j" * 32).marker("hunter2") != marker, "markers depend on the key"


def test_a_patch_replacing_containers_the_spec_or_the_whole_pod_holds_no_secret() -> None:
    redactor = Redactor(key=b"k" * 32)
    secret_pod = _env_pod()
    for op in (
        {"op": "replace", "path": "/spec/initContainers", "value": secret_pod["spec"]["containers"]},
        {"op": "replace", "path": "/spec/containers/0", "value": secret_pod["spec"]["containers"][0]},
        {"op": "replace", "path": "/spec", "value": secret_pod["spec"]},
        {"op": "replace", "path": "/metadata", "value": {"name": "web", "annotations": {"note": "hunter2"}}},
        {"op": "replace", "path": "", "value": dict(secret_pod, metadata={"annotations": {"note": "hunter2"}})},
    ):
        assert "hunter2" not in json.dumps(redactor.patch([op])), op["path"]


# ---------------------------------------------------------------- lines


def _capture(**kw: Any) -> Capture:
    answer = (
        kw.pop("answer", None)
        or json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": "u1",
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": __import__("base64")
                    .b64encode(
                        json.dumps(
                            [
                                {
                                    "op": "add",
                                    "path": "/metadata/annotations",
                                    "value": {"amp.txn2.com/status": "mutated http://127.0.0.1:1/x"},
                                }
                            ]
                        ).encode()
                    )
                    .decode(),
                    "warnings": ["w"],
                },
            }
        ).encode()
    )
    values = dict(
        time=1764169445.5,
        uid="u1",
        namespace="team-a",
        labels={"amp.txn2.com/enabled": "true"},
        annotations={"amp.txn2.com/ep": "http://127.0.0.1:1/x?token=t"},
        endpoints=("http://127.0.0.1:1/x",),
        failure_policy="Ignore",
        mode="normal",
        request_body=review_bytes(_env_pod()),
        answer_body=answer,
        result="patched",
        reason="",
    )
    values.update(kw)
    return Capture(**values)


def test_a_review_sent_over_several_lines_is_recorded_on_one() -> None:
    pretty = json.dumps(json.loads(review_bytes(_env_pod())), indent=2).encode()
    for body in (review_bytes(_env_pod()), pretty, pretty.replace(b"\n", b"\r\n")):
        line = encode_line(_capture(request_body=body))
        assert line.count(b"\n") == 1 and b"\r" not in line
        assert decode_line(line.rstrip(b"\n"), "rec.jsonl:1").review == json.loads(body)


def test_a_line_round_trips_what_replay_needs() -> None:
    line = encode_line(_capture())
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    recorded = decode_line(line.rstrip(b"\n"), "rec.jsonl:1")
    assert recorded.namespace == "team-a" and recorded.uid == "u1" and recorded.pod_name == "web"
    assert recorded.annotations["amp.txn2.com/ep"].endswith("?token=t")
    assert recorded.endpoints == ("http://127.0.0.1:1/x",)
    assert recorded.result == "patched" and recorded.allowed and recorded.warnings == ("w",)
    assert recorded.stamp == "mutated http://127.0.0.1:1/x"
    assert recorded.failure_policy == "Ignore" and recorded.time == "2025-11-26T15:04:05.500Z"
    assert json.loads(recorded.review_bytes()) == json.loads(review_bytes(_env_pod()))


def test_a_traced_reviews_trace_id_is_recorded_through_the_pipe_and_read_back() -> None:
    from amp.record._pipe import capture_frame, decode_capture

    trace = "0af7651916cd43dd8448eb211c80319c"
    frame = b"".join(capture_frame(_capture(trace_id=trace)))
    # The frame's body after its length and kind (what the writer process decodes).
    captured = decode_capture(frame[5:])
    assert captured.trace_id == trace
    recorded = decode_line(encode_line(captured).rstrip(b"\n"), "rec.jsonl:1")
    assert recorded.trace_id == trace
    untraced = decode_line(encode_line(_capture()).rstrip(b"\n"), "rec.jsonl:1")
    assert untraced.trace_id == "" and b"trace_id" not in encode_line(_capture())


def test_a_redacted_line_holds_no_secret_value() -> None:
    line = encode_line(_capture(annotations={"amp.txn2.com/ep": "http://e/x", "team-secret": "hunter2"}), Redactor())
    assert b"hunter2" not in line and b"s3cr3t" not in line
    assert decode_line(line, "x:1").redacted


@pytest.mark.parametrize(
    "line, problem",
    [
        (b"not json", "not valid JSON"),
        (b'{"amp_recording": 1, "x": NaN}', "NaN is not a JSON number"),
        (b"[" * 200 + b"]" * 200, "more than 104 deep, the limit"),
        (b'{"amp_recording": 2}', "not a line of an amp recording"),
        (b'{"amp_recording": 1, "review": {}}', "review.request is missing"),
        (b'{"amp_recording": 1, "review": {"request": {}}}', "missing or malformed field"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(line: bytes, problem: str) -> None:
    with pytest.raises(RecordingError) as e:
        decode_line(line, "rec.jsonl:7")
    assert str(e.value).startswith("rec.jsonl:7: ") and problem in str(e.value)


# ---------------------------------------------------------------- files


def test_files_are_private_rotate_and_keep_within_the_budget(tmp_path: Any) -> None:
    directory = tmp_path / "rec"
    files = RecordFiles(str(directory), file_bytes=100, total_bytes=300, now=lambda: 0.0, pid=7)
    for _ in range(20):
        files.write(b"x" * 39 + b"\n")
    files.close()
    names = recording_files(str(directory))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(n).st_mode) == 0o600 for n in names)
    sizes = [os.path.getsize(n) for n in names]
    assert all(s <= 100 for s in sizes) and sum(sizes) <= 300
    assert len(names) >= 2 and names == sorted(names)
    assert all(os.path.basename(n).startswith("amp-reviews-19700101T000000-7-") for n in names)


def test_a_line_larger_than_a_file_is_refused(tmp_path: Any) -> None:
    files = RecordFiles(str(tmp_path), file_bytes=10, total_bytes=100)
    with pytest.raises(ValueError, match="larger than record.file_size"):
        files.write(b"x" * 11)


# ---------------------------------------------------------------- the recorder


def finish(recorder: Recorder, reactor: InlineWriters) -> None:
    """Stop the recorder's writer, let it write what it was sent and end, count what it reported."""
    stopped = recorder.stopService()
    reactor.run()
    assert stopped.called


def offer(recorder: Recorder, namespace: str = "team-a", annotations: Any = None) -> None:
    c = _capture()
    recorder.offer(replace(c, namespace=namespace, annotations=annotations if annotations is not None else {}))


def settings(tmp_path: Any, **kw: Any) -> RecordConfig:
    return replace(make_config(record={"enabled": True, "directory": str(tmp_path / "rec")}).record, **kw)


def test_chosen_namespaces_are_recorded(tmp_path: Any) -> None:
    for chosen, expected in [(("*",), {"a", "b", "c"}), (("b",), {"b"}), (("annotated",), {"c"})]:
        reactor, metrics = InlineWriters(), Metrics()
        recorder = Recorder(
            settings(tmp_path / "-".join(chosen).replace("*", "all"), namespaces=chosen), reactor, metrics
        )
        recorder.startService()
        offer(recorder, "a")
        offer(recorder, "b", {"amp.txn2.com/record": "false"})
        offer(recorder, "c", {"amp.txn2.com/record": "true"})
        finish(recorder, reactor)
        found = {
            json.loads(line)["namespace"]["name"]
            for line in recorded_lines(tmp_path / "-".join(chosen).replace("*", "all"))
        }
        assert found == expected
        assert sample(metrics.render(), "amp_recorded_reviews_total", result="written") == len(expected)


def test_sampling_records_a_share(tmp_path: Any) -> None:
    draws = iter([0.1, 0.6, 0.3, 0.9])
    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path, sample=0.5), reactor, metrics, draw=lambda: next(draws))
    recorder.startService()
    for _ in range(4):
        offer(recorder)
    finish(recorder, reactor)
    assert len(recorded_lines(tmp_path)) == 2


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Any) -> None:
    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path, queue=2), reactor, metrics)
    # The writer does not read (a stalled disk) while 50 reviews come.
    recorder.startService()
    for _ in range(50):
        offer(recorder)
    assert recorder._writer is not None
    finish(recorder, reactor)
    text = metrics.render()
    assert sample(text, "amp_recorded_reviews_total", result="written") == 2 == len(recorded_lines(tmp_path))
    assert sample(text, "amp_recorded_reviews_total", result="dropped") == 48


def test_an_unwritable_directory_is_counted_and_logged_once(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        reactor, metrics = InlineWriters(), Metrics()
        recorder = Recorder(replace(settings(tmp_path), directory=str(blocker / "rec")), reactor, metrics)
        recorder.startService()
        for _ in range(5):
            offer(recorder)
        finish(recorder, reactor)
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert sample(metrics.render(), "amp_recorded_reviews_total", result="failed") == 5
    errors = [e for e in events if e.get("log_level") == LogLevel.error and "Recording reviews" in e["log_format"]]
    assert len(errors) == 1 and str(blocker / "rec") in errors[0]["directory"]


def test_reload_turns_recording_on_and_off(tmp_path: Any) -> None:
    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(replace(settings(tmp_path), enabled=False), reactor, metrics)
    recorder.startService()
    offer(recorder)
    assert recorder._writer is None
    recorder.apply(settings(tmp_path))
    offer(recorder)
    writer = recorder._writer
    assert writer is not None
    stopped = recorder.apply(replace(settings(tmp_path), enabled=False))
    reactor.run()
    assert stopped.called and recorder._writer is None
    offer(recorder)
    finish(recorder, reactor)
    assert len(recorded_lines(tmp_path)) == 1


def test_the_record_section_is_checked() -> None:
    assert make_config().record.enabled is False
    with pytest.raises(ConfigError, match="record.file_size"):
        make_config(record={"file_size": "2MiB", "max_size": "1MiB"})
    with pytest.raises(ConfigError, match="record.sample"):
        make_config(record={"sample": 0})
    with pytest.raises(ConfigError, match="record.namespaces"):
        make_config(record={"namespaces": []})


# ---------------------------------------------------------------- files shared and failing


def test_a_write_cut_short_by_a_full_disk_leaves_no_partial_line(tmp_path: Any, monkeypatch: Any) -> None:
    import amp.record._files as files_module

    files = RecordFiles(str(tmp_path / "rec"), file_bytes=1000, total_bytes=10000)
    files.write(b'{"n":1}\n')
    real_write = os.write
    calls = []

    def full_disk(fd: int, data: Any) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:3]))  # part of the line fits
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files_module.os, "write", full_disk)
    with pytest.raises(OSError):
        files.write(b'{"n":2}\n')
    monkeypatch.undo()
    files.write(b'{"n":3}\n')
    files.close()
    assert [json.loads(line) for line in recorded_lines(tmp_path)] == [{"n": 1}, {"n": 3}]


def test_two_writers_sharing_a_directory_lose_no_line_to_the_budget(tmp_path: Any) -> None:
    # Two workers of one pod record into one directory; one's rotation
    # removes the other's current file (the oldest) to keep the budget.
    a = RecordFiles(str(tmp_path / "rec"), file_bytes=40, total_bytes=80, now=lambda: 0.0, pid=1)
    b = RecordFiles(str(tmp_path / "rec"), file_bytes=40, total_bytes=80, now=lambda: 1.0, pid=2)
    a.write(b'{"a":1}\n')
    for i in range(1, 12):
        b.write(b'{"b":%d}\n' % i)
    a.write(b'{"a":2}\n')
    a.close()
    b.close()
    found = [json.loads(line) for line in recorded_lines(tmp_path)]
    assert {"a": 2} in found
    assert sum(os.path.getsize(n) for n in recording_files(str(tmp_path / "rec"))) <= 80


def test_a_writer_started_again_in_the_same_second_never_shares_a_file(tmp_path: Any) -> None:
    # A reload starts a new writer while the old one finishes its queue.
    old = RecordFiles(str(tmp_path / "rec"), file_bytes=1000, total_bytes=10000, now=lambda: 0.0, pid=7)
    new = RecordFiles(str(tmp_path / "rec"), file_bytes=1000, total_bytes=10000, now=lambda: 0.0, pid=7)
    old.write(b'{"old":1}\n')
    new.write(b'{"new":1}\n')
    old.close()
    new.close()
    assert len(recording_files(str(tmp_path / "rec"))) == 2


def test_a_name_taken_by_a_planted_link_is_not_written_through(tmp_path: Any) -> None:
    directory = tmp_path / "rec"
    directory.mkdir()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    files = RecordFiles(str(directory), file_bytes=1000, total_bytes=10000, now=lambda: 0.0, pid=7)
    for n in range(1, 100):
        os.symlink(target, directory / f"amp-reviews-19700101T000000-7-{n:06d}.jsonl")
    files.write(b'{"n":1}\n')
    files.close()
    assert target.read_bytes() == b""


def test_an_existing_directory_of_amps_own_is_made_private(tmp_path: Any) -> None:
    directory = tmp_path / "rec"
    directory.mkdir()
    os.chmod(directory, 0o777)
    files = RecordFiles(str(directory), file_bytes=1000, total_bytes=10000)
    files.write(b'{"n":1}\n')
    files.close()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_a_review_the_writer_cannot_encode_is_counted_and_the_writer_goes_on(tmp_path: Any) -> None:
    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path, redact=True), reactor, metrics)
    recorder.startService()
    c = _capture()
    recorder.offer(replace(c, uid="odd", namespace="team-a", labels={}, annotations={}, request_body=b"[]"))
    offer(recorder)
    finish(recorder, reactor)
    text = metrics.render()
    assert sample(text, "amp_recorded_reviews_total", result="failed") == 1
    assert sample(text, "amp_recorded_reviews_total", result="written") == 1 == len(recorded_lines(tmp_path))


def test_the_queue_holds_a_bounded_number_of_bytes(tmp_path: Any) -> None:
    reactor, metrics = InlineWriters(), Metrics()
    file_size = 2 * 1024 * 1024
    recorder = Recorder(settings(tmp_path, queue=1000, file_size=file_size), reactor, metrics)
    recorder.startService()  # the writer does not read until finish(): a stalled disk
    big = review_bytes(pod("big", annotations={"note": "x" * (512 * 1024)}))
    c = _capture()
    for i in range(40):
        recorder.offer(replace(c, uid=f"u{i}", namespace="team-a", labels={}, annotations={}, request_body=big))
    held = 4 * file_size // (len(big) + len(c.answer_body))
    assert recorder._writer is not None and recorder._writer.reviews == held
    finish(recorder, reactor)
    text = metrics.render()
    assert sample(text, "amp_recorded_reviews_total", result="written") == held == len(recorded_lines(tmp_path))
    assert sample(text, "amp_recorded_reviews_total", result="dropped") == 40 - held


def test_a_writer_that_ends_unasked_is_started_again_later_and_later(tmp_path: Any) -> None:
    from twisted.internet.error import ProcessTerminated
    from twisted.python.failure import Failure

    from amp.record._recorder import FLUSH_DELAY, RESTART_DELAY, RESTART_DELAY_MAX

    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path), reactor, metrics)
    recorder.startService()
    delays = []
    for n in range(8):
        offer(recorder)  # sent to the writer that is about to end: lost, counted as failed
        reactor.advance(FLUSH_DELAY)
        reactor.writers[-1].end(Failure(ProcessTerminated(exitCode=1)))
        offer(recorder)  # held for the next writer
        assert len(reactor.writers) == n + 1
        delays.append(reactor.getDelayedCalls()[0].getTime() - reactor.seconds())
        reactor.advance(delays[-1])
        assert len(reactor.writers) == n + 2
    assert delays == pytest.approx([min(RESTART_DELAY * 2**n, RESTART_DELAY_MAX) for n in range(8)])
    # One that has run as long as the longest delay is started again soon once more.
    reactor.advance(RESTART_DELAY_MAX)
    reactor.writers[-1].end(Failure(ProcessTerminated(exitCode=1)))
    assert reactor.getDelayedCalls()[0].getTime() - reactor.seconds() == RESTART_DELAY
    finish(recorder, reactor)
    text = metrics.render()
    assert sample(text, "amp_record_writer_restarts_total") == 9
    # Every writer ended holding what it had been sent: the review offered to it and the one held for it.
    assert sample(text, "amp_recorded_reviews_total", result="failed") == 16
    assert sample(text, "amp_recorded_reviews_total", result="written") == 0
    assert recorded_lines(tmp_path) == []


def test_a_reload_that_changes_the_directory_lets_the_old_writer_finish_there(tmp_path: Any) -> None:
    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path), reactor, metrics)
    recorder.startService()
    offer(recorder, "old")
    stopped = recorder.apply(replace(settings(tmp_path), directory=str(tmp_path / "elsewhere")))
    offer(recorder, "new")
    assert not stopped.called and len(reactor.writers) == 2
    reactor.run()
    assert stopped.called
    finish(recorder, reactor)
    assert [json.loads(line)["namespace"]["name"] for line in recorded_lines(tmp_path)] == ["old"]
    with open(recording_files(str(tmp_path / "elsewhere"))[0], "rb") as f:
        assert [json.loads(line)["namespace"]["name"] for line in f] == ["new"]
    assert sample(metrics.render(), "amp_recorded_reviews_total", result="written") == 2


def test_the_reviews_of_a_few_milliseconds_reach_the_writer_in_one_write(tmp_path: Any) -> None:
    from amp.record._recorder import FLUSH_DELAY

    reactor, metrics = InlineWriters(), Metrics()
    recorder = Recorder(settings(tmp_path), reactor, metrics)
    recorder.startService()
    [writer] = reactor.writers
    assert writer.writes == 1  # the settings
    for _ in range(5):
        offer(recorder)
        reactor.advance(FLUSH_DELAY / 10)
    assert writer.writes == 1
    reactor.advance(FLUSH_DELAY)
    assert writer.writes == 2
    offer(recorder)
    finish(recorder, reactor)  # stopping writes what waits at once
    assert writer.writes == 3
    assert (
        sample(metrics.render(), "amp_recorded_reviews_total", result="written") == 6 == len(recorded_lines(tmp_path))
    )
