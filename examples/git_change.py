"""A git workspace job, end to end: clone, let the emulator change it, show what changed.

There is no network here, so the example makes its own repository: a tiny one in a new
directory (four files, one commit on ``main``), served to the worker as ``file://``. It
fills ``workspace.url`` of ``examples/git-change.json`` with it, runs
``acp-worker run JOB --json`` and prints, from the events, what the worker captured: the
``workspace.changed`` entries and the patch the event references. Last, it applies that
patch with ``git apply`` to a fresh clone, as a control plane would.

    .venv/bin/python examples/git_change.py              # or: make demo-git
    .venv/bin/python examples/git_change.py --dir DIR    # keep repository, job, events, patch

``file://`` is not an allowed transport by default (``ACPW_GIT_ALLOWED_SCHEMES`` is
https, git); the example allows it for its own run only. It exits with the job's
exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "examples" / "git-change.json"
SECRETS = REPO / "examples" / "secrets"

#: The repository the job clones: path -> (content, mode).
ORIGIN_FILES: dict[str, tuple[str, int]] = {
    "README.md": ("# greeter\n\nSays hello.\n", 0o644),
    "src/greet.py": ('def greet(name):\n    return "Hello, " + name\n', 0o644),
    "scripts/check.sh": ("#!/bin/sh\nexec python3 -m py_compile src/greet.py\n", 0o644),
    "docs/TODO.txt": ("- type hints\n- a test\n", 0o644),
}
# A closed environment for the example's own git commands (no user or system config),
# with fixed identities and dates so the commit id is the same on every run.
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Example",
    "GIT_AUTHOR_EMAIL": "example@example.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "Example",
    "GIT_COMMITTER_EMAIL": "example@example.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "LANG": "C.UTF-8",
}
COLUMNS = "  {status:<13} {kind:<5} {mode:<10} {size:<8} {sha:<26} {path}"


def git(repo: Path, *args: str) -> str:
    """Run the host's git in ``repo`` (a repository this example made, so trusted)."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=GIT_ENV
    )
    return done.stdout


def make_origin(root: Path) -> tuple[Path, str]:
    """A one-commit repository with ``ORIGIN_FILES`` on ``main``; returns it and the commit."""
    origin = root / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    for rel, (content, mode) in ORIGIN_FILES.items():
        path = origin / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(mode)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "greeter 0.1")
    return origin, git(origin, "rev-parse", "HEAD").strip()


def write_job(root: Path, origin: Path) -> Path:
    """The template with ``workspace.url`` pointing at ``origin``."""
    job = json.loads(TEMPLATE.read_text())
    job["workspace"]["url"] = origin.as_uri()
    path = root / "git-change.json"
    path.write_text(json.dumps(job, indent=2) + "\n")
    return path


def worker_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ACPW_GIT_ALLOWED_SCHEMES"] = '["file"]'  # loopback-only example; never in production
    env.setdefault("ACPW_SECRETS_DIR", str(SECRETS))
    env.setdefault("ACPW_RESULTS_DIR", str(root / "results"))
    return env


def acp_worker() -> str:
    beside = Path(sys.executable).with_name("acp-worker")
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "acp-worker")


def run_job(job: Path, root: Path) -> tuple[int, list[dict[str, Any]]]:
    """``acp-worker run JOB --json``: progress goes to our stderr, events are returned."""
    done = subprocess.run(
        [acp_worker(), "run", str(job), "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env=worker_env(root),
        check=False,
    )
    (root / "events.jsonl").write_text(done.stdout)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, events


def _pair(old: object, new: object) -> str:
    """``new``, ``old→new`` when it changed, ``old→`` when the path is gone."""
    if old is None or old == new:
        return "" if new is None else str(new)
    return f"{old}→" if new is None else f"{old}→{new}"


def _short(sha: object) -> str | None:
    return sha[:12] if isinstance(sha, str) else None


def change_row(item: Mapping[str, Any]) -> str:
    """One ``workspace.changed`` entry as a table row."""
    path = item["path"]
    if item.get("target") is not None:
        path += f" -> {item['target']}"
    if item.get("in_patch") is False:
        reason = item.get("omitted_reason")
        path += f"  (not in the patch: {reason})" if reason else "  (not in the patch)"
    return COLUMNS.format(
        status=item["status"],
        kind=item["kind"],
        mode=_pair(item.get("old_mode"), item.get("mode")),
        size=_pair(item.get("old_size"), item.get("size")),
        sha=_pair(_short(item.get("old_sha256")), _short(item.get("sha256"))),
        path=path,
    ).rstrip()


def describe_changes(data: Mapping[str, Any]) -> Iterator[str]:
    counts = ", ".join(f"{status} {n}" for status, n in data["counts"].items())
    yield f"workspace.changed: {data['total']} changes ({counts})"
    yield COLUMNS.format(
        status="STATUS", kind="KIND", mode="MODE", size="SIZE", sha="SHA256", path="PATH"
    )
    yield from (change_row(item) for item in data["paths"])
    if data["truncated"]:
        more = data["total"] - len(data["paths"])
        yield f"  … and {more} more (the list is bounded; the counts are exact)"


def describe_patch(ref: Mapping[str, Any] | None) -> Iterator[str]:
    if ref is None:
        yield "patch: none (nothing changed)"
        return
    omitted = ", ".join(ref["omitted"]) or "none"
    yield f"patch: {ref['path']}"
    yield f"  {ref['bytes']} bytes, sha256 {ref['sha256']}"
    yield f"  omitted (listed above, not inlined): {omitted}"


def show_patch(ref: Mapping[str, Any]) -> bytes:
    """Print the patch file verbatim (it is binary-safe: bytes, not text) and return it."""
    patch = Path(ref["path"]).read_bytes()
    sys.stdout.write("----- changes.patch\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(patch)
    sys.stdout.write("----- end of changes.patch\n")
    return patch


def apply_to_clone(origin: Path, ref: str, patch: Path, root: Path) -> Iterator[str]:
    """What a control plane does with the patch: ``git apply`` on the same commit."""
    check = root / "applied"
    git(root, "clone", "-q", "--branch", ref, origin.as_uri(), str(check))
    git(check, "apply", str(patch))
    git(check, "add", "-A")
    yield f"git apply on a fresh clone of {ref} (git status --short):"
    yield from (f"  {line}" for line in git(check, "status", "--short").splitlines())


def report(events: list[dict[str, Any]], origin: Path, ref: str, root: Path) -> None:
    changed = next((e["data"] for e in events if e["type"] == "workspace.changed"), None)
    if changed is None:
        print("no workspace.changed event: the job ended before its sandbox ran")
        return
    print("\n".join(describe_changes(changed)), end="\n\n")
    print("\n".join(describe_patch(changed["patch"])))
    if changed["patch"] is not None:
        show_patch(changed["patch"])
        print()
        print("\n".join(apply_to_clone(origin, ref, Path(changed["patch"]["path"]), root)))


def completion(events: list[dict[str, Any]]) -> str:
    done = next((e["data"] for e in events if e["type"] == "job.completed"), None)
    if done is None:
        return "job: no job.completed event (see the error above)"
    error = done["error"]
    result = json.dumps(done["result"])
    line = f"job.completed: {done['status']} ({done['stop_reason']}), result bundle: {result}"
    return line if error is None else f"{line}; error {error['code']}: {error['message']}"


def demo(root: Path) -> int:
    origin, commit = make_origin(root)
    job = write_job(root, origin)
    workspace = json.loads(job.read_text())["workspace"]
    print(f"origin: {origin.as_uri()} ({workspace['ref']} at {commit[:12]})")
    print(f"job: {job}")
    sys.stdout.flush()
    code, events = run_job(job, root)
    print(f"\n{completion(events)}\n")
    report(events, origin, workspace["ref"], root)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--dir", type=Path, default=None, help="work here and keep it (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        if any(args.dir.iterdir()):
            parser.error(f"--dir {args.dir}: not empty")
        return demo(args.dir.resolve())
    with tempfile.TemporaryDirectory(prefix="acpw-git-change-") as root:
        return demo(Path(root))


if __name__ == "__main__":
    sys.exit(main())
