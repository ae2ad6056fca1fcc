"""Workspace config admission and the sandbox mask plan.

``--disable-project-configs`` does not stop project MCP servers, Cursor/Claude hooks or
plugins. :func:`check_workspace` refuses a workspace that carries them, from the
workspace up to its nearest Git root and at the provider's system locations, listing
every :class:`Finding`. Admission cannot stop a file appearing mid-run, so
:func:`mask_plan` tells the sandbox which paths to mount empty and read-only.

    result = check_workspace(Path("/srv/ws"), provider="cursor")
    result.raise_if_refused()  # AdmissionRefused with details["findings"] = [...]
"""

from __future__ import annotations

from worker.admission.check import DEFAULT_SYSTEM_ROOTS, check_view, check_workspace
from worker.admission.mask import MASKED_PATHS, MaskEntry, MaskKind, mask_plan
from worker.admission.result import AdmissionResult, Finding, Note
from worker.admission.rules import MAX_SETTINGS_BYTES, PROVIDERS, RULES

__all__ = [
    "DEFAULT_SYSTEM_ROOTS",
    "MASKED_PATHS",
    "MAX_SETTINGS_BYTES",
    "PROVIDERS",
    "RULES",
    "AdmissionResult",
    "Finding",
    "MaskEntry",
    "MaskKind",
    "Note",
    "check_view",
    "check_workspace",
    "mask_plan",
]
