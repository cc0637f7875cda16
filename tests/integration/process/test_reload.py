"""
Reloading the config of a real C{twistd amp} while reviews flow: a valid
change is in force for the next review (its hash exported), an invalid file
is refused and the running config kept, a restart-only key is named, and
C{SIGHUP} reloads at once; no review is dropped.  Each rule, on a Clock with
the reviews in memory, is in tests/unit/config/test_reload.py.
"""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.integration.process.test_shutdown import Amp, HeldEndpoint
from tests.support.helpers import namespace
from tests.support.ports import free_port
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until


def config_hash(port: int) -> Optional[str]:
    """The hash label of C{amp_config_info} on amp's metrics port, or None."""
    try:
        hashes = Scrape.get(port, timeout=2).by("amp_config_info", "hash")
    except (OSError, RuntimeError):
        return None
    return next(iter(hashes)) if len(hashes) == 1 and set(hashes.values()) == {1.0} else None


def patched(result: tuple[int, dict[str, str], bytes]) -> bool:
    status, headers, body = result
    assert status == 200, body
    return "patch" in json.loads(body)["response"]


@pytest.fixture
def endpoint() -> Iterator[HeldEndpoint]:
    held = HeldEndpoint()
    held.release()  # it answers at once
    try:
        yield held
    finally:
        held.close()


def test_twistd_amp_reloads_its_config_file_without_dropping_a_review(tmp_path: Path, endpoint: HeldEndpoint) -> None:
    metrics = free_port()
    sections = {"reload_interval": "500ms", "metrics": {"port": metrics, "interface": "127.0.0.1"}}
    amp = Amp(tmp_path, endpoint.url, **sections)
    pool = ThreadPoolExecutor(max_workers=1)

    def log() -> str:
        return (tmp_path / "amp.log").read_text(errors="replace")

    stop = threading.Event()
    steady = None
    answered: list[tuple[str, tuple[int, dict[str, str], bytes]]] = []

    def keep_reviewing() -> None:
        i = 0
        while not stop.is_set():
            uid = f"steady-{i}"
            answered.append((uid, amp.review(uid)))
            i += 1

    try:
        poll_until("amp to serve", amp.healthy, 60, amp.output)
        first = poll_until("the config hash", lambda: config_hash(metrics), 10, amp.output)
        assert patched(amp.review("before"))
        steady = pool.submit(keep_reviewing)

        # A valid change: team-a is no longer enabled.
        amp.write_config({"team-a": namespace(endpoint.url, enabled=False)}, **sections)
        poll_until("a review under the new config", lambda: not patched(amp.review("probe")) or None, 10, amp.output)
        second = config_hash(metrics)
        assert second is not None and second != first

        # An invalid file: refused, the running config kept.
        amp.config_path.write_text("endpoints: {timeout: soon}\n")
        poll_until("the refused reload", lambda: "not reloaded (file changed)" in log() or None, 10, amp.output)
        assert "endpoints.timeout: expected a duration like 250ms, 2s or 1m, got 'soon'" in log()
        assert not patched(amp.review("still-new"))
        assert config_hash(metrics) == second

        # A restart-only key: named, kept; the rest of the change applies.
        amp.write_config(None, **{**sections, "listen": {"port": free_port()}})
        poll_until("team-a enabled again", lambda: patched(amp.review("again")) or None, 10, amp.output)
        assert "listen.port changed but only take effect on a restart" in log()

        # SIGHUP reloads at once, whatever the poll.
        reloads = log().count("reloaded (file changed)")
        amp.write_config(None, **{**sections, "reload_interval": "1h"})
        poll_until(
            "the hour-long poll in force",
            lambda: log().count("reloaded (file changed)") > reloads or None,
            10,
            amp.output,
        )
        amp.write_config({"team-a": namespace(endpoint.url, enabled=False)}, **{**sections, "reload_interval": "1h"})
        amp.process.send_signal(signal.SIGHUP)
        poll_until("the SIGHUP reload", lambda: not patched(amp.review("hup")) or None, 10, amp.output)
        assert "reloaded (reload requested)" in log()
        assert amp.process.poll() is None
    finally:
        stop.set()
        if steady is not None:
            steady.exception(timeout=30)
        pool.shutdown()
        amp.stop()
    assert steady is not None and steady.result() is None
    assert len(answered) > 0
    for uid, (status, _, body) in answered:
        assert status == 200 and json.loads(body)["response"]["uid"] == uid, body
    assert "Traceback" not in log()
