"""The admission check: refuse a workspace that carries project execution config.

``--disable-project-configs`` only suppresses ``.cursor/cli.json``; project MCP servers,
Cursor and Claude hooks and plugins still load. This module looks for them from the
workspace up to its nearest Git root and at the provider's system locations, and
reports every finding. It reads nothing but the bounded Claude settings files and never
follows a symbolic link below the (resolved) workspace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path, PurePosixPath

from worker.admission import probe, rules
from worker.admission.probe import Kind
from worker.admission.result import AdmissionResult, Finding, Note
from worker.admission.rules import ConfigPath, Expect
from worker.admission.settings_json import declared, parse_settings
from worker.admission.walk import (
    discover_git_root,
    judge_git_marker,
    levels,
    physical_workspace,
    unreadable_marker,
)
from worker.errors import InvalidInput, WorkspaceUnavailable

DEFAULT_SYSTEM_ROOTS: tuple[Path, ...] = (Path("/"),)

_TOP = PurePosixPath(".")


def check_workspace(
    workspace: Path,
    *,
    provider: str = "cursor",
    system_roots: Sequence[Path] = DEFAULT_SYSTEM_ROOTS,
) -> AdmissionResult:
    """Every reason ``workspace`` must not run ``provider``'s agent.

    Raises :class:`~worker.errors.WorkspaceUnavailable` if the workspace is missing or not
    a directory and :class:`~worker.errors.InvalidInput` for an unknown provider; a
    refusal is a result (see :meth:`AdmissionResult.raise_if_refused`), not an error.
    """
    system = _system_config(provider)
    root = physical_workspace(workspace)
    git_root, notes = discover_git_root(root)
    findings = [
        finding
        for depth, level in enumerate(levels(root, git_root))
        for finding in _check_level(level, "../" * depth)
    ]
    findings += [f for sysroot in system_roots for f in _check_system(sysroot, system)]
    return AdmissionResult(root, git_root, tuple(findings), notes)


def check_view(
    root: Path, *, workspace: str = "/workspace", provider: str = "cursor"
) -> AdmissionResult:
    """:func:`check_workspace` in another mount view: a root directory (a container's
    root, reached as ``/proc/PID/root``) and the workspace's absolute path inside it.

    Nothing is resolved against the host: the workspace, its parents up to the view's
    root (the walk to the Git root stops there) and the system locations are reached
    from a descriptor of ``root``, links resolved inside it. Findings read as they would
    inside: ``../…`` above the workspace, system paths absolute in the view.

    Raises :class:`~worker.errors.WorkspaceUnavailable` when ``root`` or the workspace
    cannot be opened, :class:`~worker.errors.InvalidInput` for an unknown provider.
    """
    system = _system_config(provider)
    chain = _view_chain(PurePosixPath(workspace))
    try:
        root_fd = probe.open_dir(root)
    except OSError as exc:
        raise WorkspaceUnavailable(f"mount view {root} cannot be opened", root=str(root)) from exc
    try:
        _view_workspace(root_fd, chain[0], workspace)
        git_root, notes = _view_git_root(root_fd, chain)
        depth = 1 if git_root is None else chain.index(git_root) + 1
        findings = [
            finding
            for up, level in enumerate(chain[:depth])
            for finding in _within(
                ("../" * up).rstrip("/") or ".",
                partial(probe.open_dir_in_root, root_fd, level),
                partial(_level, prefix="../" * up),
            )
        ]
        findings += [f for spec in system for f in _check_view_system(root_fd, spec)]
    finally:
        os.close(root_fd)
    in_view = None if git_root is None else Path("/", git_root)
    return AdmissionResult(Path(workspace), in_view, tuple(findings), notes)


def _view_chain(workspace: PurePosixPath) -> tuple[str, ...]:
    """The workspace and each parent up to the view's root, root-relative."""
    if not workspace.is_absolute():
        raise InvalidInput(f"workspace {workspace} must be absolute in its view")
    rel = workspace.relative_to("/")
    return tuple(str(p) for p in (rel, *rel.parents))


def _view_workspace(root_fd: int, rel: str, display: str) -> None:
    try:
        os.close(probe.open_dir_in_root(root_fd, rel))
    except OSError as exc:
        raise WorkspaceUnavailable(
            f"workspace {display} is not a directory in the mount view", workspace=display
        ) from exc


def _view_git_root(root_fd: int, chain: Sequence[str]) -> tuple[str | None, tuple[Note, ...]]:
    """:func:`~worker.admission.walk.discover_git_root` inside the view: a gitfile's
    target and a ``.git`` link are resolved in the view's root."""
    notes: list[Note] = []
    for depth, level in enumerate(chain):
        display = "../" * depth + ".git"
        try:
            fd = probe.open_dir_in_root(root_fd, level)
        except OSError as exc:
            notes.append(unreadable_marker(display, exc))
            continue
        try:
            is_root, note = judge_git_marker(fd, display, partial(_is_dir_in_root, root_fd, level))
        finally:
            os.close(fd)
        notes += [note] if note is not None else []
        if is_root:
            return level, tuple(notes)
    return None, tuple(notes)


def _is_dir_in_root(root_fd: int, level: str, target: str) -> bool:
    try:
        os.close(
            probe.open_dir_in_root(
                root_fd, target if target.startswith("/") else f"{level}/{target}"
            )
        )
    except OSError:
        return False
    return True


def _check_view_system(root_fd: int, spec: ConfigPath) -> list[Finding]:
    return _within(
        f"/{spec.path.parent}",
        partial(probe.open_dir_in_root, root_fd, str(spec.path.parent)),
        partial(_check_entry, display=f"/{spec.path}", spec=spec),
        absent_ok=True,
    )


def _system_config(provider: str) -> tuple[ConfigPath, ...]:
    try:
        return rules.SYSTEM_CONFIG[provider]
    except KeyError:
        raise InvalidInput(
            f"unknown provider {provider!r} for admission", providers=list(rules.PROVIDERS)
        ) from None


def _check_level(level: Path, prefix: str) -> list[Finding]:
    display = prefix.rstrip("/") or "."
    return _within(display, partial(probe.open_dir, level), partial(_level, prefix=prefix))


def _level(level_fd: int, prefix: str) -> list[Finding]:
    top = [spec for spec in rules.PROJECT_CONFIG if spec.path.parent == _TOP]
    findings = _check_entries(level_fd, prefix, top)
    for name in rules.CONFIG_DIRS:
        findings += _check_config_dir(level_fd, name, prefix)
    return findings


def _check_config_dir(level_fd: int, name: str, prefix: str) -> list[Finding]:
    display = prefix + name
    try:
        kind = probe.classify(level_fd, name)
    except OSError as exc:
        return [_error(display, exc)]
    if kind is Kind.MISSING:
        return []
    if kind is not Kind.DIR:
        return [_wrong_kind(display, kind, Expect.DIR)]
    members = [spec for spec in rules.PROJECT_CONFIG if spec.path.parent.name == name]
    return _within(
        display,
        partial(probe.open_dir, name, dir_fd=level_fd),
        partial(_check_entries, prefix=prefix, specs=members),
    )


def _check_entries(dir_fd: int, prefix: str, specs: Sequence[ConfigPath]) -> list[Finding]:
    return [f for spec in specs for f in _check_entry(dir_fd, prefix + str(spec.path), spec)]


def _check_entry(dir_fd: int, display: str, spec: ConfigPath) -> list[Finding]:
    name = spec.path.name
    try:
        kind = probe.classify(dir_fd, name)
    except OSError as exc:
        return [_error(display, exc)]
    if kind is Kind.MISSING:
        return []
    if kind is Kind.SYMLINK or (spec.expect is Expect.FILE and kind is not Kind.FILE):
        return [_wrong_kind(display, kind, spec.expect)]
    if spec.keys is None:
        return [Finding(display, spec.rule, spec.reason)]
    return _check_settings(dir_fd, name, display, spec.keys)


def _check_settings(dir_fd: int, name: str, display: str, keys: Mapping[str, str]) -> list[Finding]:
    try:
        settings = parse_settings(probe.read_bounded(dir_fd, name, rules.MAX_SETTINGS_BYTES))
    except OSError as exc:
        return [_error(display, exc)]
    except ValueError as exc:  # includes UnicodeDecodeError and json.JSONDecodeError
        reason = f"Not one valid JSON object ({exc}), so hooks and plugins cannot be ruled out."
        return [Finding(display, rules.CONFIG_INVALID_JSON, reason)]
    return [
        Finding(display, rule, rules.key_reason(rule, key))
        for key, rule in declared(settings, keys)
    ]


def _check_system(root: Path, specs: Sequence[ConfigPath]) -> list[Finding]:
    return [f for spec in specs for f in _check_system_entry(root / spec.path, spec)]


def _check_system_entry(path: Path, spec: ConfigPath) -> list[Finding]:
    # The system prefix (e.g. /etc) is the host's own; symlinks in it are followed, the
    # config entry itself never is. No parent directory means no config.
    return _within(
        str(path.parent),
        partial(probe.open_dir, path.parent),
        partial(_check_entry, display=str(path), spec=spec),
        absent_ok=True,
    )


def _within(
    display: str,
    open_fd: Callable[[], int],
    body: Callable[[int], list[Finding]],
    *,
    absent_ok: bool = False,
) -> list[Finding]:
    """Run ``body`` on an opened directory, or turn the failure to open it into a finding."""
    try:
        fd = open_fd()
    except OSError as exc:
        if absent_ok and isinstance(exc, FileNotFoundError | probe.NotRegular):
            return []
        return [_error(display, exc)]
    try:
        return body(fd)
    finally:
        os.close(fd)


def _wrong_kind(display: str, kind: Kind, expect: Expect) -> Finding:
    if kind is Kind.SYMLINK:
        return _symlink(display)
    wanted = "a regular file" if expect is Expect.FILE else "a directory"
    found = probe.kind_words(kind)
    reason = f"Expected {wanted} but found {found}; refused rather than guessed at."
    return Finding(display, rules.CONFIG_NOT_REGULAR, reason)


def _symlink(display: str) -> Finding:
    reason = "Is a symbolic link; config is never followed, so what it points at is unknown."
    return Finding(display, rules.CONFIG_SYMLINK, reason)


def _error(display: str, exc: OSError) -> Finding:
    if isinstance(exc, probe.SymlinkRace):
        return _symlink(display)
    if isinstance(exc, probe.NotRegular):
        return _wrong_kind(display, Kind.OTHER, Expect.FILE)
    if isinstance(exc, probe.TooLarge):
        reason = f"Larger than {rules.MAX_SETTINGS_BYTES} bytes ({exc.strerror}); refused unread."
        return Finding(display, rules.CONFIG_TOO_LARGE, reason)
    reason = f"Cannot be examined ({exc.strerror or exc}), so it cannot be ruled out."
    return Finding(display, rules.CONFIG_UNREADABLE, reason)
