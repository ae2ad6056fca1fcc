#!/usr/bin/env bash
# Rebuild the archives of the npm provider packs (every provider_packs/*/ with a
# package-lock.json) from their committed locks, and check each against its pin.
#
#   scripts/npm-packs.sh                 # build what dist/ lacks (a no-op when cached)
#   scripts/npm-packs.sh --lock NAME SPEC [--bin BIN]
#                                        # (re)pin NAME to SPEC (name@x.y.z), then commit
#                                        # its package.json, package-lock.json, pack.json, lock/
#
# Needs the Node.js each pack declares (launch.runtime: >= 20 at /usr/bin/node, which the
# packs launch inside the sandbox), checked exactly as the worker checks it before a
# launch, and npm >= 10.4 (--os/--cpu/--libc) reaching the npm registry; npm's own cache
# (~/.npm) keeps repeat builds offline-fast. scripts/bootstrap.sh installs both, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
ACPW=${ACPW:-.venv/bin/acp-worker}
PY=${PY:-.venv/bin/python}

"$PY" - <<'EOF'
import sys
from pathlib import Path

from worker.errors import WorkerError
from worker.packs.manifest import load_pack_dir
from worker.packs.requirements import check_runtime

for lock in sorted(Path("provider_packs").glob("*/package-lock.json")):
    try:
        check_runtime(load_pack_dir(lock.parent), host_usr=True)
    except WorkerError as exc:
        sys.exit(f"npm-packs: {exc.message} (scripts/bootstrap.sh installs it)")
EOF
npm_version=$(npm --version 2>/dev/null || echo 0)
if [ "$(printf '%s\n' 10.4.0 "$npm_version" | sort -V | head -n1)" != 10.4.0 ]; then
  echo "npm-packs: npm >= 10.4 is required (npm --version: $npm_version; scripts/bootstrap.sh installs it)" >&2
  exit 1
fi

if [ "${1:-}" = "--lock" ]; then
  shift
  name=$1 spec=$2
  shift 2
  exec "$ACPW" pack lock-npm "$spec" --pack "$name" "$@"
fi

pids=() names=()
for lock in provider_packs/*/package-lock.json; do
  [ -e "$lock" ] || continue
  name=$(basename "$(dirname "$lock")")
  "$ACPW" pack build-npm "$name" &
  pids+=($!) names+=("$name")
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "npm-packs: ${names[$i]} failed" >&2
    status=1
  fi
done
exit $status
