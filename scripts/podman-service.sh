#!/usr/bin/env bash
# Podman's Docker-compatible API for the docker backend's tests and local runs.
#
#   scripts/podman-service.sh start    # prints DOCKER_HOST=unix://… on stdout
#   scripts/podman-service.sh stop     # service, containers, conmon, mounts, cgroups
#   scripts/podman-service.sh status   # exit 0 when the API answers
#   scripts/podman-service.sh purge    # stop, then delete the image store too
#
# Configuration that works on these hosts (also described in docs/operating.md):
# runc (crun fails on the cgroup v1/v2 hybrid), cgroupfs (no systemd), file events,
# default_ulimits, storage under ACPW_PODMAN_DIR instead of /var/lib/containers.
# The image store survives `stop` on purpose: the sandbox base image (built once,
# ~1 min) is reused by the next run on the same machine. `purge` drops it.
#
# Environment: ACPW_PODMAN_DIR (default /var/tmp/acpw-podman),
#              ACPW_PODMAN_INSTALL=1 to apt-get install podman/runc/catatonit if missing.
set -euo pipefail

DIR="${ACPW_PODMAN_DIR:-/var/tmp/acpw-podman}"
RUN="$DIR/run"
SOCK="$RUN/podman.sock"
PIDFILE="$RUN/service.pid"
LOG="$RUN/service.log"
CONF="$DIR/containers.conf"
STORAGE_CONF="$DIR/storage.conf"

log() { echo "podman-service: $*" >&2; }

install_if_missing() {
  command -v podman >/dev/null && command -v runc >/dev/null && return 0
  if [[ "${ACPW_PODMAN_INSTALL:-0}" != 1 ]]; then
    log "podman/runc not installed (apt-get install podman runc catatonit, or ACPW_PODMAN_INSTALL=1)"
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    podman runc catatonit >&2
}

write_config() {
  mkdir -p "$RUN" "$DIR/storage" "$DIR/tmp"
  cat >"$CONF" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
init_path = "/usr/bin/catatonit"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$RUN/events.log"
tmp_dir = "$RUN/libpod"
image_parallel_copies = 2
EOF
  cat >"$STORAGE_CONF" <<EOF
[storage]
driver = "overlay"
graphroot = "$DIR/storage"
runroot = "$RUN/storage"
EOF
}

podman_() {
  CONTAINERS_CONF="$CONF" CONTAINERS_STORAGE_CONF="$STORAGE_CONF" TMPDIR="$DIR/tmp" \
    podman "$@"
}

answers() {
  [[ -S "$SOCK" ]] && curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1
}

start() {
  install_if_missing
  write_config
  if answers; then
    echo "DOCKER_HOST=unix://$SOCK"
    return 0
  fi
  cleanup_leftovers
  rm -f "$SOCK"
  # From its run dir: conmon inherits the service's cwd and leaves an empty `oom` file
  # there when a container's cgroup reports OOM events (it did in the repo's root).
  (cd "$RUN" && CONTAINERS_CONF="$CONF" CONTAINERS_STORAGE_CONF="$STORAGE_CONF" TMPDIR="$DIR/tmp" \
    exec setsid podman system service --time=0 "unix://$SOCK" >"$LOG" 2>&1 </dev/null 9>&-) &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 100); do
    if answers; then
      echo "DOCKER_HOST=unix://$SOCK"
      return 0
    fi
    sleep 0.1
  done
  log "the API did not answer within 10 s; log follows"
  tail -n 20 "$LOG" >&2 || true
  stop_service
  return 1
}

stop_service() {
  local pid
  [[ -f "$PIDFILE" ]] || return 0
  pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$SOCK"
}

# conmon processes of *our* store only (their command line names our run dir).
our_conmons() {
  local pid
  for pid in $(pgrep -x conmon || true); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/"; then
      echo "$pid"
    fi
  done
}

cleanup_leftovers() {
  local pid mnt cg
  for pid in $(our_conmons); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Overlay/shm mounts below our store, deepest first.
  awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  # Empty per-container cgroups podman leaves under libpod_parent (cgroupfs manager).
  for cg in /sys/fs/cgroup/*/libpod_parent /sys/fs/cgroup/libpod_parent; do
    [[ -d "$cg" ]] || continue
    find "$cg" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
  done
}

stop() {
  write_config
  if answers; then
    # Containers first, while the service can still stop them cleanly.
    podman_ rm --all --force --time 0 >/dev/null 2>&1 || true
  fi
  stop_service
  podman_ rm --all --force --time 0 >/dev/null 2>&1 || true
  cleanup_leftovers
}

# One start/stop/purge at a time per store: two test sessions starting at once would
# otherwise both find no answer and start two services on one socket.
serialize() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.service.lock"
  flock 9
}

case "${1:-}" in
start) serialize; start ;;
stop) serialize; stop ;;
status) answers && echo "DOCKER_HOST=unix://$SOCK" ;;
purge)
  serialize
  stop
  podman_ system reset --force >/dev/null 2>&1 || true
  cleanup_leftovers
  rm -rf "$DIR"
  ;;
*)
  echo "usage: $0 start|stop|status|purge" >&2
  exit 2
  ;;
esac
