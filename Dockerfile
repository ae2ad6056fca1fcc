# The worker's own image (not a sandbox image: those are images/*.Containerfile).
#
#   make requirements.lock        # pip-compile --generate-hashes (celery, docker, s3 extras)
#   docker build --build-arg BASE=python:3.11-slim-bookworm@sha256:<digest> -t acp-worker .
#
# BASE has no default on purpose: it must be pinned by digest by whoever builds (no
# registry is reachable from the development machines, so no digest is vouched for here).
ARG BASE
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/acpw && \
    /opt/acpw/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY tasks ./tasks
RUN /opt/acpw/bin/pip install --no-deps --no-build-isolation .

FROM ${BASE}
# bubblewrap for the local backend; the docker backend needs only the engine socket.
RUN apt-get update && \
    apt-get install -y --no-install-recommends bubblewrap ca-certificates git && \
    rm -rf /var/lib/apt/lists/* && \
    useradd --system --uid 10001 --home-dir /var/lib/acp-worker --create-home acpw
COPY --from=build /opt/acpw /opt/acpw
COPY provider_packs /opt/acp-worker/provider_packs
COPY images /opt/acp-worker/images
ENV PATH=/opt/acpw/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    ACPW_PACKS_DIR=/opt/acp-worker/provider_packs \
    ACPW_CACHE_DIR=/var/lib/acp-worker/cache \
    ACPW_WORK_DIR=/var/lib/acp-worker/work
USER 10001:10001
WORKDIR /var/lib/acp-worker
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, worker.settings as s; s.Settings(); sys.exit(0)"]
ENTRYPOINT ["acp-worker"]
CMD ["serve"]
