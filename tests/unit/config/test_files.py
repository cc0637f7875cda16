"""
Every file amp parses is untrusted (L{amp.files}): each hostile kind (an
alias bomb, a 50 MiB file, JSON nested 100,000 deep, NaN, invalid UTF-8, an
empty file) is refused with one line naming the file and the limit, through
every path that reads a file: amp's config at start (L{load_config}) and
on reload (L{amp.reload.ConfigFile}, in memory), the serving certificate and
an endpoint's client TLS files, the kubeconfig, and C{amp explain}'s input
(a file and stdin), C{--config} and C{--reply}.  The same in a real C{twistd
amp} (C{--check}, and a running amp while reviews keep flowing) is in
tests/integration/process/test_files.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from amp.cli.explain import EXIT_FAILURE_POLICY, EXIT_USAGE, run
from amp.config import Config, ConfigError, EndpointSettings, KubernetesConfig, load_config
from amp.endpoint._failures import LocalFailure
from amp.endpoint._tls import client_tls
from amp.files import (
    INPUT_LIMIT,
    MAX_DEPTH,
    MAX_NODES,
    FileError,
    config_document,
    parse_documents,
    parse_json,
    read_stream,
)
from amp.kube import load_client_configuration
from amp.reload import Loaded, load_config_file
from amp.tls import CertificateError, ReloadingCertificate
from tests.support.helpers import dev_tls, pod
from tests.unit.cli.test_explain import Files, run_sync
from tests.unit.config.test_reload import INTERVAL, ConfigFileCase, at_once, yaml_of

MIB = 1024 * 1024

#: A few hundred bytes that expand to 10**9 nodes.
ALIAS_BOMB = b'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n' + b"".join(
    b"%s: &%s [%s]\n" % (n, n, b",".join([b"*" + p] * 10))
    for p, n in zip([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"], [b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i"])
)
DEEP_JSON = b'{"kind": "Pod", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

#: Each hostile kind: its bytes (None: a 50 MiB file) and what the one line says.
HOSTILE: dict[str, tuple[Optional[bytes], str]] = {
    "alias bomb": (ALIAS_BOMB, "alias"),
    "50 MiB": (None, "MiB, the limit"),
    "100,000-deep JSON": (DEEP_JSON, "deep"),
    "NaN": (b'{"kind": "Pod", "metadata": {"name": "web"}, "spec": {"x": NaN}}', "NaN"),
    "NaN in YAML": (b"kind: Pod\nfailure_policy: .nan\n", "NaN"),
    "invalid UTF-8": (b"kind: Pod\nmetadata: {name: \xff\xfe}\n", "not UTF-8"),
    "empty": (b"", "is empty"),
}
KINDS = sorted(HOSTILE)
#: amp's config is YAML: a bare NaN there is the string "NaN", and YAML's own is .nan.
CONFIG_KINDS = [kind for kind in KINDS if kind != "NaN"]


def write_hostile(directory: Path, kind: str, name: str = "hostile") -> str:
    """The hostile file of C{kind} in C{directory}; a 50 MiB one is sparse (only the cap is ever read)."""
    data, _ = HOSTILE[kind]
    path = directory / name
    with open(path, "wb") as f:
        if data is None:
            f.write(b"failure_policy: Fail\nunknown: ")
            f.truncate(50 * MIB)
        else:
            f.write(data)
    return str(path)


def assert_one_line(text: str, kind: str, *names: str) -> None:
    assert "\n" not in text.rstrip("\n"), text
    assert "Traceback" not in text, text
    assert HOSTILE[kind][1] in text, text
    for name in names:
        assert name in text, text
    assert len(text) < 600, text


class _Endless(io.RawIOBase):
    """Standard input that never ends."""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return b"a" * (n if n >= 0 else 1 << 20)


# ---------------------------------------------------------------- the reader (pure)


class ReaderTests(SynchronousTestCase):
    def test_yaml_is_what_json_can_say(self) -> None:
        [doc] = parse_documents(b"a: 2026-01-01\nb: =\nc: [1, 2.5, true, null]\n", "f")
        self.assertEqual(doc, {"a": "2026-01-01", "b": "=", "c": [1, 2.5, True, None]})
        for tag in (b"!!binary aGk=", b"!!timestamp 2026-01-01", b"!!python/object:os.system x", b"!!set {a}"):
            with self.assertRaises(FileError) as e:
                parse_documents(b"a: " + tag + b"\n", "f")
            self.assertIn("f is not valid YAML: line 1, column 4: could not determine a constructor", str(e.exception))

    def test_numbers_out_of_range_are_refused_with_their_line(self) -> None:
        for text in (b"a: 1\nb: .inf\n", b"a: 1\nb: 18446744073709551616\n", b"a: 1\nb: " + b"9" * 5000 + b"\n"):
            with self.assertRaises(FileError) as e:
                parse_documents(text, "f")
            self.assertIn("line 2, column 4", str(e.exception))
        self.assertEqual(parse_documents(b"a: 18446744073709551615\n", "f"), [{"a": 2**64 - 1}])
        for text in (b'{"a": Infinity}', b'{"a": 1e400}', b'{"a": 123456789012345678901234}'):
            with self.assertRaises(FileError):
                parse_json(text, "f")

    def test_aliases_within_the_limits_are_read(self) -> None:
        text = b"env: &env [{name: A, value: '1'}]\nc1: {env: *env}\nc2: {<<: {x: 1}, env: *env}\n"
        [doc] = parse_documents(text, "f")
        self.assertEqual(doc["c2"], {"x": 1, "env": [{"name": "A", "value": "1"}]})

    def test_an_alias_bomb_is_counted_not_expanded(self) -> None:
        with self.assertRaises(FileError) as e:
            parse_documents(ALIAS_BOMB, "pod.yaml")
        self.assertEqual(
            str(e.exception), f"pod.yaml, line 6: has more than {MAX_NODES} nodes with its aliases expanded, the limit"
        )

    def test_aliases_may_not_nest_past_the_depth_limit(self) -> None:
        # Each level is 60 deep by itself; the aliases stack them.
        lines = [b"l0: &l0 " + b"[" * 60 + b"x" + b"]" * 60]
        lines += [b"l%d: &l%d " % (i, i) + b"[" * 60 + b"*l%d" % (i - 1) + b"]" * 60 for i in range(1, 4)]
        with self.assertRaises(FileError) as e:
            parse_documents(b"\n".join(lines) + b"\n", "f")
        self.assertEqual(
            str(e.exception), f"f, line 2: alias *l0 nests it more than {MAX_DEPTH} levels deep, the limit"
        )

    def test_a_recursive_alias_is_refused(self) -> None:
        with self.assertRaises(FileError) as e:
            parse_documents(b"a: &a [1, *a]\n", "f")
        self.assertEqual(str(e.exception), "f, line 1: alias *a refers to the node it is in")

    def test_block_nesting_past_the_limit_is_refused(self) -> None:
        text = "".join(f"{' ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)) + " " * (MAX_DEPTH + 5) + "v\n"
        with self.assertRaises(FileError) as e:
            parse_documents(text.encode(), "f")
        self.assertEqual(
            str(e.exception), f"f, line {MAX_DEPTH + 1}: nests more than {MAX_DEPTH} levels deep, the limit"
        )

    def test_amp_config_refuses_any_anchor_or_alias(self) -> None:
        with self.assertRaises(FileError) as e:
            config_document(b"listen: {port: 8443}\nfailure_policy: &p Fail\n", "amp.yaml")
        self.assertEqual(
            str(e.exception), "amp.yaml, line 2: anchors and aliases are not allowed in amp's config (found &p)"
        )

    def test_invalid_utf8_names_line_and_byte(self) -> None:
        with self.assertRaises(FileError) as e:
            parse_documents(b"a: 1\nb: \xff\n", "f")
        self.assertEqual(str(e.exception), "f, line 2: not UTF-8 text (invalid start byte at byte 8)")

    def test_a_stream_is_read_only_up_to_its_cap(self) -> None:
        with self.assertRaises(FileError) as e:
            read_stream(_Endless(), "input stdin", INPUT_LIMIT)
        self.assertEqual(str(e.exception), "input stdin is larger than 16 MiB, the limit for this file")


# ---------------------------------------------------------------- every path


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_config_at_start(tmp_path: Path, kind: str) -> None:
    path = write_hostile(tmp_path, kind, "amp.yaml")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert_one_line(str(e.value), kind, path)


@pytest.mark.parametrize("kind", KINDS)
def test_serving_certificate(tmp_path: Path, kind: str) -> None:
    tls = dev_tls()
    key = write_hostile(tmp_path, kind, "tls.key")
    with pytest.raises(CertificateError) as e:
        ReloadingCertificate(str(tls["cert"]), key, clock=Clock()).load()
    assert "\n" not in str(e.value) and key in str(e.value), e.value


@pytest.mark.parametrize("kind", KINDS)
def test_endpoint_client_tls(tmp_path: Path, kind: str) -> None:
    bundle = write_hostile(tmp_path, kind, "ca.pem")
    with pytest.raises(LocalFailure) as e:
        client_tls(EndpointSettings(ca_bundle=bundle), "ep.tools.svc")
    assert "\n" not in e.value.message and bundle in e.value.message, e.value.message


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_kubeconfig(tmp_path: Path, kind: str) -> None:
    path = write_hostile(tmp_path, kind, "kubeconfig")
    with pytest.raises(FileError) as e:
        load_client_configuration(KubernetesConfig(source="kubeconfig", kubeconfig=path))
    assert_one_line(str(e.value), kind, path)


class ExplainTests(SynchronousTestCase):
    """C{amp explain} refuses each hostile file with one line and exit status 2."""

    def setUp(self) -> None:
        self.files = Files(self)
        self.pod = self.files.write("pod.yaml", yaml.safe_dump(pod("web")))
        self.dir = Path(self.files.dir)

    def refused(self, argv: list[str], kind: str, *names: str, stdin: Any = None) -> None:
        out, err = io.StringIO(), io.StringIO()
        status = self.successResultOf(
            run(argv, Clock(), stdin=stdin if stdin is not None else io.BytesIO(), stdout=out, stderr=err)
        )
        self.assertEqual((status, out.getvalue()), (EXIT_USAGE, ""), err.getvalue())
        self.assertTrue(err.getvalue().startswith("amp explain: "), err.getvalue())
        assert_one_line(err.getvalue(), kind, *names)

    def test_input_file(self) -> None:
        for kind in KINDS:
            path = write_hostile(self.dir, kind)
            self.refused(["-n", "team-a", path], kind, path)

    def test_input_on_stdin(self) -> None:
        for kind in KINDS:
            with open(write_hostile(self.dir, kind), "rb") as f:
                self.refused(["-n", "team-a", "-"], kind, "stdin", stdin=f)
        self.refused(["-n", "team-a", "-"], "50 MiB", "stdin", stdin=_Endless())

    def test_config(self) -> None:
        for kind in CONFIG_KINDS:
            path = write_hostile(self.dir, kind, "amp.yaml")
            self.refused(["--config", path, "-n", "team-a", self.pod], kind, path)

    def test_reply_over_the_cap_or_empty(self) -> None:
        for kind in ("50 MiB", "empty"):
            path = write_hostile(self.dir, kind, "reply.json")
            self.refused(["-n", "team-a", "--reply", path, self.pod], kind, path)
        self.refused(["-n", "team-a", "--reply", "-", self.pod], "50 MiB", "stdin", stdin=_Endless())

    def test_reply_content_is_judged_as_an_endpoint_reply(self) -> None:
        """
        A recorded reply's content is what an endpoint sent: amp's reply
        parser judges it (bounded as reviews are) and the failure policy
        decides, as it would for a live reply; never a traceback.
        """
        for kind in ("alias bomb", "100,000-deep JSON", "NaN", "invalid UTF-8"):
            path = write_hostile(self.dir, kind, "reply.json")
            ran = run_sync(
                self,
                [
                    "-n",
                    "team-a",
                    "--reply",
                    path,
                    "--set-label",
                    "amp.txn2.com/enabled=true",
                    "--set-annotation",
                    "amp.txn2.com/ep=http://ep.tools.svc/m",
                    "-o",
                    "json",
                    self.pod,
                ],
            )
            self.assertEqual((ran.status, ran.json["reason"]), (EXIT_FAILURE_POLICY, "invalid-json"), ran.err)


# ---------------------------------------------------------------- reload


class ReloadTests(ConfigFileCase):
    """A hostile file swapped in keeps the running config, counted, logged once per content."""

    def setUp(self) -> None:
        super().setUp()
        self.loads: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def held(self, f: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.loads.append((f, d))
        return d

    def swap(self, kind: str) -> None:
        """A new version of the ConfigMap volume holding the hostile file of C{kind}; then a poll."""
        self.volume.update("")
        write_hostile(self.dir / f"..2026_{self.volume.version:04d}", kind, "amp.yaml")
        self.clock.advance(INTERVAL)

    def test_each_hostile_kind_is_refused_counted_and_logged_once_per_content(self) -> None:
        self.start(at_once)
        for i, kind in enumerate(CONFIG_KINDS):
            self.swap(kind)
            self.assertEqual(self.reloads("error"), i + 1, kind)
            [event] = self.events[i:]
            assert_one_line(formatEvent(event), kind, self.volume.path)
        # The same contents again: counted, not logged again.
        for kind in CONFIG_KINDS:
            self.swap(kind)
        self.assertEqual((self.reloads("error"), len(self.events)), (2 * len(CONFIG_KINDS), len(CONFIG_KINDS)))
        self.assertEqual((self.applied, self.file.running), ([], self.running))
        self.volume.update(yaml_of(failure_policy="Fail"))
        self.clock.advance(INTERVAL)
        self.assertEqual([c.failure_policy for c in self.applied], ["Fail"])

    def test_the_file_is_read_and_parsed_off_the_reactor_thread(self) -> None:
        """
        The reactor only starts the load; nothing is read or put in force
        until the thread's result comes back, and polls meanwhile start no
        second load; a SIGHUP during the load loads again after it.
        """
        self.start(self.held)
        self.volume.update(yaml_of(failure_policy="Fail"))
        self.clock.advance(INTERVAL)
        [(load, done)] = self.loads
        self.clock.advance(INTERVAL * 10)
        self.file.reload()
        self.assertEqual((len(self.loads), self.applied), (1, []))
        done.callback(load())  # what the thread pool does
        self.assertEqual([c.failure_policy for c in self.applied], ["Fail"])
        self.assertEqual(len(self.loads), 2, "the SIGHUP during the load loads again")
        again, finished = self.loads[1]
        finished.callback(again())
        self.assertEqual(len(self.applied), 1)

    def test_the_load_crosses_back_as_a_parsed_config_or_an_error(self) -> None:
        loaded = load_config_file(self.volume.path, None)
        self.assertIsInstance(loaded.config, Config)
        self.assertEqual(load_config_file(self.volume.path, loaded.state), Loaded(loaded.state))
        (self.dir / "bomb.yaml").write_bytes(ALIAS_BOMB)
        bomb = load_config_file(str(self.dir / "bomb.yaml"), None)
        self.assertEqual(
            (bomb.config, bomb.error),
            (
                None,
                f"(file): {self.dir / 'bomb.yaml'}, line 1: anchors and "
                f"aliases are not allowed in amp's config (found &a)",
            ),
        )
