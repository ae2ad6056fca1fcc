"""Agent sessions kept between jobs, so ``session.resume`` works on fresh sandboxes.

A sandbox's HOME is a private tmpfs that dies with the job, and with it whatever the
agent recorded there. A pack that declares what its agent records of a session
(``launch.sessions``: a directory relative to HOME and the paths in it that belong to one
session, :mod:`worker.sessions.files`; or the older ``launch.session_store``) therefore
gets, per job, a fresh host directory bound read-write at that directory::

    <session_root>/<pack>/<session id>/     the store (ACPW_SESSION_DIR): the session's
                                            paths, relative to the declared directory
    <job dir>/agent-state/                  the per-job directory: removed after the job,
                                            or by the reaper with the job's work dir

A resume job starts with exactly its one recorded session copied in (never the others),
or is refused before anything launches when the store does not hold it (or the pack
keeps no sessions). After the job, once the sandbox is gone, the session the job used is
saved back, if the agent recorded it: only the paths its pack declares for that session
id. What the agent left is untrusted (:func:`worker.safetree.copy_tree`): directories
and single-link regular files only, links never followed, bounded in bytes, entries and
depth; a
save over a bound keeps the previous recording and says why in a ``notice``. A save
replaces the recording atomically: it is copied next to it, then exchanged with it
(``renameat2(RENAME_EXCHANGE)``), so a reader finds the old or the new one, never a mix.
A recording neither saved nor resumed for ``ACPW_SESSION_KEEP_S`` is removed by the
reaper (:func:`reap_sessions`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from worker.errors import SandboxError, SessionNotFound
from worker.events import notices
from worker.events.models import Notice
from worker.jobs.spec import SESSION_ID as SESSION_ID_PATTERN
from worker.packs.manifest import SESSION_SLOT, SessionFiles
from worker.packs.names import check_pack_name
from worker.safetree import Bounds, CopyReport, Kind, OverBound, copy_tree, remove_tree
from worker.sandbox.base import HOME, WritableMount
from worker.sessions.files import Selection
from worker.settings import Settings
from worker.workspace.stage import remove_staged

log = logging.getLogger(__name__)

#: What a job spec accepts as a session id; an id the agent chose is held to it too.
SESSION_ID = re.compile(SESSION_ID_PATTERN)
STATE_DIR = "agent-state"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_SKIPPED_LISTED = 50
#: The most directory levels a recorded session may nest (agents record a few).
MAX_DEPTH = 32


def check_session_id(session_id: str) -> str:
    """``session_id`` if it is safe as one directory name.

    Raises:
        ValueError: it is not (a ``/``, a leading dot, a control character, too long).
    """
    if not SESSION_ID.fullmatch(session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return session_id


class SessionStore:
    """``<root>/<pack>/<session id>/``: recorded sessions, written only by ``save``."""

    def __init__(self, root: Path, bounds: Bounds) -> None:
        self.root = root
        self.bounds = bounds

    def path(self, pack: str, session_id: str) -> Path:
        """Where the session is kept (names checked; raises InvalidInput or ValueError)."""
        return self.root / check_pack_name(pack) / check_session_id(session_id)

    def recorded(self, pack: str, session_id: str) -> bool:
        """True when the store holds the session (a real directory, not a link)."""
        return _is_dir(self.path(pack, session_id))

    def restore(
        self,
        pack: str,
        session_id: str,
        dest: Path,
        owner: tuple[int, int] | None,
        selection: Selection | None = None,
    ) -> CopyReport:
        """Copy the recorded session (only what ``selection`` takes, when given:
        ``selection.matched`` 0 then means it held nothing of it) to the new directory
        ``dest``, owned by ``owner``.

        Raises:
            OverBound: the recording exceeds the bounds.
            OSError: it is missing or could not be copied.
        """
        path = self.path(pack, session_id)
        _touch(path)  # in use: the reaper's retention (``reap_sessions``) counts from now
        return copy_tree(path, dest, self.bounds, owner=owner, select=selection)

    def save(
        self, pack: str, session_id: str, source: Path, selection: Selection | None = None
    ) -> CopyReport:
        """Replace the recording of the session with a bounded copy of ``source``, or of
        what ``selection`` takes of it (``selection.matched`` 0: it took nothing, and
        the recording is left as it was).

        Raises:
            OverBound: the copy exceeds the bounds (the old recording stays).
            OSError: ``source`` is not a directory or the copy failed (the old stays).
        """
        target = self.path(pack, session_id)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _sweep(target.parent, session_id)
        tmp = target.with_name(f".{session_id}.{secrets.token_hex(4)}.tmp")
        kept = True
        try:
            report = copy_tree(source, tmp, self.bounds, select=selection)
            kept = selection is None or selection.matched > 0
            if kept:
                _replace_dir(tmp, target)
        finally:
            remove_tree(tmp)
        if kept:
            _touch(target)  # whatever times the agent gave its files, it was saved now
        return report


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # retention only: never fails a save or a resume
        os.utime(path, follow_symlinks=False)


def reap_sessions(root: Path, *, keep_s: float, now: float | None = None) -> list[str]:
    """Remove the recorded sessions of ``root`` (``<pack>/<session id>/``) neither saved
    nor resumed for ``keep_s`` seconds (a save or a resume sets the directory's mtime);
    ``keep_s`` 0: none. Returns the ``pack/session id`` names removed.

    Each is first renamed aside (atomic, so one of several reapers sharing the store
    wins, and a resume finds the whole recording or none), then deleted; links are never
    followed. What cannot be removed is logged and tried again by the next pass.
    """
    if keep_s <= 0 or not _is_dir(root):
        return []
    cutoff = (time.time() if now is None else now) - keep_s
    removed = []
    for pack_dir in sorted(root.iterdir()):
        if not _is_dir(pack_dir):
            continue
        for session in sorted(pack_dir.iterdir()):
            if SESSION_ID.fullmatch(session.name) and _idle_since(session, cutoff):
                aside = session.with_name(f".{session.name}.{secrets.token_hex(4)}.tmp-reaped")
                try:
                    os.rename(session, aside)
                    remove_tree(aside)
                except OSError as exc:
                    log.warning("could not remove the session %s: %s", session, exc)
                    continue
                removed.append(f"{pack_dir.name}/{session.name}")
    return removed


def _idle_since(session: Path, cutoff: float) -> bool:
    try:
        st = session.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_mtime < cutoff


#: A save's temporary copy older than this is the leftover of a worker that died mid-save.
STALE_TMP_S = 3600.0


def _sweep(folder: Path, session_id: str, *, now: float | None = None) -> None:
    """Remove what saves of ``session_id`` that died half-way left next to it (never a
    recent one: another worker may be saving the same session right now)."""
    cutoff = (time.time() if now is None else now) - STALE_TMP_S
    for leftover in folder.glob(f".{session_id}.*.tmp*"):
        with contextlib.suppress(OSError):
            if leftover.lstat().st_mtime < cutoff:
                remove_tree(leftover)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink()
    except OSError:
        return False


def _replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an existing ``target`` ends up at ``new``'s name."""
    try:
        os.rename(new, target)  # no recording yet (or an empty directory)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    else:
        return
    try:
        _exchange(new, target)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        # A filesystem without RENAME_EXCHANGE: aside, then in (a brief gap for readers).
        old = new.with_name(new.name + ".old")
        os.rename(target, old)
        os.rename(new, target)
        os.rename(old, new)


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


@dataclass(slots=True)
class JobSessions:
    """One job's side of the store: check, per-job directory, save, remove."""

    store: SessionStore
    pack: str
    #: The pack's ``launch.sessions`` (or its ``session_store``, in that form).
    files: SessionFiles
    resume: str | None
    host_dir: Path | None = None

    @classmethod
    def for_job(
        cls, settings: Settings, *, pack: str, files: SessionFiles | None, resume: str | None
    ) -> JobSessions | None:
        """The job's sessions, or None when the pack keeps none.

        Raises:
            SessionNotFound: the job resumes a session, and the pack keeps none (no
                session of it can be in the store).
        """
        root = settings.session_root
        if files is None:
            if resume is not None:
                raise SessionNotFound(
                    f"session {resume!r} cannot be resumed: pack {pack!r} keeps no sessions "
                    "between jobs (its manifest declares no launch.sessions)",
                    session_id=resume,
                    store=str(root / pack),
                    reason="not_kept",
                )
            return None
        bounds = Bounds(
            max_bytes=settings.session_max_bytes,
            max_entries=settings.session_max_files,
            max_depth=MAX_DEPTH,
        )
        return cls(SessionStore(root, bounds), pack, files, resume)

    @property
    def per_session_dir(self) -> bool:
        """The declaration is one directory per session (``keep`` just ``{session}``:
        the Cursor layout, and what ``session_store`` says): that directory itself is
        the recording, so it is restored and saved whole."""
        return self.files.keep == [SESSION_SLOT]

    @property
    def target(self) -> str:
        """Where the per-job directory appears inside the sandbox."""
        return f"{HOME}/{self.files.dir}"

    def selection(self, session_id: str) -> Selection:
        """What belongs to ``session_id`` in the per-job directory (and its recording)."""
        return Selection(self.files.keep, session_id)

    def check(self) -> None:
        """Refuse a resume the store cannot serve, before anything launches.

        Raises:
            SessionNotFound: the store does not hold the session.
        """
        if self.resume is not None and not self.store.recorded(self.pack, self.resume):
            raise self._not_found("is not recorded", "not_recorded")

    def _not_found(self, why: str, reason: str, **details: object) -> SessionNotFound:
        where = self.store.root / self.pack
        return SessionNotFound(
            f"session {self.resume!r} {why} in the session store {where} of this worker "
            "(ACPW_SESSION_DIR; workers that resume each other's sessions must share it)",
            session_id=self.resume,
            store=str(where),
            reason=reason,
            **details,
        )

    def prepare(self, job_dir: Path, owner: tuple[int, int]) -> WritableMount:
        """Make ``<job_dir>/agent-state`` for ``owner``, with the resumed session in it.

        Raises:
            SessionNotFound: the session could not be restored (gone, unreadable, or over
                the bounds).
            SandboxError: the directory could not be made.
        """
        host = job_dir / STATE_DIR
        if self.resume is not None and not self.per_session_dir:
            self.host_dir = host  # made by the restore, with exactly the session's paths
            self._restore(host, owner, self.selection(self.resume))
            return WritableMount(host, self.target)
        try:
            host.mkdir(mode=0o700)
            self.host_dir = host
            os.chown(host, *owner)
        except OSError as exc:
            raise SandboxError(
                f"the agent state directory could not be made: {exc.strerror or exc}",
                path=str(host),
            ) from exc
        if self.resume is not None:  # one directory per session: restored as it was
            self._restore(host / self.resume, owner, None)
        return WritableMount(host, self.target)

    def _restore(self, dest: Path, owner: tuple[int, int], selection: Selection | None) -> None:
        assert self.resume is not None
        try:
            self.store.restore(self.pack, self.resume, dest, owner, selection)
        except OverBound as exc:
            raise self._not_found("is over the bounds", "too_large", limit=str(exc)) from exc
        except OSError as exc:
            raise self._not_found("could not be restored", "unreadable") from exc
        if selection is not None and not selection.matched:  # another declaration's
            raise self._not_found("holds none of its files", "not_recorded")

    def save(self, session_id: str | None, *, answered: bool = False) -> list[Notice]:
        """Keep what the agent recorded of ``session_id``; the notices to emit.

        ``answered``: the agent answered a prompt of it, so it should have recorded
        something; if it did not, that is said (``not_recorded``), not passed over.

        Call only once nothing in the sandbox runs. Never raises: a session that cannot
        be kept is reported, and the previous recording stays.
        """
        if session_id is None or self.host_dir is None:
            return []
        if not SESSION_ID.fullmatch(session_id):
            return [
                notices.session_not_saved(
                    session_id, reason="invalid_session_id", why="it is not a safe name"
                )
            ]
        if self.per_session_dir:
            source, selection = self.host_dir / session_id, None
            if not os.path.lexists(source):  # the agent recorded nothing
                return self._not_recorded(session_id) if answered else []
        else:
            source, selection = self.host_dir, self.selection(session_id)
        try:
            report = self.store.save(self.pack, session_id, source, selection)
        except (OverBound, OSError) as exc:
            return [_not_saved(session_id, exc)]
        # Nothing kept (selection.matched 0): the agent recorded nothing of it (e.g. no turn
        # was taken), or only what a copy skips.
        if answered and selection is not None and not selection.matched:
            return [*self._not_recorded(session_id), *_skipped(session_id, report)]
        return _skipped(session_id, report)

    def _not_recorded(self, session_id: str) -> list[Notice]:
        why = f"the agent answered a prompt but recorded nothing of it in ~/{self.files.dir}"
        return [notices.session_not_saved(session_id, reason="not_recorded", why=why)]

    def written_since(self, session_id: str, since: float) -> bool:
        """Whether a file of ``session_id`` in the per-job directory was modified at or
        after ``since`` (``time.time()``): the agent wrote to its recording since then.

        Only a directory the worker can see while the agent runs (a mount of it, as on
        local and docker) says anything: otherwise False.
        """
        if self.host_dir is None or not SESSION_ID.fullmatch(session_id):
            return False
        return any(
            stat.S_ISREG(info.st_mode) and info.st_mtime >= since
            for info in self._recorded(self.host_dir, self.selection(session_id))
        )

    def _recorded(self, root: Path, selection: Selection) -> Iterator[os.stat_result]:
        """The ``lstat`` of each directory and regular file of ``selection`` below
        ``root``, the agent's directory: nothing is followed, and the walk stops after
        the store's entry bound."""
        bound = self.store.bounds.max_entries
        budget = float("inf") if bound is None else bound
        pending: list[tuple[Path, str, int]] = [(root, "", 0)]
        while pending:
            folder, rel, depth = pending.pop()
            for entry in _scan(folder):
                budget -= 1
                if budget < 0:
                    return
                info = _lstat(entry)
                kind: Kind | None = None
                if info is not None and stat.S_ISDIR(info.st_mode):
                    kind = "dir"
                elif info is not None and stat.S_ISREG(info.st_mode):
                    kind = "file"
                if info is None or kind is None or not selection(f"{rel}{entry.name}", kind):
                    continue
                yield info
                if kind == "dir" and depth < MAX_DEPTH:
                    pending.append((Path(entry.path), f"{rel}{entry.name}/", depth + 1))

    def remove(self) -> None:
        """Delete the per-job directory (whatever the agent left in it)."""
        if self.host_dir is not None:
            remove_staged(self.host_dir)


def _not_saved(session_id: str, exc: OverBound | OSError) -> Notice:
    if isinstance(exc, OverBound):
        return notices.session_not_saved(session_id, reason="too_large", why=f"it holds {exc}")
    why = exc.strerror or str(exc)
    return notices.session_not_saved(session_id, reason="unreadable", why=why)


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


def _lstat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except OSError:
        return None


def _skipped(session_id: str, report: CopyReport) -> list[Notice]:
    if not report.skipped:
        return []
    listed = [{"path": s.path, "kind": s.kind} for s in report.skipped[:_SKIPPED_LISTED]]
    return [notices.session_entries_skipped(session_id, count=len(report.skipped), entries=listed)]
