"""What a remote backend's ``WorkspaceFiles`` share: ``artifact`` answered from lookups.

A backend that reaches the workspace through an API (a pod's exec, Daytona's file API)
cannot answer the normalizer's synchronous ``artifact`` without waiting on the network.
:class:`LookedUp` answers it from verdicts looked up ahead: the job awaits
:meth:`LookedUp.look_up` for the paths each notification names
(``worker.events.artifacts.named_paths``) and for a prompt's links; a path not looked up
(or looked up more than ``ttl_s`` ago) is refused ``workspace_not_reachable`` and looked
up in the background (at most ``max_lookups`` at once); what the worker itself read or
wrote is remembered at once (:meth:`LookedUp.remember`). A subclass says how a batch of
workspace-relative paths is looked up (``_look_up``) and serves ``fs/*`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from worker.admission import MaskEntry
from worker.events.artifacts import Verdict
from worker.sandbox.base import WORKSPACE
from worker.sandbox.files import PathRefused, relative


@dataclass(frozen=True, slots=True)
class _Known:
    verdict: Verdict
    at: float


class LookedUp:
    """The verdict cache and the background lookups behind a remote ``artifact``."""

    def __init__(
        self,
        *,
        masks: Sequence[MaskEntry] = (),
        ttl_s: float = 30.0,
        max_known: int = 1024,
        max_lookups: int = 8,
    ) -> None:
        self._masks = tuple(masks)
        self._ttl = ttl_s
        self._max_known = max_known
        self._max_lookups = max_lookups
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._lookups: dict[str, asyncio.Task[None]] = {}

    async def _look_up(self, rels: list[str]) -> None:
        """Look up ``rels`` (distinct, admitted by :meth:`relative`) and :meth:`remember`
        a verdict for each; never raises for one path's failure."""
        raise NotImplementedError

    def artifact(self, path: str) -> Verdict:
        """The verdict for a file the agent references (see the module: a path not
        looked up recently is refused ``workspace_not_reachable`` and looked up)."""
        try:
            rel = self.relative(path)
            loop = asyncio.get_running_loop()
        except PathRefused as refused:
            return Verdict(reason=refused.reason)
        except RuntimeError:
            return Verdict(reason="workspace_not_reachable")
        known = self._known.get(rel)
        if known is not None and loop.time() - known.at <= self._ttl:
            return known.verdict
        if rel not in self._lookups and len(self._lookups) < self._max_lookups:
            task = loop.create_task(self._look_up([rel]))
            self._lookups[rel] = task
            task.add_done_callback(lambda _t: self._lookups.pop(rel, None))
        return Verdict(reason="workspace_not_reachable")

    async def look_up(self, paths: Sequence[str]) -> None:
        """Look ``paths`` up now, so that :meth:`artifact` answers for them."""
        rels: list[str] = []
        for path in paths:
            with contextlib.suppress(PathRefused):  # artifact() refuses it without a lookup
                rels.append(self.relative(path))
        if rels:
            await self._look_up(list(dict.fromkeys(rels)))

    async def lookups_done(self) -> None:
        """Wait for the background lookups started so far (tests)."""
        for task in list(self._lookups.values()):
            with contextlib.suppress(Exception):
                await task

    async def aclose(self) -> None:
        """Cancel the lookups still running (the sandbox goes next)."""
        tasks = list(self._lookups.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def remember(self, rel: str, verdict: Verdict) -> None:
        self._known[rel] = _Known(verdict, asyncio.get_running_loop().time())
        self._known.move_to_end(rel)
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def relative(self, path: str) -> str:
        """``worker.sandbox.files.relative`` with the masks; the workspace itself is no
        file (``not_regular_file``).

        Raises:
            PathRefused: as ``relative``.
        """
        rel = relative(path, agent_root=WORKSPACE, masks=self._masks)
        if rel == ".":
            raise PathRefused("not_regular_file")
        return rel


__all__ = ["LookedUp"]
