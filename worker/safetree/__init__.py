"""Walking, copying, extracting and removing trees that something untrusted shaped.

A bottom layer: it depends only on the standard library and :mod:`worker.errors`.
Staging a workspace, copying a session recording, extracting a pack or workspace
archive, and removing job, session and cache directories all go through it, so each
check (no link followed, bounds, refused kinds and names) is written once.

- :class:`Walk`: iterative, through directory descriptors, following no link, bounded
  in bytes, entries and depth (:class:`Bounds`); a :class:`Policy` says which
  :data:`Kind` of entry it hands over, the rest is reported as :class:`Skipped`.
- :func:`copy_file`, :func:`copy_tree`: ``O_NOFOLLOW`` / ``O_EXCL`` copies.
- :func:`extract_tar`: member by member, refusing links, devices, ``..`` and absolute
  names, overwrites, and archives past their bounds.
- :func:`remove_tree`: any depth, following no link, refusing to empty a mount.
"""

from worker.safetree.bounds import UNBOUNDED, Bounds, OverBound, Tally
from worker.safetree.copy import CopyReport, copy_file, copy_tree
from worker.safetree.extract import Written, extract_tar, member_path
from worker.safetree.kinds import EVERY_KIND, PLAIN, Kind, Policy, kind_of
from worker.safetree.names import MAX_COMPONENT_BYTES, MAX_PATH_BYTES, path_problem
from worker.safetree.remove import remove_tree
from worker.safetree.walk import Done, Found, Skipped, Step, Walk

__all__ = [
    "EVERY_KIND",
    "MAX_COMPONENT_BYTES",
    "MAX_PATH_BYTES",
    "PLAIN",
    "UNBOUNDED",
    "Bounds",
    "CopyReport",
    "Done",
    "Found",
    "Kind",
    "OverBound",
    "Policy",
    "Skipped",
    "Step",
    "Tally",
    "Walk",
    "Written",
    "copy_file",
    "copy_tree",
    "extract_tar",
    "kind_of",
    "member_path",
    "path_problem",
    "remove_tree",
]
