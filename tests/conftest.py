"""
pytest wiring for the whole suite.

``make test`` runs the suite on every CPU with pytest-xdist
(``-n auto --dist loadgroup``).  Tests are independent of one another: each
listens on port 0, works in its own temporary directory, and the development
certificates are made once per worker process.  What must not be split
between workers is grouped here: the end-to-end tests share one control
plane per session (one etcd + kube-apiserver, so they all go to one worker),
and a module whose tests share one expensive module-scoped run (the soak's
and the benchmark's quick runs, the image tests' containers) stays on one
worker so that the run happens once.

Hypothesis runs without its per-example deadline and its too-slow health
check everywhere: both are timings, which a busy machine breaks on its own.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("amp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("amp")

#: Modules whose tests share one module-scoped subprocess run (the image
#: tests: one running pair of containers).
_SHARED_RUN_MODULES = ("test_soak.py", "test_bench.py", "test_image.py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path
        if "e2e" in path.parts:
            item.add_marker(pytest.mark.xdist_group("e2e"))
        elif path.name in _SHARED_RUN_MODULES:
            item.add_marker(pytest.mark.xdist_group(path.stem))


def pytest_collection_finish(session: pytest.Session) -> None:
    """
    Refuse to run when pytest-xdist silently ignores the groups (as it does
    on pytest 9.2, pytest-xdist issue 1386): the quick runs would run once
    per worker and the e2e tests would start one control plane each.
    """
    if not session.config.getoption("loadgroup", False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"pytest-xdist did not group {item.nodeid} (--dist loadgroup); this pytest "
                f"({pytest.__version__}) breaks it: install amp's test extra (pytest < 9.2)"
            )
