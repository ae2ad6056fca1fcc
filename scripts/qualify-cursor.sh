#!/usr/bin/env bash
# `make qualify-cursor`: the conformance turns against real Cursor (tests/conformance/
# test_cursor_live.py) with the locked `cursor` pack, recording `agent --version` with
# the results. Needs CURSOR_API_KEY and internet; without the key it says so and runs
# nothing (exit 0: nothing failed, and nothing is qualified).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CURSOR_API_KEY:-}" ]; then
  echo "qualify-cursor: SKIPPED — CURSOR_API_KEY is not set, so no turn ran against real" \
       "Cursor and nothing is qualified. On a machine with internet: lock the pack once" \
       "(.venv/bin/acp-worker pack lock cursor), then CURSOR_API_KEY=… make qualify-cursor."
  exit 0
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider -rA tests/conformance/test_cursor_live.py "$@"
