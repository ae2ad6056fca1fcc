"""The worker never imports the ``agent-client-protocol`` package (module ``acp``).

Importing ``acp.schema`` costs about a third of a second per process (pydantic builds the
package's models), more than the whole hello job takes; :mod:`worker.rpc.wire` gives the
figures. The package is a dev dependency that checks the wire in the tests
(``test_acp_schema``), not a runtime one, and the worker image does not install it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import worker

WORKER = Path(worker.__file__).parent

#: What a CLI run and a job load; checked in a fresh interpreter, so that the test
#: process's own imports (this suite imports ``acp``) do not count.
ENTRY_POINTS = ("worker.cli", "worker.job", "worker.acp.client", "worker.acp.session")


def _is_acp(name: str) -> bool:
    return name == "acp" or name.startswith("acp.")


def test_no_module_under_worker_imports_acp() -> None:
    """Static: also catches an import inside a function, which loading would not run."""
    offenders = []
    for path in sorted(WORKER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.relative_to(WORKER.parent)}:{node.lineno} {n}" for n in names if _is_acp(n)
            ]
    assert offenders == []


def test_loading_the_cli_and_a_job_does_not_load_acp() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {ENTRY_POINTS!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = json.loads(out)
    assert "worker.acp.client" in loaded  # the check ran what it says
    assert [name for name in loaded if _is_acp(name)] == []
