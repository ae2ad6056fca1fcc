"""A control plane in one page, through the Python client: submit a job, follow its
events as typed models, answer what the agent asks, and say how the job settled.

Start a worker for the examples first (``make serve-demo``, README step 2), then, from
the repository root:

    .venv/bin/python examples/control_plane.py examples/cursor-tour.json --new-attempt

It answers each interaction with the file of ``examples/answers/`` for its kind (a
question, a plan, a permission ask). Redis: ``ACPW_REDIS_URL``, else the local default.
Exits 0 when the job succeeded, 1 otherwise; docs/client.md explains each call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from worker.client import Client
from worker.events.models import InteractionRequested, JobCompleted, MessageDelta, ToolStarted

ANSWERS = Path(__file__).resolve().parent / "answers"
ANSWER_FOR = {
    "question": ANSWERS / "colour.json",
    "plan": ANSWERS / "accept-plan.json",
    "permission": ANSWERS / "allow-once.json",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path, help="a job spec (JSON)")
    parser.add_argument("--new-attempt", action="store_true", help="run a settled job again")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    args = parser.parse_args()
    job = json.loads(args.job.read_text())
    redis_url = os.environ.get("ACPW_REDIS_URL") or "redis://127.0.0.1:6379/0"
    with Client(redis_url) as client:
        submitted = client.submit(job, new_attempt=args.new_attempt)
        print(f"{job['job_id']}: {submitted.outcome}, attempt {submitted.state.attempt}")
        # This attempt's events only: a job run again keeps its earlier attempts' too.
        attempt = submitted.state.attempt
        events = client.events(job["job_id"], follow=True, timeout=args.timeout, attempt=attempt)
        for item in events:
            data = item.envelope.data
            if isinstance(data, MessageDelta) and data.role == "assistant":
                print(f"agent: {data.text}")
            elif isinstance(data, ToolStarted):
                print(f"tool:  {data.title}")
            elif isinstance(data, InteractionRequested):
                answer = json.loads(ANSWER_FOR[data.kind].read_text())
                client.answer(job["job_id"], data.interaction_id, answer)
                print(f"asked: {data.kind}, answered with {ANSWER_FOR[data.kind].name}")
            elif isinstance(data, JobCompleted):
                print(f"job {data.status} in {data.duration_ms:.0f} ms")
                return 0 if data.status == "succeeded" else 1
    print("the job did not settle in time", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
