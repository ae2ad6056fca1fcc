"""The runner's seam to packs: resolve a declaration, check its runtime, prepare a
verified closure.

``load_declaration`` refuses a pack that is unlocked (``pack_unlocked``) or whose launch
breaks its dialect's contract (``launch_refused``, ``worker.packs.contract``); the
launch plan is checked against that contract again, as it will run.
``check_runtime`` refuses a pack whose ``launch.runtime`` this host cannot provide (the
host's Node.js for the npm packs; see ``worker.packs.requirements``), before anything is
prepared. ``prepare_pack`` runs before every launch (in a thread: it is blocking I/O). It
materializes the closure when the cache lacks it and always re-verifies it, so the agent
starts only from bytes that match the pins at that moment: by re-hashing every file, or,
for a launch whose closure is exactly as its last full verification left it (every
file's identity, ctime included), by that verification's record
(``worker.packs.verified``), without reading the lock: the record names the closure
digest it verified, which the pin must equal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.events.models import PackReady
from worker.launch import LaunchPlan, expand, launch_plan
from worker.packs.cache import closure_path, materialize, verified_dir
from worker.packs.contract import check_declared, check_launch
from worker.packs.manifest import Pack, PlatformTarget, load_pack
from worker.packs.requirements import check_runtime
from worker.packs.sources import touch
from worker.packs.verified import Recheck
from worker.packs.verify import VerifyStats, unchanged, verify_closure
from worker.settings import Settings

__all__ = [
    "LaunchPlan",
    "PreparedPack",
    "check_contract",
    "check_runtime",
    "load_declaration",
    "prepare_pack",
]


@dataclass(frozen=True, slots=True)
class PreparedPack:
    """A pack whose closure was verified for this launch."""

    pack: Pack
    target: PlatformTarget
    closure: Path
    stats: VerifyStats

    def launch_plan(
        self, credentials: Mapping[str, str], *, endpoint_url: str | None = None
    ) -> LaunchPlan:
        """The fixed argv and closed environment, with the bound *credentials* and, when
        the job has a model endpoint, the pack's ``launch.endpoint`` variables for it."""
        launch = self.pack.manifest.launch
        endpoint_env = None if launch.endpoint is None else launch.endpoint.env
        plan = launch_plan(
            argv=launch.argv, env=launch.env, dialect=self.pack.manifest.dialect,
            credentials=credentials, authenticate=launch.authenticate,
            client_fs=launch.client_fs is not False,
            endpoint_env=endpoint_env, endpoint_url=endpoint_url, default_mode=launch.mode,
            exits_on_eof=launch.exits_on_eof is not False,
        )  # fmt: skip
        check_contract(self.pack, plan)
        return plan

    def event_data(self) -> PackReady:
        """The ``pack.ready`` event: what was verified, and how long it took."""
        return PackReady(
            name=self.pack.name,
            version=self.pack.manifest.version,
            provider=self.pack.manifest.provider,
            platform=self.target.platform,
            closure_digest=self.target.pin.closure.digest,
            files=self.stats.files,
            bytes=self.stats.bytes,
            verify_ms=round(self.stats.seconds * 1000, 1),
        )


def load_declaration(settings: Settings, name: str) -> Pack:
    """The pack *name* in ``settings.packs_dir``; ``.credentials`` lists what it accepts.

    Raises PackNotFound or InvalidInput; PackUnlocked (no pins yet) or LaunchRefused (its
    launch breaks its dialect's contract).
    """
    pack = load_pack(settings.packs_dir, name)
    pack.refuse_unlocked()
    check_declared(pack.manifest)
    return pack


def check_contract(pack: Pack, plan: LaunchPlan) -> None:
    """Refuse *plan* if it breaks the launch contract of *pack*'s dialect.

    Raises:
        LaunchRefused: naming the offending flag or variable.
    """
    check_launch(
        plan.dialect, plan.argv, plan.env, home=expand("{home}"), pack=pack.name,
        fixed_env=pack.manifest.launch.env,
    )  # fmt: skip


def prepare_pack(
    settings: Settings,
    pack: Pack,
    platform: str | None = None,
    *,
    sandbox_uids: Collection[int] | None = None,
) -> PreparedPack:
    """Materialize (if needed) and verify *pack*'s closure for *platform*.

    With *sandbox_uids* (a launch: the host uids its sandbox runs as), an unchanged
    closure is checked against its verified record instead of re-hashed
    (``worker.packs.verified``); without, every file is re-hashed.

    Raises InvalidInput, PlatformUnsupported, DigestMismatch or ArchiveRefused.
    """
    target = pack.for_platform(platform)
    recheck = None
    if sandbox_uids is not None:
        records = verified_dir(settings.cache_dir)
        recheck = Recheck(records, settings.pack_rehash_s, frozenset(sandbox_uids))
        pin = target.pin.closure
        closure = closure_path(settings.cache_dir, pin.digest)
        stats = unchanged(closure, pin.digest, pin.files, pin.bytes, recheck)
        if stats is not None:  # as its last full verification left it: no lock needed
            touch(closure)  # least-recent-use order, as ``materialize`` keeps it
            return PreparedPack(pack, target, closure, stats)
    lock = pack.read_lock(target)  # once: parsing a large lock costs tens of ms
    closure = materialize(
        pack, settings.cache_dir, platform=platform, verify_existing=False, lock=lock
    )
    stats = verify_closure(closure, lock, recheck=recheck)
    return PreparedPack(pack, target, closure, stats)
