# amp's container image.  Build it from the repository root with
#
#   make image
#
# (tools/image: podman or Docker, whichever runs here; it adds the git
# revision and the build's labels), or by hand as
#
#   docker build -t amp:0.1.0 .
#
# (0.1.0: amp's version, amp/__init__.py; the label below says the same and
# tests/unit/repo/test_version.py keeps them equal.)  The dependencies are exactly those
# of requirements/amp.lock, checked against its hashes, on the newest Python
# amp supports; amp's own wheel is built with the build backend pinned in
# requirements/build.lock, so the build fetches nothing that no lock names.
#
# Two stages on the same base image: the first installs amp and its
# dependencies into a virtualenv at /opt/amp, the second copies only that
# virtualenv onto a clean base and runs as an unprivileged user.  The image
# needs no writable path at run time, so it runs with a read-only root
# filesystem (deploy/base/deployment.yaml).
#
# Where no registry is reachable, tools/install builds a stand-in for the
# base image from Debian's packages and tags it python:3.13-slim
# (docs/image.md says what it holds).

FROM python:3.13-slim AS build

# SOURCE_DATE_EPOCH (the commit's time, from tools/image) makes pip compile
# hash-checked .pyc files and setuptools date the wheel's entries by it, so
# two builds of one commit install the same bytes.  Where outgoing TLS is
# re-signed by a local CA, tools/image passes its bundle as the build secret
# build-ca and sets PIP_CERT to it: a secret is mounted into the RUN steps
# that ask for it and into no layer; neither reaches the final stage.
ARG SOURCE_DATE_EPOCH
ARG PIP_CERT

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# pip and the build backend live in a virtualenv of their own (/opt/build)
# that stays in this stage; /opt/amp, the one the image ships, has neither
# (pip installs into it through --python).  amp is installed by name from
# the wheel's directory, not by the wheel's path, so that no record of the
# wheel's own bytes (direct_url.json) lands in the image.
COPY requirements/build.lock ./requirements/build.lock
RUN --mount=type=secret,id=build-ca \
    python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements/build.lock
COPY requirements/amp.lock ./requirements/amp.lock
RUN --mount=type=secret,id=build-ca \
    python -m venv --without-pip /opt/amp \
    && /opt/build/bin/pip --python /opt/amp/bin/python install --no-cache-dir --require-hashes \
       -r requirements/amp.lock
COPY setup.py ./
COPY amp ./amp
COPY twisted ./twisted
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels /src \
    && /opt/build/bin/pip --python /opt/amp/bin/python install --no-cache-dir --no-deps --no-index \
       --find-links /wheels amp


FROM python:3.13-slim

LABEL org.opencontainers.image.title="amp" \
      org.opencontainers.image.description="Admission mutation proxy for Kubernetes" \
      org.opencontainers.image.version="0.1.0"

ENV PATH=/opt/amp/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

COPY --from=build /opt/amp /opt/amp

# twistd finds its "amp" plugin through Twisted's plugin cache
# (twisted/plugins/dropin.cache), which Twisted rewrites whenever it is
# missing or older than a plugin file.  On a read-only root filesystem it
# cannot, so the cache is built here, after the copy, from the files as they
# will be at run time; `twistd amp --help` then proves the plugin loads.
RUN python -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))" \
    && twistd amp --help > /dev/null

# 65532: the conventional "nonroot" uid/gid; it owns nothing in the image.
USER 65532:65532
WORKDIR /

EXPOSE 8443 9090

ENTRYPOINT ["twistd", "--nodaemon", "--pidfile=", "amp"]
CMD ["--config", "/etc/amp/amp.yaml"]
