"""Answer a job's next open interaction of one kind, once it appears.

An interaction's id is made when the agent asks, so a script cannot know it in advance;
this waits for the job's oldest open interaction of ``KIND`` (question, plan or
permission) and answers it with ``ANSWER.json``. The README's tour answers
``examples/cursor-tour.json`` with it:

    .venv/bin/python examples/answer.py cursor-tour-0001 question examples/answers/colour.json

Waiting for a given kind, not for any open interaction, keeps a second call from
answering the first one again while the worker is still resolving it. Only the public
CLI is used (``acp-worker interactions --open --json``, ``acp-worker answer``), against
``ACPW_REDIS_URL`` or, when that is unset, the local default ``redis://127.0.0.1:6379/0``.
Exits with ``acp-worker answer``'s code, or 1 when nothing of that kind opened in time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ACP_WORKER = str(Path(sys.executable).parent / "acp-worker")
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def open_interaction(job_id: str, kind: str, redis_url: str) -> str | None:
    """The id of the job's oldest open interaction of ``kind``, if there is one."""
    listing = subprocess.run(
        [ACP_WORKER, "interactions", job_id, "--open", "--json", "--redis", redis_url],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:
        return None  # the job is not submitted yet, or Redis is not up yet: keep waiting
    for line in listing.stdout.splitlines():
        record = json.loads(line)
        if record.get("kind") == kind:
            return str(record["interaction_id"])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_id")
    parser.add_argument("kind", choices=["question", "plan", "permission"])
    parser.add_argument("answer", type=Path, help="the answer JSON file")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds (default 60)")
    args = parser.parse_args()
    redis_url = os.environ.get("ACPW_REDIS_URL") or DEFAULT_REDIS
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        interaction_id = open_interaction(args.job_id, args.kind, redis_url)
        if interaction_id is not None:
            command = [ACP_WORKER, "answer", args.job_id, interaction_id, str(args.answer)]
            return subprocess.run([*command, "--redis", redis_url], check=False).returncode
        time.sleep(0.5)
    print(f"no open {args.kind} of job {args.job_id} within {args.wait:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
