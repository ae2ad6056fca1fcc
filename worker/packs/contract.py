"""The launch contract of a dialect: what a pack's argv and environment may and must say.

Written in a pack file, a contract is only a convention; here it is enforced, at
``pack lock`` (``worker.packs.lock``) and before every launch (``worker.packs.runtime``),
so a pack edited after its lock is refused too. A breach is ``LaunchRefused``
(``launch_refused``, exit 3) naming the offending flag or variable.

Only the ``cursor`` dialect has a contract (``docs/CURSOR_ACP_FACTS.md`` §1, the observed
runner S0 and the bundle reading R1): Cursor's CLI runs as ``<program> [options] acp`` where

- the options are exactly ``--disable-project-configs`` and ``--disable-auto-update``
  (both required), plus, at most, ``--sandbox enabled``. Everything else is refused,
  by name where its effect is known: ``-f``/``--force``/``--yolo`` (run every tool
  without asking), ``--trust``, ``--approve-mcps``, ``--sandbox`` other than
  ``enabled``, ``-e``/``--endpoint`` and ``-H``/``--header`` (an endpoint or headers the
  operator did not declare: an endpoint reaches the agent only through the pack's
  ``launch.endpoint`` and an operator-declared model endpoint), ``--api-key`` and
  ``--auth-token`` (a credential enters only as a variable the job bound), and any
  spelling of them: ``--force=true``, combined short flags (``-fp``), a value attached
  (``-ehttps://…``), after ``acp``;
- nothing follows ``acp`` (Cursor's global options go before it);
- the private environment is set: ``CURSOR_CONFIG_DIR`` and ``CURSOR_DATA_DIR`` below
  the job's HOME, ``AGENT_CLI_CREDENTIAL_STORE=memory`` (credentials never written to
  disk), ``NO_OPEN_BROWSER=1``, ``NODE_DISABLE_COMPILE_CACHE=1``;
- the pack's fixed variables hold no credential (``CURSOR_API_KEY``,
  ``CURSOR_AUTH_TOKEN``) and no URL (an endpoint by another name).

The program is the argv's leading words up to the first option or ``acp`` (the vendor's
bundled ``node`` and ``index.js``, or the emulator's interpreter and script).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker.errors import LaunchRefused
from worker.launch import expand, launch_plan

if TYPE_CHECKING:
    from worker.packs.manifest import PackManifest

CURSOR = "cursor"
SUBCOMMAND = "acp"
REQUIRED_FLAGS = ("--disable-project-configs", "--disable-auto-update")
#: ``--sandbox``'s one admitted value: Cursor's own sandbox on, never off.
SANDBOX_ON = "enabled"

#: Long options whose effect is known, and why each is refused.
REFUSED_LONG: Mapping[str, str] = {
    "--force": "runs every tool without asking for permission",
    "--yolo": "runs every tool without asking for permission (an alias of --force)",
    "--trust": "trusts the workspace without the operator's decision",
    "--approve-mcps": "approves every MCP server without asking",
    "--endpoint": "points the agent at an endpoint the operator did not declare "
    "(use launch.endpoint with an operator-declared model endpoint)",
    "--header": "adds headers to the agent's API requests, outside the operator's control",
    "--api-key": "puts a credential in the argv: bind CURSOR_API_KEY through the job",
    "--auth-token": "puts a credential in the argv: bind CURSOR_AUTH_TOKEN through the job",
    "--data-dir": "moves the agent's data out of CURSOR_DATA_DIR in the job's HOME",
}
#: Short options (``-f``, ``-e``, ``-H``), as the long option each stands for. A word of
#: short options (``-fp``, ``-ehttps://…``) is refused when any letter is one of these:
#: over-refusing a value that happens to hold the letter is the safe side.
SHORT: Mapping[str, str] = {"f": "--force", "e": "--endpoint", "H": "--header"}

#: The private environment: each variable and what its value must be.
FIXED_ENV: Mapping[str, str] = {
    "AGENT_CLI_CREDENTIAL_STORE": "memory",
    "NO_OPEN_BROWSER": "1",
    "NODE_DISABLE_COMPILE_CACHE": "1",
}
#: Directories that must lie below the job's HOME.
HOME_DIRS = ("CURSOR_CONFIG_DIR", "CURSOR_DATA_DIR")
#: Credentials: only a job's binding may set them, never the pack's fixed variables.
CREDENTIALS = frozenset({"CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"})


@dataclass(frozen=True, slots=True)
class _Breach:
    reason: str
    flag: str | None = None
    variable: str | None = None


def check_launch(
    dialect: str | None,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    home: str,
    pack: str,
    fixed_env: Mapping[str, str] | None = None,
) -> None:
    """Refuse a launch that breaks *dialect*'s contract (a no-op for dialects without one).

    *env* is the launch's environment with the pack's placeholders expanded, *home* what
    ``{home}`` expands to; *fixed_env* the pack's own variables (``launch.env``), which
    must hold no credential and no URL.

    Raises:
        LaunchRefused: naming the first offending flag or variable and why.
    """
    if dialect != CURSOR:
        return
    breach = (
        argv_breach(argv)
        or env_breach(env, home=home)
        or fixed_env_breach(fixed_env or {})
    )  # fmt: skip
    if breach is not None:
        what = breach.flag or breach.variable
        raise LaunchRefused(
            f"pack {pack!r} breaks the cursor launch contract: {what}: {breach.reason}",
            pack=pack,
            dialect=dialect,
            reason=breach.reason,
            **({"flag": breach.flag} if breach.flag is not None else {}),
            **({"variable": breach.variable} if breach.variable is not None else {}),
        )


def check_declared(manifest: PackManifest) -> None:
    """Refuse a manifest whose launch, as declared (no credentials, no endpoint), breaks
    its dialect's contract: what ``pack lock`` and a job's admission check.

    Raises:
        LaunchRefused: naming the offending flag or variable.
    """
    launch = manifest.launch
    plan = launch_plan(argv=launch.argv, env=launch.env, dialect=manifest.dialect,
                       credentials={})  # fmt: skip
    check_launch(plan.dialect, plan.argv, plan.env, home=expand("{home}"),
                 pack=manifest.name, fixed_env=launch.env)  # fmt: skip


def program(argv: Sequence[str]) -> tuple[str, ...]:
    """The argv's program words: those before the first option or ``acp``."""
    words: list[str] = []
    for word in argv:
        if word.startswith("-") or word == SUBCOMMAND:
            break
        words.append(word)
    return tuple(words)


def argv_breach(argv: Sequence[str]) -> _Breach | None:
    """The first breach of the cursor argv rules, or None."""
    start = len(program(argv))
    if start == 0:
        return _Breach("the argv names no program before its options", flag=argv[0])
    rest = list(argv[start:])
    if rest.count(SUBCOMMAND) != 1:
        return _Breach("the argv must end with the subcommand `acp`, once", flag=SUBCOMMAND)
    at = rest.index(SUBCOMMAND)
    options, after = rest[:at], rest[at + 1 :]
    return (
        _refused_anywhere(rest)
        or _after_subcommand(after)
        or _options(options)
    )  # fmt: skip


def _refused_anywhere(words: Sequence[str]) -> _Breach | None:
    for word in words:
        reason = _known_refusal(word)
        if reason is not None:
            return _Breach(reason, flag=word)
    return None


def _known_refusal(word: str) -> str | None:
    if word.startswith("--"):
        return REFUSED_LONG.get(word.split("=", 1)[0])
    if word.startswith("-") and len(word) > 1:
        letter = next((c for c in word[1:] if c in SHORT), None)
        return None if letter is None else REFUSED_LONG[SHORT[letter]]
    return None


def _after_subcommand(after: Sequence[str]) -> _Breach | None:
    if after:
        return _Breach("nothing may follow `acp` (Cursor's options go before it)", flag=after[0])
    return None


def _options(options: Sequence[str]) -> _Breach | None:
    at = 0
    while at < len(options):
        word = options[at]
        name, eq, value = word.partition("=")
        if name == "--sandbox":
            given = options[at + 1] if not eq and at + 1 < len(options) else ""
            mode = value if eq else ("" if given.startswith("-") else given)
            if mode != SANDBOX_ON:
                flag = word if eq or not mode else f"{word} {mode}"
                return _Breach(f"turns Cursor's sandbox off or leaves it unset ({mode!r})",
                               flag=flag)  # fmt: skip
            at += 1 if eq else 2
            continue
        if word not in REQUIRED_FLAGS:
            return _Breach("not an option of the cursor launch contract", flag=word)
        at += 1
    missing = next((flag for flag in REQUIRED_FLAGS if flag not in options), None)
    return None if missing is None else _Breach("required before `acp`", flag=missing)


def env_breach(env: Mapping[str, str], *, home: str) -> _Breach | None:
    """The first missing or wrong variable of the private environment, or None."""
    for name, wanted in FIXED_ENV.items():
        if env.get(name) != wanted:
            return _Breach(f"must be {wanted!r}, is {env.get(name)!r}", variable=name)
    for name in HOME_DIRS:
        if not _below(env.get(name), home):
            return _Breach(f"must be a directory below the job's HOME ({home})", variable=name)
    return None


def fixed_env_breach(fixed_env: Mapping[str, str]) -> _Breach | None:
    """A credential or a URL among the pack's own variables, or None."""
    for name, value in fixed_env.items():
        if name in CREDENTIALS:
            return _Breach("a credential in the pack's variables: bind it through the job",
                           variable=name)  # fmt: skip
        if "://" in value:
            return _Breach("a URL in the pack's variables is an endpoint the operator did "
                           "not declare (use launch.endpoint)", variable=name)  # fmt: skip
    return None


def _below(path: str | None, home: str) -> bool:
    prefix = home.rstrip("/") + "/"
    if not path or not path.startswith(prefix):
        return False
    parts = path[len(prefix) :].split("/")
    return all(part not in ("", ".", "..") for part in parts)


__all__ = ["CURSOR", "argv_breach", "check_declared", "check_launch", "env_breach", "program"]
