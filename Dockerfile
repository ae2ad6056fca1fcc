# The worker's own image (not a sandbox image: those are images/*.Containerfile).
#
#   make worker-image        # here: offline, FROM the local sandbox base image, via Podman
#   make lock-deps           # regenerate requirements.lock (pip-compile --generate-hashes)
#
# The build needs no network: scripts/worker-image.sh first fills build/worker-wheels/
# on the host — deps/ with `pip wheel --require-hashes -r requirements.lock` (every
# file checked against the lock's hashes), project/ with the acp-worker wheel — and
# this file installs only from there (`--no-index --require-hashes`). By hand:
#
#   scripts/worker-image.sh --wheels-only     # build/worker-wheels/, empty build/worker-debs/
#   docker build --build-arg BASE=<image>@sha256:<digest> -t acp-worker .
#
# BASE must be pinned by digest and have Python 3.11 as `python3` on PATH (the wheels are
# cp311 manylinux). The default names the official python:3.11-slim-bookworm by a digest
# copied from public Dockerfiles that pin it; no registry is reachable from the machines
# this is developed on, so that digest is NOT verified here: check it (`crane digest`,
# `docker buildx imagetools inspect`) before a real deployment, and move it with the base
# image's security releases. Here, scripts/worker-image.sh passes the id of the locally built sandbox base
# (Debian 12, Python 3.11.2; `acp-worker image base`, which has git and CA certificates)
# and the .debs of what it lacks (bubblewrap, libseccomp2), since the build has no
# network for apt.
ARG BASE=docker.io/library/python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${BASE} AS install
USER 0:0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
COPY requirements.lock /src/requirements.lock
COPY build/worker-wheels/deps/ /wheels/
# pip itself runs from its own wheel, after that wheel's hash is found in the lock; it
# then installs everything (pip included) with hash checking, from /wheels only.
RUN set -eu; \
    python3 -m venv --without-pip /opt/acpw; \
    pip_wheel="$(echo /wheels/pip-*.whl)"; \
    grep -q "sha256:$(sha256sum "$pip_wheel" | cut -d' ' -f1)" /src/requirements.lock; \
    /opt/acpw/bin/python "$pip_wheel/pip" install --no-index --find-links /wheels \
        --require-hashes --only-binary :all: -r /src/requirements.lock

FROM ${BASE}
# libseccomp2 for the seccomp filter (pyseccomp loads it: every CLI command imports it),
# bubblewrap for the local backend, git for git workspaces; the docker and kubernetes
# backends need only their API endpoint. Installed with apt, or — when the build context
# has them in build/worker-debs/ (scripts/worker-image.sh: `apt-get download` on the host,
# for an offline build) — with dpkg from there.
ARG APT_PACKAGES="bubblewrap ca-certificates git libseccomp2"
USER 0:0
COPY build/worker-debs/ /tmp/debs/
RUN set -eu; \
    export PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH"; \
    if ls /tmp/debs/*.deb >/dev/null 2>&1; then \
        dpkg -i /tmp/debs/*.deb; \
    elif [ -n "$APT_PACKAGES" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends $APT_PACKAGES; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    rm -rf /tmp/debs; \
    echo "acpw:x:10001:10001:acp-worker:/var/lib/acp-worker:/usr/sbin/nologin" >> /etc/passwd; \
    echo "acpw:x:10001:" >> /etc/group; \
    mkdir -p /var/lib/acp-worker; \
    chown 10001:10001 /var/lib/acp-worker; \
    chmod 0750 /var/lib/acp-worker
COPY --from=install /opt/acpw /opt/acpw
# acp-worker itself last, with --no-deps (everything it needs is locked above): a change
# of the sources rebuilds only these small layers.
COPY build/worker-wheels/project/ /tmp/project/
RUN /opt/acpw/bin/python -m pip install --no-index --no-deps /tmp/project/acp_worker-*.whl \
    && /opt/acpw/bin/python -m pip check \
    && rm -rf /tmp/project
# Pack declarations and locks (archives come from their HTTPS/S3 sources or a volume);
# the Containerfiles where an installed acp-worker looks for them.
COPY provider_packs/ /opt/acp-worker/provider_packs/
COPY images/ /opt/acpw/share/acp-worker/images/
ENV PATH=/opt/acpw/bin:$PATH \
    HOME=/var/lib/acp-worker \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ACPW_PACKS_DIR=/opt/acp-worker/provider_packs \
    ACPW_CACHE_DIR=/var/lib/acp-worker/cache \
    ACPW_WORK_DIR=/var/lib/acp-worker/work \
    ACPW_RESULTS_DIR=/var/lib/acp-worker/results \
    ACPW_WORKSPACE_DISK=off \
    ACPW_LOCAL_WORKSPACE_ROOTS=[]
# A non-root worker cannot loop-mount the per-job disk that enforces limits.disk_mb, so
# the image turns it off (each job then says so in a `notice`): bound the work dir with
# the pod's ephemeral-storage limit or a sized volume instead. A worker run as root with
# /dev/loop-control (and e2fsprogs) may set ACPW_WORKSPACE_DISK=loop.
USER 10001:10001
WORKDIR /var/lib/acp-worker
# `acp-worker ready`: exit 0 only when Redis (ACPW_REDIS_URL) answers a PING and the
# configured sandbox backend lists its sandboxes; exit 1 otherwise.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["acp-worker", "ready"]
ENTRYPOINT ["acp-worker"]
CMD ["serve"]
