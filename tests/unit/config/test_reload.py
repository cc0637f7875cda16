"""
Tests for reloading the config while amp runs (amp.reload, amp.config's
L{for_reload} and L{config_digest}, L{amp.service.AmpService.apply}).

The file is polled on a L{Clock} (a rewrite, and the ConfigMap volume's
C{..data} symlink swap), reloaded on C{SIGHUP}; a valid change is in force
for the next review while a review in flight finishes under the config it
started with, and no review is dropped; an invalid file keeps the running
config and logs the exact error; a restart-only key is named and keeps its
running value; the hash of the config in force is exported.  The reviews go
through amp's assembled site in memory (StringTransport).  The same in a real
C{twistd amp}: tests/integration/process/test_reload.py.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from amp.config import Config, config_digest, for_reload, load_config, parse_config
from amp.logs import ConfigurableObserver
from amp.metrics import Metrics
from amp.namespaces import NamespaceInfo
from amp.record import recording_files
from amp.reload import ConfigFile, ConfigReloadService, SighupService
from amp.service import AmpService, namespace_source, serving_certificate
from tests.support.helpers import decode_answer, namespace, parse_raw_response, raw_config, review_bytes
from tests.support.inline_writer import InlineWriters
from tests.unit.http.test_channel import Connection, HeldSource, ListeningAtOnce, Transport, post_head

INTERVAL = 5.0


def at_once(f: Callable[[], Any]) -> Deferred[Any]:
    """Run a reload's load here and now (what the daemon runs in a thread)."""
    return maybeDeferred(f)


class _FromThread:
    """A reactor whose callFromThread only records (as a signal handler's call would wait)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def callFromThread(self, f: Callable[..., Any], *args: Any) -> None:
        self.calls.append((f, args))


class ConfigMapVolume:
    """
    A directory laid out as the kubelet lays out a ConfigMap volume:
    C{amp.yaml -> ..data/amp.yaml}, C{..data -> ..<version>}; L{update}
    writes a new version and swaps C{..data} atomically.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        self.path = str(root / "amp.yaml")

    def update(self, text: str) -> None:
        self.version += 1
        version = self.root / f"..2026_{self.version:04d}"
        version.mkdir()
        (version / "amp.yaml").write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(version.name, tmp)
        os.replace(tmp, self.root / "..data")
        if not (self.root / "amp.yaml").is_symlink():
            os.symlink("..data/amp.yaml", self.root / "amp.yaml")


def yaml_of(**sections: Any) -> str:
    return yaml.safe_dump(raw_config({"team-a": namespace(enabled=False)}, **sections))


# ---------------------------------------------------------------- pure


class ForReloadTests(SynchronousTestCase):
    def test_restart_only_keys_keep_their_running_values_and_are_named(self) -> None:
        running = parse_config({"listen": {"port": 8443}, "kubernetes": {"source": "static"}})
        new = parse_config(
            {
                "listen": {"port": 9443, "max_body": 1024},
                "workers": 2,
                "failure_policy": "Fail",
                "tls": {"cert": "/elsewhere.crt"},
                "metrics": {"port": 9191},
                "kubernetes": {"source": "static"},
            }
        )
        effective, kept = for_reload(running, new)
        self.assertEqual(kept, ["listen.port", "tls.cert", "metrics.port", "workers"])
        self.assertEqual(
            (effective.listen.port, effective.tls.cert, effective.metrics.port, effective.workers),
            (8443, running.tls.cert, running.metrics.port, 1),
        )
        self.assertEqual((effective.listen.max_body, effective.failure_policy), (1024, "Fail"))

    def test_nothing_restart_only_changed(self) -> None:
        running = parse_config({"kubernetes": {"source": "static"}})
        new = parse_config({"kubernetes": {"source": "static", "namespaces": {"a": {}}}, "log": {"level": "debug"}})
        self.assertEqual(for_reload(running, new), (new, []))

    def test_a_kubernetes_source_keeps_what_it_was_built_from(self) -> None:
        running = parse_config({"kubernetes": {"source": "cluster"}})
        new = parse_config(
            {"kubernetes": {"source": "cluster", "enabled_label": "other/enabled", "watch_timeout": "1m"}}
        )
        effective, kept = for_reload(running, new)
        self.assertEqual(kept, ["kubernetes.enabled_label", "kubernetes.watch_timeout"])
        self.assertEqual(effective, running)


class DigestTests(SynchronousTestCase):
    def test_layout_comments_and_order_do_not_change_the_hash(self) -> None:
        a = parse_config(yaml.safe_load("endpoints: {allow: ['http://*.svc:*/*'], timeout: 2s}\nworkers: 1\n"))
        b = parse_config(
            yaml.safe_load("# same\nworkers: 1\nendpoints:\n  timeout: 2000ms\n  allow:\n    - http://*.svc:*/*\n")
        )
        self.assertEqual(config_digest(a), config_digest(b))

    def test_any_value_changes_the_hash(self) -> None:
        base = config_digest(Config())
        for raw in (
            {"endpoints": {"deny_networks": ["loopback"]}},
            {"patch": {"repair": False}},
            {"kubernetes": {"source": "static", "namespaces": {"a": {"labels": {"x": "y"}}}}},
            {"endpoints": {"overrides": [{"match": "http://a.svc:*/*", "timeout": "1s"}]}},
        ):
            self.assertNotEqual(config_digest(parse_config(raw)), base, raw)
        self.assertEqual(config_digest(parse_config({})), base)


# ---------------------------------------------------------------- the file


class ConfigFileCase(SynchronousTestCase):
    """
    amp's config file in a ConfigMap volume, its L{ConfigFile} polled on a
    clock once L{start}ed, what it applied and logged.
    """

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        # Not self.mktemp(): under pytest that is a directory in the checkout.
        self.dir = Path(tempfile.mkdtemp(prefix="amp-reload-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.volume = ConfigMapVolume(self.dir)
        self.volume.update(yaml_of())
        self.metrics = Metrics()
        self.applied: list[Config] = []
        self.events: list[dict[str, Any]] = []
        self.running = load_config(self.volume.path)

    def start(self, in_thread: Callable[[Callable[[], Any]], Deferred[Any]]) -> None:
        """Watch the file, loading it with C{in_thread}."""
        self.file = ConfigFile(self.volume.path, self.running, self.applied.append, self.metrics, in_thread=in_thread)
        self.file.log = Logger(observer=self.events.append)  # type: ignore[misc]
        self.service = ConfigReloadService(self.file, reactor=self.clock, interval=INTERVAL)
        self.service.startService()
        self.addCleanup(self.service.stopService)

    def reloads(self, result: str) -> float:
        return self.metrics.registry.get_sample_value("amp_config_reloads_total", {"result": result}) or 0.0


class ConfigFileTests(ConfigFileCase):
    def setUp(self) -> None:
        super().setUp()
        self.start(at_once)

    def hashes(self) -> dict[str, float]:
        return {s.labels["hash"]: s.value for m in self.metrics.config_info.collect() for s in m.samples}

    def lines(self) -> list[str]:
        return [formatEvent(e) for e in self.events]

    def test_a_configmap_symlink_swap_is_seen_at_the_next_poll(self) -> None:
        before = self.file.digest
        self.assertEqual(self.hashes(), {before: 1.0})
        self.volume.update(yaml_of(failure_policy="Fail"))
        self.clock.advance(INTERVAL - 0.1)
        self.assertEqual(self.applied, [])
        self.clock.advance(0.1)
        [applied] = self.applied
        self.assertEqual(applied.failure_policy, "Fail")
        self.assertEqual(self.file.running, applied)
        self.assertEqual(self.reloads("success"), 1)
        self.assertEqual(self.hashes(), {config_digest(applied): 1.0})
        self.assertIn(f"config {config_digest(applied)} replaces {before}", self.lines()[-1])

    def test_a_rewrite_in_place_is_seen(self) -> None:
        Path(self.volume.path).write_text(yaml_of(failure_policy="Fail") + "# a longer file\n")
        self.clock.advance(INTERVAL)
        self.assertEqual([c.failure_policy for c in self.applied], ["Fail"])

    def test_an_unchanged_file_is_not_reloaded(self) -> None:
        self.clock.advance(INTERVAL * 5)
        self.assertEqual((self.applied, self.reloads("success"), self.reloads("error")), ([], 0, 0))

    def test_an_invalid_file_keeps_the_running_config_and_logs_the_exact_error(self) -> None:
        running = self.file.running
        self.volume.update(yaml_of(endpoints={"timeout": "soon"}))
        self.clock.advance(INTERVAL)
        self.assertEqual(self.applied, [])
        self.assertIs(self.file.running, running)
        self.assertEqual(self.reloads("error"), 1)
        self.assertEqual(
            self.lines(),
            [
                f"Config {self.volume.path} not reloaded (file changed), still running config {self.file.digest}: "
                f"endpoints.timeout: expected a duration like 250ms, 2s or 1m, got 'soon'"
            ],
        )
        # Reported once, not at every poll; the next change is tried again.
        self.clock.advance(INTERVAL * 3)
        self.assertEqual(self.reloads("error"), 1)
        self.volume.update(yaml_of(failure_policy="Fail"))
        self.clock.advance(INTERVAL)
        self.assertEqual([c.failure_policy for c in self.applied], ["Fail"])

    def test_a_file_that_is_not_yaml_or_is_gone_keeps_the_running_config(self) -> None:
        self.volume.update("listen: [1,\n")
        self.clock.advance(INTERVAL)
        self.assertIn("is not valid YAML: line 2, column 1", self.lines()[-1])
        os.unlink(self.volume.path)
        self.clock.advance(INTERVAL)
        self.assertIn(f"(file): {self.volume.path}: file not found", self.lines()[-1])
        self.assertEqual((self.applied, self.reloads("error")), ([], 2))

    def test_a_restart_only_key_is_named_in_one_warning_and_keeps_its_value(self) -> None:
        self.volume.update(yaml_of(listen={"port": 9443, "max_body": 2048}, metrics={"port": 9191}))
        self.clock.advance(INTERVAL)
        [applied] = self.applied
        self.assertEqual((applied.listen.port, applied.metrics.port, applied.listen.max_body), (0, 0, 2048))
        [warning] = [e for e in self.events if e.get("kept")]
        self.assertEqual(
            formatEvent(warning),
            (
                f"Config {self.volume.path}: listen.port, metrics.port changed but only take effect on a restart; "
                f"running with the old values of these keys"
            ),
        )

    def test_only_restart_only_changes_put_nothing_new_in_force(self) -> None:
        self.volume.update(yaml_of(workers=3))
        self.clock.advance(INTERVAL)
        self.assertEqual(self.applied, [])
        self.assertIn("workers changed but only take effect on a restart", self.lines()[0])
        self.assertIn("no change in force", self.lines()[1])

    def test_sighup_reloads_even_an_unchanged_file_and_chains(self) -> None:
        chained: list[int] = []
        original = signal.signal(signal.SIGHUP, lambda signum, frame: chained.append(signum))
        self.addCleanup(signal.signal, signal.SIGHUP, original)
        fake = _FromThread()
        reload = ConfigReloadService(self.file, reactor=fake, clock=self.clock, interval=INTERVAL)
        service = SighupService(fake)
        service.add(reload.what, reload.reload_now)
        service.startService()
        self.addCleanup(lambda: service.running and service.stopService())
        Path(self.volume.path).write_text(yaml_of(failure_policy="Fail"))
        os.utime(self.volume.path, ns=(0, 0))  # even a change polling could miss
        signal.getsignal(signal.SIGHUP)(signal.SIGHUP, None)  # type: ignore[operator]
        self.assertEqual(chained, [signal.SIGHUP])
        self.assertEqual(self.applied, [], "the reload runs on the reactor thread, not in the handler")
        [(f, args)] = fake.calls
        f(*args)
        self.assertEqual([c.failure_policy for c in self.applied], ["Fail"])
        service.stopService()
        self.assertNotEqual(signal.getsignal(signal.SIGHUP), service.handle)

    def test_the_poll_interval_follows_the_config(self) -> None:
        self.volume.update(yaml_of(reload_interval="1s"))
        self.clock.advance(INTERVAL)
        self.service.set_interval(self.applied[-1].reload_interval)
        self.volume.update(yaml_of(reload_interval="1s", failure_policy="Fail"))
        self.clock.advance(1)
        self.assertEqual(self.applied[-1].failure_policy, "Fail")


# ---------------------------------------------------------------- amp


class SighupTests(SynchronousTestCase):
    """
    One SIGHUP handler for the process: it asks every reloader in turn, on
    the reactor thread, and puts back the handler it found when it stops.
    """

    def setUp(self) -> None:
        self.original = signal.getsignal(signal.SIGHUP)
        self.addCleanup(signal.signal, signal.SIGHUP, self.original)

    def test_one_signal_asks_every_reloader_in_turn_even_after_one_fails(self) -> None:
        asked: list[str] = []

        def broken() -> None:
            asked.append("config")
            raise RuntimeError("a bug")

        fake = _FromThread()
        service = SighupService(fake)
        service.add("certificate", lambda: asked.append("certificate"))
        service.add("config", broken)
        service.add("workers", lambda: asked.append("workers"))
        service.startService()
        signal.getsignal(signal.SIGHUP)(signal.SIGHUP, None)  # type: ignore[operator]
        self.assertEqual(asked, [], "the reloaders run on the reactor thread, not in the handler")
        [(f, args)] = fake.calls
        f(*args)
        self.assertEqual(asked, ["certificate", "config", "workers"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        service.stopService()
        self.assertEqual(signal.getsignal(signal.SIGHUP), self.original)

    def test_the_top_service_installs_the_one_handler_for_the_certificate_and_the_config(self) -> None:
        clock = MemoryReactorClock()
        directory = Path(tempfile.mkdtemp(prefix="amp-sighup-"))
        self.addCleanup(shutil.rmtree, directory, True)
        volume = ConfigMapVolume(directory)
        volume.update(yaml.safe_dump(raw_config({"team-a": namespace()})))
        config = load_config(volume.path)
        metrics = Metrics()
        service = AmpService(
            config,
            clock,
            certificate=serving_certificate(config.tls, clock, metrics),
            webhook_endpoint=ListeningAtOnce([]),
            metrics_endpoint=None,
            namespaces=namespace_source(config, clock, metrics),
            metrics=metrics,
            config_path=volume.path,
            in_thread=at_once,
        )
        service.startService()
        self.addCleanup(lambda: service.running and service.stopService())
        self.assertEqual(signal.getsignal(signal.SIGHUP), service.sighup.handle)
        self.assertEqual(service.sighup.reloaders(), ["the TLS certificate files", "the config file"])
        service.sighup.reload_all()
        self.assertEqual(metrics.registry.get_sample_value("amp_config_reloads_total", {"result": "success"}), 1.0)
        self.assertEqual(metrics.registry.get_sample_value("amp_tls_reloads_total", {"result": "success"}), 1.0)
        service.stopService()
        self.assertEqual(signal.getsignal(signal.SIGHUP), self.original)


class ApplyTests(SynchronousTestCase):
    """
    A reload through the running service: the next review runs under the
    new config, a review in flight finishes under the one it started with,
    and nothing is dropped.
    """

    def start(self, namespaces: Any = None, **sections: Any) -> AmpService:
        self.clock = MemoryReactorClock()
        # Not self.mktemp(): under pytest that is a directory in the checkout.
        self.dir = Path(tempfile.mkdtemp(prefix="amp-reload-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.volume = ConfigMapVolume(self.dir)
        self.volume.update(self.yaml(**sections))
        config = load_config(self.volume.path)
        self.metrics = Metrics()
        self.out = io.StringIO()
        self.observer = ConfigurableObserver(config.log.format, config.log.level, self.out)
        self.events: list[str] = []
        service = AmpService(
            config,
            self.clock,
            certificate=serving_certificate(config.tls, self.clock, self.metrics),
            webhook_endpoint=ListeningAtOnce(self.events),
            metrics_endpoint=None,
            namespaces=namespaces if namespaces is not None else self.static(config),
            metrics=self.metrics,
            install_sighup=False,
            log_observer=self.observer,
            config_path=self.volume.path,
            in_thread=at_once,
        )
        service.startService()
        self.addCleanup(service.stopService)
        return service

    def static(self, config: Config) -> Any:
        from amp.service import namespace_source

        return namespace_source(config, self.clock, Metrics())

    def yaml(self, namespaces: Any = None, **sections: Any) -> str:
        return yaml.safe_dump(raw_config(namespaces if namespaces is not None else {"team-a": namespace()}, **sections))

    def change(self, service: AmpService, text: str) -> None:
        self.volume.update(text)
        self.clock.advance(service.config.reload_interval)

    def review(self, service: AmpService, uid: str, namespace: str = "team-a", **kwargs: Any) -> Connection:
        transport = Transport()
        channel = service.webhook_server.buildProtocol(None)
        channel.makeConnection(transport)
        c = Connection(channel, transport)
        body = review_bytes(uid=uid, namespace=namespace, **kwargs)
        c.send(post_head(len(body)) + body)
        return c

    def answer(self, c: Connection) -> dict[str, Any]:
        status, headers, body = parse_raw_response(c.received())
        self.assertEqual(status, 200, body)
        return decode_answer(body)["response"]

    def test_a_review_in_flight_finishes_under_its_config_and_the_next_runs_under_the_new_one(self) -> None:
        source = HeldSource([])
        service = self.start(namespaces=source, failure_policy="Ignore")
        before = self.review(service, "before")
        self.change(service, self.yaml(failure_policy="Fail"))
        self.assertEqual(service.config.failure_policy, "Fail")
        after = self.review(service, "after")
        # Both lookups answer: enabled, but no endpoint annotation (a failure).
        for d in source.lookups:
            d.callback(NamespaceInfo("team-a", {"amp.txn2.com/enabled": "true"}, {}))
        self.assertEqual(self.answer(before)["allowed"], True)  # Ignore, as when it arrived
        self.assertEqual(self.answer(after)["allowed"], False)  # Fail, the new config

    def test_reviews_across_many_reloads_are_all_answered(self) -> None:
        service = self.start()
        answers = []
        for i in range(20):
            c = self.review(service, f"r{i}")
            answers.append(self.answer(c))
            self.change(
                service, self.yaml(failure_policy="Fail" if i % 2 else "Ignore", endpoints={"timeout": f"{i + 1}s"})
            )
        self.assertEqual([a["uid"] for a in answers], [f"r{i}" for i in range(20)])
        self.assertEqual(self.metrics.registry.get_sample_value("amp_config_reloads_total", {"result": "success"}), 20)

    def test_static_namespaces_are_reloaded(self) -> None:
        service = self.start(namespaces=None, failure_policy="Fail")
        self.assertEqual(self.answer(self.review(service, "x", namespace="team-b"))["allowed"], True)
        self.change(service, self.yaml({"team-a": namespace(), "team-b": namespace()}, failure_policy="Fail"))
        # team-b is now enabled, with no endpoint: under Fail, denied.
        self.assertEqual(self.answer(self.review(service, "y", namespace="team-b"))["allowed"], False)
        self.assertEqual(service.namespaces.count, 2)
        self.assertIn(service.namespaces, list(service))

    def test_listener_limits_are_reloaded(self) -> None:
        service = self.start()
        self.assertEqual(parse_raw_response(self.review(service, "fits").received())[0], 200)
        self.change(service, self.yaml(listen={"max_body": len(review_bytes(uid="big")) - 1}))
        self.assertEqual(parse_raw_response(self.review(service, "big").received())[0], 413)

    def test_log_format_and_level_are_reloaded(self) -> None:
        service = self.start()
        log = Logger(namespace="amp.test", observer=self.observer)
        log.debug("before {n}", n=1)
        self.assertEqual(self.out.getvalue(), "")
        self.change(service, self.yaml(log={"format": "json", "level": "debug"}))
        log.debug("after {n}", n=2)
        line = json.loads(self.out.getvalue().splitlines()[-1])
        self.assertEqual((line["message"], line["level"], line["n"]), ("after 2", "debug", 2))

    def test_recording_is_turned_on_and_off_by_a_reload(self) -> None:
        service = self.start()
        InlineWriters.adopt(self.clock)
        directory = self.dir / "recordings"
        self.assertEqual(self.answer(self.review(service, "off-1"))["uid"], "off-1")
        self.change(service, self.yaml(record={"enabled": True, "directory": str(directory)}))
        writer = service.recorder._writer
        self.assertIsNotNone(writer)
        self.assertEqual(self.answer(self.review(service, "on"))["uid"], "on")
        self.change(service, self.yaml(record={"enabled": False, "directory": str(directory)}))
        self.assertIsNone(service.recorder._writer)
        self.assertEqual(self.answer(self.review(service, "off-2"))["uid"], "off-2")
        self.clock.run_writers()  # type: ignore[attr-defined]
        uids = []
        for name in recording_files(str(directory)):
            with open(name, "rb") as f:
                uids.extend(json.loads(line)["uid"] for line in f)
        self.assertEqual(uids, ["on"])
        self.assertEqual(self.metrics.registry.get_sample_value("amp_recorded_reviews_total", {"result": "written"}), 1)
