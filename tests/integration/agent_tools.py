"""How each real npm agent's model calls the agent's own tools, as the scripted fakes
(:mod:`tests.fake_models`) must send them: names and argument shapes as offered in the
agent's request to the model (docs/agents-endpoints.md). Shared by the tests that drive
the agents directly (``test_real_agents_fake_models``) and through the worker
(``test_full_turns``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.fake_models import Reply, call

# The output is not in the command's text, so seeing it proves the command ran (no `$(...)`:
# gemini-cli blocks command substitution).
SHELL_CMD = "printf 'fake-shell-%s\\n' 42"
SHELL_OUT = "fake-shell-42"


@dataclass(frozen=True, slots=True)
class Tools:
    """How one agent's model calls its own tools."""

    read: Callable[[Path], Reply]
    write: Callable[[Path, str], Reply]
    # Replace one line of an existing file: the replies, in order (claude reads first).
    edit: Callable[[Path, str, str], list[Reply]]
    shell: Callable[[str], Reply]
    # The ACP session mode under which writing a file asks session/request_permission
    # (None: the agent's default mode already asks).
    write_mode: str | None = None
    # Does a tool_call(_update) show the shell command's output (gemini-cli 0.61 sends
    # the output to the model only: its updates carry no content)?
    shell_output_shown: bool = True


def _codex_patch(path: Path, content: str) -> Reply:
    lines = "".join(f"+{line}\n" for line in content.splitlines())
    return call(
        "apply_patch", input=f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"
    )


def _codex_update(path: Path, old: str, new: str) -> list[Reply]:
    patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
    return [call("apply_patch", input=patch)]


TOOLS = {
    "claude-agent-acp": Tools(
        read=lambda p: call("Read", file_path=str(p)),
        write=lambda p, c: call("Write", file_path=str(p), content=c),
        # Claude Code refuses to edit a file it has not read in the session.
        edit=lambda p, old, new: [
            call("Read", file_path=str(p)),
            call("Edit", file_path=str(p), old_string=old, new_string=new),
        ],
        shell=lambda cmd: call("Bash", command=cmd, description="Print a marker"),
    ),
    "codex-acp": Tools(
        read=lambda p: call("exec_command", cmd=f"cat {p}"),
        write=_codex_patch,
        edit=_codex_update,
        shell=lambda cmd: call("exec_command", cmd=cmd),
        # codex-acp's default mode ("workspace-write") patches the workspace unasked.
        write_mode="read-only",
    ),
    "gemini-cli": Tools(
        read=lambda p: call("read_file", file_path=str(p)),
        write=lambda p, c: call("write_file", file_path=str(p), content=c),
        edit=lambda p, old, new: [
            call(
                "replace",
                file_path=str(p),
                instruction="Change the secret word",
                old_string=old,
                new_string=new,
            )
        ],
        shell=lambda cmd: call("run_shell_command", command=cmd, description="Print a marker"),
        shell_output_shown=False,
    ),
}
