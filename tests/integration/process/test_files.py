"""
Every file amp parses is untrusted (L{amp.files}), in a real C{twistd amp}:
each hostile kind of config is refused by C{twistd amp --check} with one
line naming the file and the limit, and a running amp refuses each on
reload while reviews keep flowing.  The same kinds through every other path
that reads a file, in-process, are in tests/unit/config/test_files.py,
whose helpers these tests share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.process.test_shutdown import Amp, HeldEndpoint
from tests.support.ports import free_port
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until
from tests.unit.config.test_files import CONFIG_KINDS, assert_one_line, write_hostile


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_twistd_amp_check(tmp_path: Path, kind: str) -> None:
    path = write_hostile(tmp_path, kind, "amp.yaml")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("twistd")), "amp", "--check", "--config", path],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (1, ""), result
    assert result.stderr.startswith(f"amp: config {path}: "), result.stderr
    assert_one_line(result.stderr, kind)


def test_a_running_amp_keeps_answering_while_hostile_configs_are_swapped_in(tmp_path: Path) -> None:
    """
    The reload stress test: reviews keep flowing from two clients while
    every hostile kind is swapped in as amp's config, twice; each is
    refused (counted, logged once per content), the running config stays
    in force, and every review is answered, well-formed.  (The figures of
    the same under load, RSS and latency, are the soak's: C{python -m
    bench.soak --hostile}.)
    """
    endpoint = HeldEndpoint()
    endpoint.release()
    metrics = free_port()
    sections = {"reload_interval": "200ms", "metrics": {"port": metrics, "interface": "127.0.0.1"}}
    amp = Amp(tmp_path, endpoint.url, **sections)
    good = amp.config_path.read_bytes()
    stop = threading.Event()
    answered: list[tuple[str, tuple[int, dict[str, str], bytes]]] = []
    pool = ThreadPoolExecutor(max_workers=2)

    def keep_reviewing(client: int) -> None:
        i = 0
        while not stop.is_set():
            uid = f"c{client}-{i}"
            answered.append((uid, amp.review(uid)))
            i += 1

    def errors() -> float:
        return Scrape.get(metrics, timeout=5).value("amp_config_reloads_total", result="error") or 0.0

    def log() -> str:
        return (tmp_path / "amp.log").read_text(errors="replace")

    clients = []
    try:
        poll_until("amp to serve", amp.healthy, 60, amp.output)
        clients = [pool.submit(keep_reviewing, n) for n in range(2)]
        swaps = 0
        for _ in range(2):
            for kind in CONFIG_KINDS:
                new = write_hostile(tmp_path, kind, "amp.yaml.new")
                os.replace(new, amp.config_path)
                swaps += 1
                poll_until(f"the {kind} config refused", lambda swaps=swaps: errors() >= swaps or None, 30, amp.output)
                assert amp.process.poll() is None, amp.output()
        amp.config_path.with_suffix(".new").write_bytes(good)
        os.replace(amp.config_path.with_suffix(".new"), amp.config_path)
        assert errors() == swaps
        assert log().count("not reloaded (file changed)") == len(CONFIG_KINDS), amp.output()
    finally:
        stop.set()
        for client in clients:
            client.exception(timeout=60)
        pool.shutdown()
        amp.stop()
        endpoint.close()
    assert len(answered) > len(CONFIG_KINDS)
    for uid, (status, _, body) in answered:
        assert status == 200, body
        response = json.loads(body)["response"]
        assert (response["uid"], response["allowed"], "patch" in response) == (uid, True, True), body
    assert "Traceback" not in log()
