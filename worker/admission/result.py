"""The admission verdict: every finding, never just the first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker.errors import AdmissionRefused


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason to refuse a workspace.

    ``path`` is relative to the workspace (``../.cursor/hooks.json`` above it) or absolute
    for system locations; ``rule`` is a stable id from :mod:`worker.admission.rules`.
    """

    path: str
    rule: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "rule": self.rule, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Note:
    """Something the admission could not judge; it does not refuse the workspace.

    ``path`` reads as a :class:`Finding`'s; ``code`` is a stable id
    (:data:`worker.admission.walk.NOTE_CODES`).
    """

    path: str
    code: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "code": self.code, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """What :func:`worker.admission.check_workspace` saw."""

    workspace: Path
    git_root: Path | None
    findings: tuple[Finding, ...]
    notes: tuple[Note, ...] = ()

    @property
    def admitted(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, object]:
        return {
            "admitted": self.admitted,
            "workspace": str(self.workspace),
            "git_root": None if self.git_root is None else str(self.git_root),
            "findings": [f.to_dict() for f in self.findings],
            "notes": [n.to_dict() for n in self.notes],
        }

    def raise_if_refused(self) -> None:
        """Raise :class:`~worker.errors.AdmissionRefused` listing every finding, if any."""
        if self.admitted:
            return
        first = self.findings[0]
        raise AdmissionRefused(
            f"workspace {self.workspace} holds project execution config: {first.rule} "
            f"{first.path} and {len(self.findings) - 1} more finding(s)",
            workspace=str(self.workspace),
            findings=[f.to_dict() for f in self.findings],
            **({"notes": [n.to_dict() for n in self.notes]} if self.notes else {}),
        )
