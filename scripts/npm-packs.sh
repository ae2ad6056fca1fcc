#!/usr/bin/env bash
# Rebuild the archives of the npm provider packs (every provider_packs/*/ with a
# package-lock.json) from their committed locks, and check each against its pin.
#
#   scripts/npm-packs.sh                 # build what dist/ lacks (a no-op when cached)
#   scripts/npm-packs.sh --lock NAME SPEC [--bin BIN]
#                                        # (re)pin NAME to SPEC (name@x.y.z), then commit
#                                        # its package.json, package-lock.json, pack.json, lock/
#
# Needs Node >= 20 at /usr/bin/node (the packs launch it inside the sandbox) and npm
# reaching the npm registry; npm's own cache (~/.npm) keeps repeat builds offline-fast.
set -euo pipefail
cd "$(dirname "$0")/.."
ACPW=${ACPW:-.venv/bin/acp-worker}

major=$(/usr/bin/node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 20 ]; then
  echo "npm-packs: Node >= 20 is required at /usr/bin/node (found: ${major})" >&2
  exit 1
fi
command -v npm >/dev/null 2>&1 || { echo "npm-packs: npm is required" >&2; exit 1; }

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
