"""``acp-worker admission check DIR``: would this workspace be admitted?

Exit 0 when admitted, 3 (``admission_refused``) with every finding when refused, 2 when
DIR is missing. Human output is one ``rule  path  reason`` line per finding, and one
``note: code  path  reason`` line on stderr per thing the check could not judge (a
``.git`` pointing nowhere); ``--json`` prints ``{"admitted": ..., "findings": [...],
"notes": [...]}`` on stdout either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.admission import (
    DEFAULT_SYSTEM_ROOTS,
    PROVIDERS,
    AdmissionResult,
    check_workspace,
)
from worker.cli import add_json_flag
from worker.errors import EXIT_REFUSED, EXIT_SUCCEEDED, AdmissionRefused
from worker.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    admission = sub.add_parser("admission", help="workspace config admission")
    actions = admission.add_subparsers(dest="admission_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="list every reason a workspace would be refused")
    check.add_argument("dir", type=Path, help="the workspace directory")
    check.add_argument("--provider", choices=PROVIDERS, default="cursor", help="agent provider")
    check.add_argument(
        "--system-root",
        type=Path,
        action="append",
        dest="system_roots",
        metavar="DIR",
        help="root whose etc/ holds system hook config (repeatable; default /, "
        "e.g. a sandbox image's root filesystem)",
    )
    add_json_flag(check)
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace, settings: Settings) -> int:
    roots = tuple(args.system_roots or DEFAULT_SYSTEM_ROOTS)
    result = check_workspace(args.dir, provider=args.provider, system_roots=roots)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        _print_human(result)
    return EXIT_SUCCEEDED if result.admitted else EXIT_REFUSED


def _print_human(result: AdmissionResult) -> None:
    for note in result.notes:
        print(f"note: {note.code}  {note.path}  {note.reason}", file=sys.stderr)
    if result.admitted:
        print(f"admitted: {result.workspace}")
        return
    for finding in result.findings:
        print(f"{finding.rule}  {finding.path}  {finding.reason}")
    code = AdmissionRefused.code
    count = len(result.findings)
    print(
        f"acp-worker: workspace {result.workspace} refused, {count} finding(s) [{code}]",
        file=sys.stderr,
    )
