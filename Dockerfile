# One hrwcron scheduler replica per container.
#
#   docker build -t hrwcron .
#   docker run --rm -e HRWCRON_NATS_URL=nats://nats:4222 -e HRWCRON_NATS_USER=scheduler \
#     -e HRWCRON_NATS_PASSWORD=... hrwcron
#   docker run --rm -v "$PWD/hrwcron.toml:/etc/hrwcron/hrwcron.toml:ro" hrwcron \
#     run --config /etc/hrwcron/hrwcron.toml
#
# Configuration comes from a mounted TOML file, HRWCRON_* environment variables, or both (the
# variables win). Health, readiness and metrics are served on HRWCRON_HTTP_LISTEN.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
# A virtual environment without pip of its own, filled by the base image's pip: the runtime
# stage copies it whole and gets the application and its dependencies, no installer.
RUN python -m venv --without-pip /opt/hrwcron \
    && pip --python /opt/hrwcron/bin/python install --no-cache-dir .

FROM ${PYTHON_IMAGE}
# Nothing installs anything at run time, so the base image's pip goes. A fixed numeric user id
# lets Kubernetes' runAsNonRoot verify it without a passwd lookup.
RUN python -m pip uninstall --yes pip \
    && groupadd --system --gid 10001 hrwcron \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin hrwcron
COPY --from=build /opt/hrwcron /opt/hrwcron
# The configuration default is loopback, which nothing outside the container could reach.
# PYTHONDONTWRITEBYTECODE: the root file system may be read-only; the build compiled already.
ENV PATH=/opt/hrwcron/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HRWCRON_HTTP_LISTEN=0.0.0.0:9464
USER 10001:10001
EXPOSE 9464
# Follows HRWCRON_HTTP_LISTEN's port; urllib fails on anything but 2xx, so no curl is needed.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; p = os.environ.get('HRWCRON_HTTP_LISTEN', '127.0.0.1:9464').rpartition(':')[2]; r.urlopen(f'http://127.0.0.1:{p}/healthz', timeout=4)"]
ENTRYPOINT ["hrwcron"]
CMD ["run"]
