# amp's container image.  Build it from the repository root:
#
#   docker build -t amp:0.1.0 .
#
# (0.1.0: amp's version, amp/__init__.py; the label below says the same and
# tests/test_version.py keeps them equal.)  The dependencies are exactly those
# of requirements/amp.lock, checked against its hashes, on the newest Python
# amp supports.
#
# Two stages on the same base image: the first installs amp and its
# dependencies into a virtualenv at /opt/amp, the second copies only that
# virtualenv onto a clean base and runs as an unprivileged user.  The image
# needs no writable path at run time, so it runs with a read-only root
# filesystem (deploy/base/deployment.yaml).

FROM python:3.13-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY requirements/amp.lock ./requirements/amp.lock
RUN python -m venv /opt/amp \
    && /opt/amp/bin/pip install --no-cache-dir --require-hashes -r requirements/amp.lock
COPY setup.py ./
COPY amp ./amp
COPY twisted ./twisted
RUN /opt/amp/bin/pip install --no-cache-dir --no-deps /src


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
