"""
Every example endpoint on one port: ``twistd -n amp-example`` (the plugin
in ``twisted/plugins/amp_example_plugin.py``), as ``make demo``, the
end-to-end tests and ``etc/amp.yaml`` use them.

This module owns putting the programs together: one ``Options`` with each
program's options, one resource tree with each program's paths, and the
twistd service. The endpoints themselves live in their programs:

=====================  ======================================================
``/user-env``          ``user_env``: JupyterHub user env, home and init container
``/registry``          ``registry``: image registry rewrite
``/sidecar``           ``sidecar``: proxy sidecar and init container
``/poddefault``        ``poddefault``: Kubeflow PodDefault presets
``/filer``             ``filer``: file-share sidecars for notebooks
``/deny`` ... ``/hang``  ``failures``: endpoints that misbehave on purpose
=====================  ======================================================
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from twisted.application.service import IService
from twisted.web import server
from twisted.web.resource import Resource

from amp_examples import failures, filer, poddefault, registry, serving, sidecar, user_env

PROGRAMS = (user_env, registry, sidecar, poddefault, filer, failures)


class Options(*(program.Options for program in PROGRAMS)):  # type: ignore[misc]
    """Command line of ``twistd amp-example``: the listening options plus every program's own."""

    longdesc = "Serve every example amp endpoint over plain HTTP: " + ", ".join(
        f"/{path}" for program in PROGRAMS for path in program.endpoints({})
    )


def handlers(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    """Every program's handlers by path, configured from ``options``."""
    found: dict[str, serving.Handler] = {}
    for program in PROGRAMS:
        found.update(program.endpoints(options))
    return found


def build_root(
    registry_map: Mapping[str, str] | None = None,
    presets: Sequence[poddefault.Preset] | None = None,
    share_config: filer.ShareConfig | None = None,
    max_body: int = serving.MAX_BODY,
) -> Resource:
    """The resource tree of every example endpoint (the programs' defaults where an argument is None)."""
    options: dict[str, Any] = {}
    if registry_map is not None:
        options["registry_map"] = registry_map
    if presets is not None:
        options["preset_list"] = presets
    if share_config is not None:
        options["share_config"] = share_config
    return serving.build_root(handlers(options), max_body)


def build_site(max_body: int = serving.MAX_BODY, reactor: Any = None, **config: Any) -> server.Site:
    """A Site over ``build_root(**config)`` whose requests cap their bodies at ``max_body``."""
    return serving.build_site(build_root(max_body=max_body, **config), max_body, reactor)


def makeService(options: Options, reactor: Any = None) -> IService:
    """The listening service of ``twistd amp-example``."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    return serving.make_service(options, handlers(options), reactor)
