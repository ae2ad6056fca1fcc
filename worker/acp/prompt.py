"""The job's prompt checked against the agent and the staged workspace before it is sent.

A block the agent cannot take is never dropped or converted: the job fails before the
prompt, saying which capability was missing (``unsupported``) or which linked file
was refused (``prompt_refused``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker.errors import PromptRefused, Unsupported
from worker.events.artifacts import ArtifactCheck
from worker.jobs.prompt import workspace_path

#: Prompt block type → the ``promptCapabilities`` key an agent must set to take it
#: (text and resource_link are ACP's baseline: every agent takes them).
CAPABILITIES = {"image": "image", "audio": "audio", "resource": "embeddedContext"}


def check_capabilities(init: Mapping[str, object], blocks: Sequence[Mapping[str, object]]) -> None:
    """Every block's type is one the agent's ``initialize`` result advertised.

    Raises:
        Unsupported: a block needs a capability the agent did not set to ``true``.
    """
    agent = init.get("agentCapabilities")
    prompt = agent.get("promptCapabilities") if isinstance(agent, Mapping) else None
    offered = prompt if isinstance(prompt, Mapping) else {}
    for index, block in enumerate(blocks):
        capability = CAPABILITIES.get(str(block.get("type")))
        if capability is not None and offered.get(capability) is not True:
            raise Unsupported(
                f"the prompt holds a {block.get('type')} block, and the agent does not "
                f"advertise promptCapabilities.{capability}",
                capability=f"promptCapabilities.{capability}",
                block=index,
            )


def check_links(blocks: Sequence[Mapping[str, object]], check: ArtifactCheck) -> None:
    """Every ``resource_link`` names a regular file of the staged workspace, reached
    through no link (``check`` is the workspace's artifact check).

    Raises:
        PromptRefused: a linked file is missing, not a regular file, reached through a
            symbolic link, or the worker cannot see the workspace from its host.
    """
    for index, block in enumerate(blocks):
        if block.get("type") != "resource_link":
            continue
        path = workspace_path(str(block["uri"]))
        verdict = check(path)
        if verdict.relative is None:
            reason = verdict.reason or "refused"
            raise PromptRefused(
                f"prompt block {index} links {path!r}, which the worker refuses: {reason}",
                block=index,
                path=path,
                reason=reason,
            )
