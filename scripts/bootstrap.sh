#!/usr/bin/env bash
# Installs what `make demo` / `make test` need on a fresh Debian machine, idempotently:
# bubblewrap and the rest from apt, Node.js >= 20 and npm >= 10.4 (pinned, from the npm
# registry: scripts/node/install.sh), a virtualenv with the package and its dev extras, a
# Redis answering on 127.0.0.1:6379. Prints what it does; quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi

# $1 >= $2, as versions.
at_least() { [ "$(printf '%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# The Sentinel failover tests start their own sentinels on loopback ports.
command -v redis-sentinel >/dev/null 2>&1 || need_apt+=(redis-sentinel)
command -v git >/dev/null 2>&1 || need_apt+=(git)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
# Debian's python3 makes venvs only with python3-venv (ensurepip); not needed for a venv
# that exists already.
if [ ! -x "$VENV/bin/python" ] && ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
# The docker backend is tested against Podman's Docker-compatible API (docs/operating.md);
# mmdebstrap builds the sandbox base image's rootfs from the configured apt mirror.
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /usr/bin/catatonit ] || need_apt+=(catatonit)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
# Image push/pull is tested against Debian's distribution (registry v2) server, which the
# tests start on a loopback port themselves; the package's own service is not wanted.
command -v docker-registry >/dev/null 2>&1 || need_apt+=(docker-registry)
# The npm packs launch /usr/bin/node inside the sandbox (which sees the host's /usr) and
# declare Node.js >= 20 (launch.runtime); building them needs npm >= 10.4 (--os/--cpu/
# --libc). Debian 12 has 18 and 9.2: good enough to fetch the pinned ones with.
node_major=$(/usr/bin/node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
need_node=false
if [ "$node_major" -lt 20 ] || ! at_least "$(npm --version 2>/dev/null || echo 0)" 10.4.0; then
  need_node=true
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: apt-get install ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  if [[ " ${need_apt[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
fi
if $need_node; then
  echo "bootstrap: Node.js 20 and npm from the npm registry (scripts/node/install.sh)" >&2
  $SUDO scripts/node/install.sh
fi

stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "bootstrap: creating $VENV and installing acp-worker[dev]" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # uv (from PyPI, into the venv) resolves the same releases as pip but fetches and
  # installs them in parallel: about 10-20 s on a fresh clone where pip took about 2 min.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check uv
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -e ".[dev,celery]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

# The checkout is installed editable, so nothing compiled its bytecode; with
# PYTHONDONTWRITEBYTECODE set (as on these machines) every command would compile the
# worker from source again (≈ 0.5 s of `acp-worker run`'s start). Only stale files are
# compiled: cheap when nothing changed.
"$VENV/bin/python" -m compileall -q worker tasks >/dev/null
# Nor did uv compile the dependencies' (pip does, as in the worker image): pydantic,
# pydantic-settings and the rest compiled from source again on every command, ≈ 0.5 s of
# `acp-worker run`'s start on these machines (docs/figures.md, one_shot.py). Once per venv
# (a minute or so on 2 cores), then a stamp keyed like the install's: a new pyproject.toml
# (a new install) compiles again.
compiled="$VENV/.compiled-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$compiled" ]; then
  echo "bootstrap: compiling the dependencies' bytecode" >&2
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
  rm -f "$VENV"/.compiled-*
  touch "$compiled"
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "bootstrap: starting redis-server on 127.0.0.1:6379" >&2
  mkdir -p /tmp/acpw-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp/acpw-redis --logfile /tmp/acpw-redis/redis.log
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
