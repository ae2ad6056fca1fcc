#!/usr/bin/env bash
# Builds the worker's own image (the top-level Dockerfile) through Podman, offline.
#
#   scripts/worker-image.sh                # wheels, then the image; prints its id on stdout
#   scripts/worker-image.sh --wheels-only  # only build/worker-wheels/ (for `docker build`)
#
# 1. build/worker-wheels/deps/: `pip wheel --require-hashes -r requirements.lock`, then
#    every file checked against the lock's hashes (a wheel pip built from an sdist would
#    not be in the lock: refused here, not in the middle of the image build). Cached:
#    redone only when requirements.lock changes.
# 2. build/worker-wheels/project/: the acp-worker wheel, built from a clean copy of the
#    sources with SOURCE_DATE_EPOCH fixed, so unchanged sources give the same bytes and
#    the image build reuses its cached layers.
# 3. build/worker-debs/: the .debs of DEBS (default: what the local base image lacks,
#    bubblewrap and libseccomp2), `apt-get download`ed on the host from its apt sources
#    (checked by apt against the signed indexes); the Dockerfile installs them with dpkg
#    instead of reaching apt over the network. DEBS="" (and --wheels-only) leave it empty.
# 4. `podman build --network=none --format docker` (docker format: OCI images drop
#    HEALTHCHECK) with the Podman configuration of scripts/podman-service.sh, so the
#    image lands in the store its Docker API service serves.
#
# Environment: BASE (default: the local sandbox base image's id, `acp-worker image base`),
#   DEBS (see 3), TAG (default localhost/acp-worker:<version>), VENV (default .venv),
#   ACPW_PODMAN_DIR (as scripts/podman-service.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
WHEELS=build/worker-wheels
DIR="${ACPW_PODMAN_DIR:-/var/tmp/acpw-podman}"
log() { echo "worker-image: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# Runs "$@" with its output kept back, shown only when it fails.
quietly() {
  local out
  if ! out="$("$@" 2>&1)"; then
    echo "$out" >&2
    return 1
  fi
}

deps_wheels() {
  local stamp want have file sum
  want="$(sha256sum requirements.lock | cut -d' ' -f1)"
  stamp="$WHEELS/deps/.requirements-lock-sha256"
  have="$(cat "$stamp" 2>/dev/null || true)"
  [[ "$have" == "$want" ]] && return 0
  log "wheels for requirements.lock → $WHEELS/deps"
  rm -rf "$WHEELS/deps"
  mkdir -p "$WHEELS/deps"
  quietly "$VENV/bin/python" -m pip wheel -q --require-hashes --no-deps --only-binary :all: \
    -r requirements.lock -w "$WHEELS/deps"
  for file in "$WHEELS"/deps/*.whl; do
    sum="$(sha256sum "$file" | cut -d' ' -f1)"
    if ! grep -q "sha256:$sum" requirements.lock; then
      log "$file is not one of the locked files (sha256 $sum)"
      return 1
    fi
  done
  [[ "$(find "$WHEELS/deps" -name '*.whl' | wc -l)" -eq "$(grep -c '==' requirements.lock)" ]] ||
    { log "not every locked package has a wheel in $WHEELS/deps"; return 1; }
  echo "$want" >"$stamp"
}

project_wheel() {
  local src
  src="$(mktemp -d)"
  trap 'rm -rf "$src"' RETURN
  cp -r pyproject.toml README.md worker tasks "$src/"
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  rm -rf "$WHEELS/project"
  mkdir -p "$WHEELS/project"
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 315532800)" \
    quietly "$VENV/bin/python" -m pip wheel -q --no-deps -w "$WHEELS/project" "$src"
  ls "$WHEELS"/project/acp_worker-*.whl >/dev/null
}

debs() {
  local want="$1" have
  mkdir -p build/worker-debs
  have="$(cat build/worker-debs/.packages 2>/dev/null || true)"
  [[ "$have" == "$want" ]] && return 0
  rm -f build/worker-debs/*.deb build/worker-debs/.packages
  if [[ -n "$want" ]]; then
    log "apt-get download $want → build/worker-debs"
    # shellcheck disable=SC2086 # a list of package names
    (cd build/worker-debs && quietly apt-get download $want)
  fi
  echo "$want" >build/worker-debs/.packages
}

base_image() {
  "$VENV/bin/acp-worker" image base --json | "$VENV/bin/python" -c \
    'import json, sys; print(json.load(sys.stdin)["image_id"].removeprefix("sha256:"))'
}

build_image() {
  local base tag version started
  version="$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
  tag="${TAG:-localhost/acp-worker:$version}"
  base="${BASE:-$(DOCKER_HOST="unix://$DIR/run/podman.sock" base_image)}"
  started="$(now)"
  log "podman build $tag FROM $base"
  CONTAINERS_CONF="$DIR/containers.conf" CONTAINERS_STORAGE_CONF="$DIR/storage.conf" \
    TMPDIR="$DIR/tmp" podman build --network=none --format docker --pull=never \
    --build-arg "BASE=$base" \
    --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    --iidfile "$WHEELS/image-id" -t "$tag" -f Dockerfile . >&2
  log "built $tag in $(since "$started") s"
  cat "$WHEELS/image-id"
  echo
}

started="$(now)"
deps_wheels
project_wheel
if [[ "${1:-}" == "--wheels-only" ]]; then
  debs ""
  log "wheels ready in $(since "$started") s"
  exit 0
fi
debs "${DEBS-bubblewrap libseccomp2}"
log "wheels and debs ready in $(since "$started") s"
# The image base (when BASE is not given) comes through the Docker API; the build itself
# needs only the configuration files the service script writes.
if [[ -z "${BASE:-}" || ! -f "$DIR/containers.conf" ]]; then
  scripts/podman-service.sh start >/dev/null
fi
build_image
log "total $(since "$started") s"
