"""
The recorder's writer as the real child process it is (amp.record): it
writes what it is sent and reports it over its pipes, holds none of amp's
descriptors, is counted, logged once and started again when it dies, makes
reviews count as dropped (never waited for) when it stops reading, is
killed when it does not finish within the stop's bound, and ends on its
own when amp is gone (end-of-file on its standard input).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import pytest
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import TestCase

import amp.record._recorder as recorder_module
from amp.metrics import Metrics
from amp.record import Recorder, recording_files
from amp.record._pipe import WriterSettings, capture_frame, decode_report, settings_frame
from amp.record._recorder import writer_argv
from tests.support.helpers import make_config, pod, review_bytes
from tests.support.waiting import wait_until
from tests.unit.record.test_record import _capture

ANSWER = _capture().answer_body


def _alive(pid: Optional[int]) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class WriterProcessTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="amp-record-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.metrics = Metrics()
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def recorder(self, **kw: Any) -> Recorder:
        settings = replace(make_config(record={"enabled": True, "directory": str(self.dir / "rec")}).record, **kw)
        recorder = Recorder(settings, reactor, self.metrics)
        recorder.startService()
        self.addCleanup(lambda: recorder.stopService() if recorder.running else None)
        return recorder

    def pid(self, recorder: Recorder) -> int:
        assert recorder._writer is not None and recorder._writer.pid is not None
        return recorder._writer.pid

    def stop_process(self, pid: int) -> None:
        """SIGSTOP C{pid} (it reads nothing more) until the test ends."""
        os.kill(pid, signal.SIGSTOP)

        def go_on() -> None:
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)

        self.addCleanup(go_on)

    def count(self, result: str) -> float:
        return self.metrics.registry.get_sample_value("amp_recorded_reviews_total", {"result": result}) or 0.0

    def offer(self, recorder: Recorder, uid: str, body: Optional[bytes] = None) -> None:
        c = _capture()
        recorder.offer(
            replace(
                c,
                uid=uid,
                namespace="team-a",
                labels={},
                annotations={},
                request_body=body if body is not None else c.request_body,
            )
        )

    def uids(self) -> list[str]:
        out = []
        for name in recording_files(str(self.dir / "rec")):
            with open(name, "rb") as f:
                out.extend(json.loads(line)["uid"] for line in f)
        return out

    def logged(self, level: LogLevel, text: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("log_level") == level and text in e.get("log_format", "")]

    @inlineCallbacks
    def test_the_writer_writes_what_it_is_sent_reports_it_and_stop_waits_for_it(self) -> Any:
        recorder = self.recorder()
        pid = self.pid(recorder)
        for i in range(20):
            self.offer(recorder, f"u{i}")
        yield wait_until(lambda: self.count("written") == 20, 30, "the writer's reports")
        for i in range(20, 30):
            self.offer(recorder, f"u{i}")
        yield recorder.stopService()
        self.assertEqual(self.uids(), [f"u{i}" for i in range(30)])
        self.assertEqual(self.count("written"), 30)
        self.assertFalse(_alive(pid))
        self.assertEqual([os.stat(n).st_mode & 0o777 for n in recording_files(str(self.dir / "rec"))], [0o600])

    @pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
    @inlineCallbacks
    def test_the_writer_holds_its_pipes_and_no_socket_of_amps(self) -> Any:
        listener = socket.socket()
        self.addCleanup(listener.close)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.set_inheritable(True)  # as a worker's shared socket is
        recorder = self.recorder()
        pid = self.pid(recorder)
        self.offer(recorder, "u1")
        yield wait_until(lambda: self.count("written") == 1, 30, "the writer at work")
        links = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        self.assertEqual([links[fd].split(":")[0] for fd in (0, 1, 2)], ["pipe"] * 3)
        self.assertEqual([link for link in links.values() if link.startswith("socket:")], [])

    @inlineCallbacks
    def test_a_writer_that_dies_is_logged_once_counted_and_started_again(self) -> Any:
        self.patch(recorder_module, "RESTART_DELAY", 0.05)
        recorder = self.recorder()
        first = self.pid(recorder)
        self.stop_process(first)
        for i in range(3):
            self.offer(recorder, f"lost-{i}")
        yield wait_until(
            lambda: (
                recorder._writer is not None
                and recorder._writer._child is not None
                and recorder._writer._child.reviews == 3
            ),
            10,
            "the reviews written to its pipe",
        )
        os.kill(first, signal.SIGKILL)
        yield wait_until(
            lambda: recorder._writer is not None and recorder._writer.pid not in (None, first), 30, "a new writer"
        )
        self.assertEqual(self.count("failed"), 3)
        self.assertEqual(self.metrics.registry.get_sample_value("amp_record_writer_restarts_total"), 1)
        [error] = self.logged(LogLevel.error, "The recording's writer")
        self.assertEqual((error["lost"], error["delay"]), (3, 0.05))
        self.offer(recorder, "after")
        yield recorder.stopService()
        self.assertEqual((self.uids(), self.count("written")), (["after"], 1))

    @inlineCallbacks
    def test_a_writer_that_stops_reading_makes_reviews_dropped_not_waited_for(self) -> Any:
        file_size = 256 * 1024
        recorder = self.recorder(queue=1000, file_size=file_size)
        self.stop_process(self.pid(recorder))
        big = review_bytes(pod("big", annotations={"note": "x" * 64 * 1024}))
        for i in range(100):
            self.offer(recorder, f"u{i}", big)
        held = 4 * file_size // (len(big) + len(ANSWER))
        assert recorder._writer is not None
        self.assertEqual((recorder._writer.reviews, self.count("dropped")), (held, 100 - held))
        # More than a pipe holds waits in amp, and the reactor goes on.
        self.assertGreater(held * len(big), 64 * 1024)
        yield wait_until(lambda: True, 1, "a turn of the reactor")
        os.kill(self.pid(recorder), signal.SIGCONT)
        yield recorder.stopService()
        self.assertEqual((len(self.uids()), self.count("written")), (held, held))

    @inlineCallbacks
    def test_a_writer_that_does_not_finish_in_time_is_killed_and_counted(self) -> Any:
        self.patch(recorder_module, "STOP_TIMEOUT", 0.2)
        recorder = self.recorder()
        pid = self.pid(recorder)
        self.stop_process(pid)
        self.offer(recorder, "u1")
        self.offer(recorder, "u2")
        yield recorder.stopService()
        self.assertFalse(_alive(pid))
        self.assertEqual((self.count("failed"), self.count("written")), (2, 0))
        [warning] = self.logged(LogLevel.warn, "did not finish")
        self.assertEqual(warning["lost"], 2)


def _read_line(proc: subprocess.Popen, timeout: float = 30) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the writer did not report"
    return proc.stdout.readline()


def test_the_writer_ends_when_its_input_does_and_not_on_a_signal_to_the_group(tmp_path: Path) -> None:
    settings = WriterSettings(
        directory=str(tmp_path / "rec"),
        file_size=1024 * 1024,
        max_size=8 * 1024 * 1024,
        queue=1,
        queue_bytes=1024 * 1024,
        redact=False,
        key=b"k" * 32,
        keep_prefixes=("amp.txn2.com/",),
        keep_names=(),
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    proc = subprocess.Popen(writer_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        proc.stdin.write(settings_frame(settings) + b"".join(capture_frame(_capture(uid="first"))))
        proc.stdin.flush()
        assert decode_report(_read_line(proc)).written == 1  # type: ignore[union-attr]
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # a terminal's, a service manager's
            proc.send_signal(getattr(signal, name))
        proc.stdin.write(b"".join(capture_frame(_capture(uid="second"))))
        proc.stdin.close()  # amp is gone
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(recording_files(str(tmp_path / "rec"))[0], "rb") as f:
        assert [json.loads(line)["uid"] for line in f] == ["first", "second"]


def test_the_writer_imports_neither_twisted_nor_the_metrics_library() -> None:
    """The writer's modules stay its own: amp.record's names are imported when first used."""
    code = (
        "import sys, amp.record._writer; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'twisted', 'prometheus_client', 'zope'}))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    done = subprocess.run([*writer_argv()[:2], "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_every_name_of_the_record_package_is_there_when_asked_for() -> None:
    import amp.record

    for name in amp.record.__all__:
        assert getattr(amp.record, name) is not None
    with pytest.raises(AttributeError):
        amp.record.nothing_of_the_kind  # noqa: B018


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_writer_takes_only_cpu_time_nothing_else_wants(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    proc = subprocess.Popen(writer_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        settings = WriterSettings(
            directory=str(tmp_path / "rec"),
            file_size=64 * 1024,
            max_size=1024 * 1024,
            queue=1,
            queue_bytes=1024,
            redact=False,
            key=b"k" * 32,
            keep_prefixes=(),
            keep_names=(),
        )
        proc.stdin.write(settings_frame(settings) + b"".join(capture_frame(_capture())))
        proc.stdin.flush()
        _read_line(proc)  # it is past its start
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
