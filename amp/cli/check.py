"""
C{amp check}: amp's registration against what its config needs, the
daemon's own check (L{amp.registration.check}), from the command line or CI.

    amp check --manifest FILE [--config amp.yaml] [--cert tls.crt]
    amp check --cluster [--config amp.yaml] [--cert tls.crt] [--kubeconfig F] [--context C]

With C{--manifest} (C{-} reads standard input, e.g. C{helm template ... |
amp check --manifest -}) the MutatingWebhookConfiguration comes from the
rendered manifests, and so does amp's config when they hold amp's ConfigMap
(a key C{amp.yaml}) and no C{--config} is given.  With C{--cluster} it is
read with one GET.  C{--cert} (the PEM chain amp serves) also checks the
caBundle.  Exit status: 0 no problem, 1 problems (one line each), 2 bad
usage or input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import IO, TYPE_CHECKING, Any, Optional, Sequence, cast

from cryptography import x509
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool

from amp.config import Config, ConfigError, load_config, parse_config
from amp.files import INPUT_LIMIT, PEM_LIMIT, FileError, config_document, parse_documents, read_file, read_stream
from amp.registration import Problem, check, needs

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "find_registration", "run"]

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
KIND = "MutatingWebhookConfiguration"


class _Usage(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp check",
        description=(
            "Check amp's MutatingWebhookConfiguration against what amp's config needs (failure classes, "
            "selectors, timeouts, rules, sideEffects, reinvocationPolicy, caBundle)."
        ),
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--manifest", metavar="FILE", help="rendered manifests (YAML or JSON; - for stdin)")
    where.add_argument("--cluster", action="store_true", help="read the configuration from the cluster")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="amp's config (default: amp.yaml of the manifests' ConfigMap, else amp's defaults)",
    )
    parser.add_argument("--cert", metavar="FILE", help="the PEM certificate chain amp serves: check the caBundle")
    parser.add_argument("--own-namespace", metavar="NS", help="amp's namespace (default: kubernetes.own_namespace)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="with --cluster: the kubeconfig")
    parser.add_argument("--context", metavar="NAME", help="with --cluster: the kubeconfig's context")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")
    return parser


def find_registration(documents: Sequence[Any], name: Optional[str]) -> Optional[dict[str, Any]]:
    """The MutatingWebhookConfiguration named C{name} (the only one when None) of C{documents}."""
    found = [d for d in _objects(documents) if d.get("kind") == KIND]
    if name is not None:
        found = [d for d in found if (d.get("metadata") or {}).get("name") == name]
    if name is None and len(found) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name")) for d in found)
        raise _Usage(
            f"the manifests hold {len(found)} MutatingWebhookConfigurations ({names}): name amp's in "
            "kubernetes.webhook_configuration"
        )
    return found[0] if found else None


def _objects(documents: Sequence[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in documents:
        if isinstance(d, dict) and d.get("kind") == "List":
            out += _objects(d.get("items") or [])
        elif isinstance(d, dict):
            out.append(d)
    return out


def _manifest_config(documents: Sequence[Any], label: str) -> Optional[Config]:
    """amp's config from the ConfigMap of the manifests that holds C{amp.yaml}, if any."""
    for d in _objects(documents):
        data = d.get("data") if d.get("kind") == "ConfigMap" else None
        if isinstance(data, dict) and isinstance(data.get("amp.yaml"), str):
            where = f"{label}: ConfigMap {(d.get('metadata') or {}).get('name')} amp.yaml"
            try:
                return parse_config(config_document(data["amp.yaml"].encode(), where))
            except (ConfigError, FileError) as e:
                raise _Usage(f"{where}: {e}") from None
    return None


def _read(path: str, stdin: Any, limit: int) -> bytes:
    if path == "-":
        return read_stream(getattr(stdin, "buffer", stdin), "standard input", limit)
    return read_file(path, path, limit)[0]


def _chain(path: Optional[str]) -> list[x509.Certificate]:
    if path is None:
        return []
    data = read_file(path, path, PEM_LIMIT)[0]
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise _Usage(f"{path}: no PEM certificate ({e})") from None


def _from_cluster(config: Config, options: argparse.Namespace) -> Optional[dict[str, Any]]:
    """One GET of amp's configuration (blocking: run in a thread). None when it does not exist."""
    import kubernetes.client
    import urllib3
    from kubernetes.client.exceptions import ApiException

    from amp.kube import load_client_configuration
    from amp.reasons import NamespaceSource

    kube = dataclasses.replace(
        config.kubernetes,
        source=NamespaceSource.KUBECONFIG,
        kubeconfig=options.kubeconfig or config.kubernetes.kubeconfig,
        context=options.context or config.kubernetes.context,
    )
    name = kube.webhook_configuration
    if not name:
        raise _Usage("kubernetes.webhook_configuration is not set: which configuration is amp's?")
    api = kubernetes.client.ApiClient(load_client_configuration(kube))
    try:
        # _preload_content=False: the raw urllib3 response, not the model the client's annotation names.
        response = cast(
            urllib3.BaseHTTPResponse,
            kubernetes.client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                name, _request_timeout=kube.request_timeout, _preload_content=False
            ),
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise _Usage(f"MutatingWebhookConfiguration {name} could not be read: HTTP {e.status} {e.reason}") from None
    finally:
        api.close()
    result: dict[str, Any] = json.loads(response.data)
    return result


def render(problems: Sequence[Problem], where: str, output: str) -> str:
    """What C{amp check} prints."""
    if output == "json":
        return (
            json.dumps(
                {
                    "registration": where,
                    "problems": [{"problem": p.name.value, "message": p.message} for p in problems],
                },
                indent=2,
            )
            + "\n"
        )
    if not problems:
        return f"{where}: no registration problem\n"
    lines = [f"{where}: {len(problems)} registration problem(s)"]
    lines += [f"  {p.name}: {p.message}" for p in problems]
    return "\n".join(lines) + "\n"


def run(
    argv: Sequence[str],
    reactor: IAmpReactor,
    *,
    stdin: Any = None,
    stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None,
) -> "Deferred[int]":
    """C{amp check ARGV}: check, print, and fire with the exit status."""
    stdin = stdin if stdin is not None else sys.stdin
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        options = _parser().parse_args(list(argv))
    except SystemExit as e:
        return succeed(EXIT_OK if e.code == 0 else EXIT_USAGE)

    def usage(message: str) -> int:
        err.write(f"amp check: {message}\n")
        return EXIT_USAGE

    try:
        config = load_config(options.config) if options.config else None
        documents: list[Any] = []
        if options.manifest:
            label = "standard input" if options.manifest == "-" else options.manifest
            documents = parse_documents(_read(options.manifest, stdin, INPUT_LIMIT), label)
            if config is None:
                config = _manifest_config(documents, label)
        config = config if config is not None else Config()
        chain = _chain(options.cert)
    except (ConfigError, FileError, _Usage) as e:
        return succeed(usage(str(e)))

    def judged(obj: Optional[dict[str, Any]]) -> int:
        name = config.kubernetes.webhook_configuration or (obj or {}).get("metadata", {}).get("name") or "?"
        wanted = needs(
            dataclasses.replace(config, kubernetes=dataclasses.replace(config.kubernetes, webhook_configuration=name)),
            options.own_namespace,
        )
        problems = check(obj, wanted, chain, reactor.seconds())
        out.write(render(problems, f"{KIND} {name}", options.output))
        out.flush()
        return EXIT_PROBLEMS if problems else EXIT_OK

    if options.manifest:
        try:
            obj = find_registration(documents, config.kubernetes.webhook_configuration)
        except _Usage as e:
            return succeed(usage(str(e)))
        return succeed(judged(obj))
    d = deferToThreadPool(reactor, reactor.getThreadPool(), _from_cluster, config, options)

    def failed(failure: Any) -> int:
        error = failure.value
        return usage(str(error) if isinstance(error, _Usage) else f"the cluster could not be read: {error}")

    return d.addCallbacks(judged, failed)
