"""A job's launch identity (``worker.job.warm``): what a warm slot is made of, as a
digest, and the recipe a slot of it is made from. Kept apart from the pool, so that a
job run without pools (``acp-worker run``) loads no Redis or metrics module for it."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from worker.acp.client import ClientCapabilities
from worker.acp.session import parameterized_models
from worker.job.slot import Recipe, pooled
from worker.launch import LaunchPlan
from worker.packs.runtime import PreparedPack
from worker.rpc.wire import JsonValue
from worker.sandbox import base
from worker.sandbox.base import SandboxBackend

if TYPE_CHECKING:
    from worker.job.state import Declared, JobContext


def identity(
    recipe: Recipe,
    *,
    key: bytes,
    backend: SandboxBackend,
    backend_config: str,
    credentials: Mapping[str, str],
) -> str:
    """The launch identity: a digest of everything a slot's sandbox and agent are made
    of, ``recipe`` (its own ``identity`` aside) and the backend. Credential values enter
    only through the binding, an HMAC under ``key``; the rest of the environment is
    taken as it is (it holds no secret but those)."""
    binding = hmac.new(key, digestmod=hashlib.sha256)
    for name in sorted(credentials):
        binding.update(json.dumps([name, credentials[name]]).encode())
    secret = set(credentials.values())
    plan, network, pack, limits = recipe.plan, recipe.network, recipe.pack, recipe.limits
    env = {k: ("<credential>" if v in secret else v) for k, v in plan.env.items()}
    endpoint = network.endpoint
    whole: JsonValue = {
        "closure": str(pack.closure),
        "digest": pack.target.pin.closure.digest,
        "argv": list(plan.argv),
        "env": dict(sorted(env.items())),
        "dialect": plan.dialect,
        "authenticate": plan.authenticate,
        "backend": [backend.name, backend_config],
        "network": [
            network.mode,
            list(network.allow),
            list(network.private),
            [list(t) for t in network.tunnels],
            None if endpoint is None else endpoint.agent_url,
        ],
        "model": recipe.model,
        "limits": [limits.memory_bytes, limits.cpus, limits.pids, recipe.disk_mb],
        "capabilities": recipe.capabilities.to_wire(),
        "binding": binding.hexdigest(),
    }
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()


def recipe_for(
    ctx: JobContext,
    declared: Declared,
    pack: PreparedPack,
    plan: LaunchPlan,
    credentials: Mapping[str, str],
) -> Recipe | None:
    """The recipe of a job that may use a warm slot, or None: its pack has no pool, its
    backend cannot keep slots, or the job needs what a slot cannot give it (a resumed
    session, a kept workspace, no lease to fence the claim with)."""
    pool, spec = ctx.pool, ctx.spec
    if pool is None or not pooled(pool, spec.pack.name):
        return None
    resumes = declared.sessions is not None and declared.sessions.resume is not None
    if resumes or spec.keep_workspace:
        return None
    if ctx.labels.get(base.LABEL_TOKEN, "0") == "0":
        return None
    model = spec.model
    model_id = None if model is None or model.variant else model.id
    limits = base.ResourceLimits(
        memory_bytes=spec.limits.memory_mb * 1024 * 1024,
        cpus=spec.limits.cpus,
        pids=spec.limits.pids,
    )
    disk = spec.limits.disk_mb if ctx.settings.workspace_disk == "loop" else None
    capabilities = ClientCapabilities(
        fs=plan.client_fs,
        terminal=True,
        subagents=True,
        parameterized_models=parameterized_models(spec, plan.dialect),
    )
    recipe = Recipe(
        pack_name=spec.pack.name,
        provider=declared.provider,
        pack=pack,
        network=declared.network,
        model=model_id,
        limits=limits,
        disk_mb=disk,
        plan=plan,
        capabilities=capabilities,
    )
    digest = identity(
        recipe,
        key=pool.key,
        backend=pool.backend,
        backend_config=pool.backend_config,
        credentials=credentials,
    )
    return replace(recipe, identity=digest)
