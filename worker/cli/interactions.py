"""``acp-worker answer`` and ``acp-worker interactions``: the control plane's side of
durable interactions (questions, plans, permission asks), over Redis.

    acp-worker interactions JOB_ID [--open]            what the job asked, and the state
    acp-worker answer JOB_ID INTERACTION_ID ANSWER.json  answer one (`-`: stdin)

``answer`` refuses at once what the worker would refuse (unknown or closed interaction,
an answer that does not fit: exit 2); the worker validates again and reports the outcome
as ``interaction.resolved`` or ``interaction.answer_rejected`` in the job's events.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from worker.cli.service import redis_flag, with_redis
from worker.client import Client
from worker.errors import InvalidAnswer
from worker.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    answer = sub.add_parser("answer", help="answer a job's open question, plan or permission")
    answer.add_argument("job_id", help="the job")
    answer.add_argument("interaction_id", help="from its interaction.requested event")
    answer.add_argument("answer", type=Path, help="the answer JSON file (`-` for stdin)")
    redis_flag(answer)
    answer.set_defaults(handler=_answer)
    listing = sub.add_parser("interactions", help="list a job's interactions")
    listing.add_argument("job_id", help="the job")
    listing.add_argument("--open", action="store_true", help="only those awaiting an answer")
    redis_flag(listing)
    listing.set_defaults(handler=_list)


def _client(args: argparse.Namespace, settings: Settings) -> Client:
    settings = with_redis(args, settings)
    return Client(settings.redis_url or "", settings=settings)


def _read_answer(path: Path) -> Any:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as exc:
        raise InvalidAnswer(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidAnswer(f"the answer is not JSON: {exc}") from None


def _answer(args: argparse.Namespace, settings: Settings) -> int:
    answer = _read_answer(args.answer)
    if not isinstance(answer, dict):
        raise InvalidAnswer("the answer must be a JSON object")
    with _client(args, settings) as client:
        entry = client.answer(args.job_id, args.interaction_id, answer)
    if getattr(args, "json", False):
        print(json.dumps({"interaction_id": args.interaction_id, "entry": entry}))
    else:
        print(f"answer to {args.interaction_id} sent ({entry})", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        records = client.interactions(args.job_id)
    if args.open:
        records = [r for r in records if r.get("status") == "open"]
    for record in records:
        if getattr(args, "json", False):
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(_line(record))
    return 0


def _line(record: dict[str, Any]) -> str:
    request = record.get("request") or {}
    if record.get("kind") == "question":
        what = "; ".join(
            f"{q['id']}: {q['prompt']} [{', '.join(o['id'] for o in q['options'])}]"
            + (" (several)" if q.get("allow_multiple") else "")
            for q in request.get("questions", [])
        )
    elif record.get("kind") == "plan":
        what = f"plan {request.get('name')!r} revision {request.get('revision')}"
    else:
        options = ", ".join(o["option_id"] for o in request.get("options", []))
        what = f"permission {request.get('title')!r} [{options}]"
    state = record.get("status")
    if state != "open":
        state = f"{state} ({record.get('answer', {}).get('outcome')}, {record.get('resolved_by')})"
    return f"{record['interaction_id']}  {record['kind']}  {state}  {what}"
