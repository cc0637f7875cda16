"""
``/user-env``: the original amp's use case, JupyterHub user environments.

JupyterHub spawns a user's notebook Pod into a namespace; this endpoint
reads the user name from the Pod and adds what that user needs:

- every container gets ``AMP_USER=<user>`` and ``ADDED_VAR=something
  important`` (a variable of that name with another value is replaced);
- an ``emptyDir`` volume ``user-home`` is mounted at ``/home/<user>`` in the
  first container;
- an init container ``new-init-container`` is added.

The user comes from the ``hub.jupyter.org/username`` annotation, else the
label of that name, else ``anonymous``. What is already there is left
alone, so a second call on the changed Pod returns ``[]``. The reply is a
bare JSON array of operations, the Go amp's protocol.

Run it alone: ``python -m amp_examples.user_env --port 8090``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from amp_examples import serving
from amp_examples.patching import PatchBuilder, PatchOp, annotations, container_names, has_spec, items, labels

USERNAME_KEY = "hub.jupyter.org/username"
ANONYMOUS = "anonymous"
USER_VOLUME = "user-home"
USER_INIT_CONTAINER = {"name": "new-init-container", "image": "alpine:3.12.0"}
ADDED_VAR = ("ADDED_VAR", "something important")


def pod_username(pod: Mapping[str, Any]) -> str:
    """The JupyterHub user of a Pod: annotation, else label, else ``anonymous``."""
    for source in (annotations(pod), labels(pod)):
        value = source.get(USERNAME_KEY)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ANONYMOUS


def home_dir_name(user: str) -> str:
    """
    A safe single path segment for ``user``.

    Anything outside ``[A-Za-z0-9._-]`` becomes ``-``; ``.``/``..`` and empty
    results fall back to ``anonymous`` (a mountPath may not contain ``..``).
    """
    segment = re.sub(r"[^A-Za-z0-9._-]", "-", user)
    if segment in ("", ".", "..") or set(segment) <= {"."}:
        return ANONYMOUS
    return segment


def user_env_patch(pod: Mapping[str, Any]) -> list[PatchOp]:
    """The operations that give the Pod its user's env, home and init container; [] when it has them."""
    if not has_spec(pod):
        return []
    user = pod_username(pod)
    b = PatchBuilder(pod)
    containers = items(pod, ["spec", "containers"])
    for i, _ in containers:
        b.set_env(i, "AMP_USER", user)
        b.set_env(i, *ADDED_VAR)
    b.add_volume({"name": USER_VOLUME, "emptyDir": {}})
    if containers and containers[0][0] == 0:
        b.add_mount(0, {"name": USER_VOLUME, "mountPath": f"/home/{home_dir_name(user)}"})
    if USER_INIT_CONTAINER["name"] not in container_names(b.doc):
        b.append(["spec", "initContainers"], dict(USER_INIT_CONTAINER))
    return b.ops


class Options(serving.Options):
    longdesc = "Serve /user-env: JupyterHub user env vars, home volume and init container."


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    return {"user-env": lambda pod, call: user_env_patch(pod)}


if __name__ == "__main__":
    serving.main(Options, endpoints)
