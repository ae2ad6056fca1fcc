"""The pack manifest ``provider_packs/<name>/pack.json`` and loading a pack.

The manifest is hand-written (name, provider, launch) except ``platforms``, whose pins
``acp-worker pack lock`` fills in. Example::

    {"schema": 1, "name": "cursor-emulator", "version": "0.1.0",
     "provider": "cursor", "dialect": "cursor",
     "launch": {"argv": ["/usr/bin/python3", "{pack}/cursor_emulator.py", "acp"],
                "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                "credentials": ["CURSOR_API_KEY", "CURSOR_AUTH_SLUG"],
                "session_store": ".cursor/acp-sessions"},
     "platforms": {"any": {
        "archive": {"source": "dist/cursor-emulator-linux.tar", "sha256": "<hex>",
                    "size": 12345, "format": "tar"},
        "closure": {"digest": "sha256:<hex>", "files": 7, "bytes": 40000}}}}

``{pack}`` in ``launch.argv`` stands for the verified closure directory.

A pack with no ``platforms`` yet is **unlocked**: a recipe whose bytes nobody has hashed
(``provider_packs/cursor``). Nothing of it runs: a job naming it, ``pack verify`` and
``pack materialize`` are refused ``pack_unlocked`` with the one command that locks it,
``acp-worker pack lock <name> --url <https-url>``, the URL defaulting to the recipe's
``download`` entry for the platform::

    "download": {"linux-x64": {"kind": "https",
                               "url": "https://…/linux/x64/agent-cli-package.tar.gz"}}
``launch.runtime`` (optional) is what the launch needs from the sandbox's root filesystem
outside the closure: the npm packs' closures hold ``node_modules`` only and run the host's
``/usr/bin/node`` (bound read-only with ``/usr``), so they declare
``"runtime": {"node": ">=20"}`` and the worker checks it before launching
(``worker.packs.requirements``).
``launch.sessions`` (optional) says what the agent records of one session, so the worker
keeps it between jobs (``worker.sessions``) and ``session.resume`` works across jobs:
``dir``, a directory relative to HOME, and ``keep``, the paths in it that belong to one
session, ``{session}`` standing for its id and ``*`` for any characters of one name::

    "sessions": {"dir": ".claude/projects", "keep": ["*/{session}.jsonl", "*/{session}"]}

``launch.session_store`` (the older form, still read) is a directory holding one
subdirectory per session id: ``"session_store": "D"`` is
``"sessions": {"dir": "D", "keep": ["{session}"]}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from worker.errors import (
    DigestMismatch,
    InvalidInput,
    PackNotFound,
    PackUnlocked,
    PlatformUnsupported,
)
from worker.packs._io import invalid_input, read_json
from worker.packs.closure import ClosureLock, read_lock
from worker.packs.names import (
    ANY,
    CLOSURE_DIGEST,
    SHA256_HEX,
    Platform,
    check_pack_name,
    check_platform,
    current_platform,
    path_problem,
)
from worker.packs.sources import HttpsSource, S3Source

MANIFEST = "pack.json"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_SLUG = r"^[a-z0-9][a-z0-9._-]{0,63}$"
# A HOME-relative directory: plain components only (it becomes a bind target).
_HOME_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,15}$"
#: Names of a Node.js binary in ``launch.argv[0]`` (checked by ``launch.runtime.node``).
NODE_NAMES = frozenset({"node", "nodejs"})
# A minimum version: `>=MAJOR[.MINOR[.PATCH]]`, nothing fancier (no ranges, no tags).
_AT_LEAST = r"^>=(0|[1-9][0-9]{0,3})(\.(0|[1-9][0-9]{0,3})){0,2}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LocalSource(_Strict):
    """An archive file inside the pack folder; in JSON simply its relative path.

    HTTPS and S3 sources join as further ``kind``s of a discriminated union; the bare
    string form stays the local one.
    """

    kind: Literal["local"] = "local"
    path: str = Field(description="POSIX path relative to the pack folder.")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: object) -> Any:
        return {"kind": "local", "path": data} if isinstance(data, str) else data

    @field_validator("path")
    @classmethod
    def _inside_pack(cls, value: str) -> str:
        problem = path_problem(value)
        if problem:
            raise ValueError(f"archive source must be a path inside the pack folder: {problem}")
        return value

    @model_serializer
    def _as_string(self) -> str:
        return self.path

    def resolve(self, pack_dir: Path) -> Path:
        """The archive's path on this host."""
        return pack_dir.joinpath(*PurePosixPath(self.path).parts)


# A bare string or ``{"kind": "local"}`` is a pack-folder path; ``https``/``s3`` kinds
# are fetched into the cache by ``worker.packs.sources``.
ArchiveSource = Annotated[LocalSource | HttpsSource | S3Source, Field(union_mode="left_to_right")]


class ArchivePin(_Strict):
    """Where the vendor archive comes from and the bytes it must be."""

    source: ArchiveSource
    sha256: Annotated[str, Field(pattern=SHA256_HEX)]
    size: int = Field(ge=0)
    format: Literal["tar", "tar.gz", "tgz"]


class ClosurePin(_Strict):
    """The extracted closure: its digest (see ``closure_digest``), file count and bytes."""

    digest: Annotated[str, Field(pattern=CLOSURE_DIGEST)]
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class PlatformPin(_Strict):
    """The pins of one platform."""

    archive: ArchivePin
    closure: ClosurePin


class Runtime(_Strict):
    """What the launch needs from the sandbox's root filesystem, outside the closure.

    Only what the closure cannot carry belongs here: an interpreter the launch runs from
    the host's ``/usr``. Something inside the closure is pinned by the closure's digest.
    """

    node: Annotated[str, Field(pattern=_AT_LEAST)] = Field(
        description="Minimum Node.js version, `>=MAJOR[.MINOR[.PATCH]]` (e.g. `>=20`), of "
        "`launch.argv[0]` when that is a `node` binary, else of the `node` on the sandbox's "
        "PATH."
    )

    @property
    def node_minimum(self) -> tuple[int, int, int]:
        """``node`` as a comparable ``(major, minor, patch)``."""
        parts = [int(part) for part in self.node.removeprefix(">=").split(".")]
        major, minor, patch = (*parts, 0, 0)[:3]
        return major, minor, patch


#: Files a pack writes into its agent's HOME: at most this many, each at most this big.
MAX_HOME_FILES = 8
MAX_HOME_FILE_BYTES = 64 * 1024

HomeFiles = dict[Annotated[str, Field(pattern=_HOME_PATH, max_length=255)], str]


def _check_home_files(value: dict[str, str] | None, field: str) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_HOME_FILES:
        raise ValueError(f"{field}: at most {MAX_HOME_FILES} files")
    for path, content in value.items():
        problem = path_problem(path)
        if problem or "/" not in path:
            why = problem or "a file directly in HOME (it goes in a directory of its own)"
            raise ValueError(f"{field}: {path!r} must be a path below a directory of HOME: {why}")
        if len(content.encode()) > MAX_HOME_FILE_BYTES:
            raise ValueError(f"{field}: {path!r} is over {MAX_HOME_FILE_BYTES} bytes")
    return value


class EndpointUse(_Strict):
    """How the agent is pointed at an operator's model endpoint (``worker.endpoints``):
    variables, files, or both; ``{endpoint}`` is the endpoint's base URL as the agent
    reaches it."""

    env: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = Field(
        default_factory=dict,
        description="Variables set when the job has a model endpoint (e.g. `ANTHROPIC_BASE_URL`).",
    )
    files: HomeFiles | None = Field(
        default=None,
        description="Files written into HOME when the job has a model endpoint, in place of "
        "`launch.files` of the same path (e.g. codex's `.codex/config.toml`).",
    )

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_home_files(value, "launch.endpoint.files")

    @model_validator(mode="after")
    def _something(self) -> EndpointUse:
        if not self.env and not self.files:
            raise ValueError("launch.endpoint needs env or files")
        return self


#: One name of a ``keep`` pattern: plain characters, ``*`` and ``{session}``.
_KEEP_PART = re.compile(r"^(?:[A-Za-z0-9._-]|\*|\{session\})+$")
SESSION_SLOT = "{session}"


class SessionFiles(_Strict):
    """What the agent records of one session, below one HOME-relative directory."""

    dir: Annotated[str, Field(pattern=_HOME_PATH, max_length=255)] = Field(
        description="The directory (relative to HOME) where the agent records its sessions: "
        "each job gets a fresh one, holding only the resumed session's files.",
    )
    keep: list[Annotated[str, Field(max_length=255)]] = Field(
        min_length=1,
        max_length=8,
        description="The paths in `dir` that belong to one session: `/`-separated names "
        "where `{session}` is the session id and `*` any characters but `/`; each names "
        "`{session}`. A directory matched is kept whole.",
    )
    recorded_after_answer: bool = Field(
        default=False,
        description="The agent records a turn only after it has answered it, and exits on "
        "stdin EOF without waiting for that write (claude-agent-acp's CLI writes its "
        "transcript 40-70 ms after the answer): the teardown waits, at most "
        "`ACPW_SESSION_SETTLE_S`, for the session's files to change after the last answer "
        "before it closes stdin.",
    )

    @field_validator("dir")
    @classmethod
    def _dir_below_home(cls, value: str) -> str:
        problem = path_problem(value)
        if problem:
            raise ValueError(f"sessions.dir must be a path relative to HOME: {problem}")
        return value

    @field_validator("keep")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            parts = pattern.split("/")
            bad = [p for p in parts if p in (".", "..") or "**" in p or not _KEEP_PART.match(p)]
            if bad or len(parts) > MAX_KEEP_DEPTH:
                raise ValueError(
                    f"sessions.keep {pattern!r}: at most {MAX_KEEP_DEPTH} names of letters, "
                    "digits, `._-`, `*` and `{session}` (no `.`, `..` or `**`)"
                )
            if SESSION_SLOT not in pattern:
                raise ValueError(f"sessions.keep {pattern!r} must name `{SESSION_SLOT}`")
        return value


#: The most names a ``keep`` pattern may have.
MAX_KEEP_DEPTH = 8


class Launch(_Strict):
    """How the agent starts: fixed argv, fixed env, the credentials it may receive."""

    argv: list[str] = Field(min_length=1, description="`{pack}` = the closure directory.")
    env: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = Field(default_factory=dict)
    credentials: list[Annotated[str, Field(pattern=_ENV_NAME)]] = Field(default_factory=list)
    session_store: Annotated[str, Field(pattern=_HOME_PATH, max_length=255)] | None = Field(
        default=None,
        description="Where the agent records its sessions, relative to HOME, one directory "
        "per session id (e.g. `.cursor/acp-sessions`); enables resume across jobs. The "
        'older form of `sessions` (`{dir: <it>, keep: ["{session}"]}`).',
    )
    sessions: SessionFiles | None = Field(
        default=None,
        description="What the agent records of one session (enables resume across jobs); "
        "not with `session_store`.",
    )

    authenticate: Annotated[str, Field(pattern=_SLUG, max_length=64)] | None = Field(
        default=None,
        description="An ACP `authenticate` method id the worker calls after `initialize` "
        "(e.g. codex-acp's `api-key`, which reads the bound key from the environment).",
    )
    client_fs: bool | None = Field(
        default=None,
        description="Offer the agent the client's `fs/read_text_file` and "
        "`fs/write_text_file` (on backends that share the workspace with the worker); "
        "absent: true. False for an agent that mishandles their errors and works on its "
        "own files anyway (gemini-cli 0.61: its write_file cannot create a file through "
        "them).",
    )
    runtime: Runtime | None = Field(
        default=None,
        description="What the launch needs outside its closure (e.g. the host's Node.js); "
        "checked before every launch on backends that share the host's /usr.",
    )
    endpoint: EndpointUse | None = Field(
        default=None,
        description="How to point the agent at a model endpoint; none: the pack's agent "
        "cannot use one (a job naming one is refused).",
    )
    mode: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")] | None = Field(
        default=None,
        description="The session mode set when the job names none (checked against the "
        "modes the agent offers, as a job's): e.g. codex-acp's `agent-full-access`, whose "
        "own sandbox cannot run inside ours.",
    )
    exits_on_eof: bool | None = Field(
        default=None,
        description="`false`: the agent does not exit promptly once its stdin closes "
        "(codex-acp takes 2 s), so the teardown sends SIGTERM right after closing it "
        "instead of waiting `ACPW_SHUTDOWN_EOF_GRACE`. Default: it does.",
    )
    files: HomeFiles | None = Field(
        default=None,
        description="Files written into the agent's HOME before every launch (its private "
        "configuration: telemetry off, no update checks), each below a directory of HOME; "
        "that directory is the job's own and writable by the agent.",
    )
    model_files: HomeFiles | None = Field(
        default=None,
        description="Text put at the start of these HOME files (after `launch.files` or "
        "`launch.endpoint.files` of the same path) when the job names its model by a plain "
        "id, `{model}` standing for that id: the agent then starts, and resumes a session, "
        "on the job's model, not on its own default until the worker selects the job's "
        '(codex-acp: `.codex/config.toml`, `model = "{model}"`).',
    )
    hosts: list[str] | None = Field(
        default=None,
        max_length=16,
        description="`host:port` the agent contacts by default (its vendor's API): added to "
        "an `allowlist` job's list when the job has no model endpoint.",
    )

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_home_files(value, "launch.files")

    @field_validator("model_files")
    @classmethod
    def _model_files(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_home_files(value, "launch.model_files")

    @field_validator("hosts")
    @classmethod
    def _host_ports(cls, value: list[str] | None) -> list[str] | None:
        from worker.network.allow import parse_endpoint

        try:
            return None if value is None else [str(parse_endpoint(h)) for h in value]
        except ValueError as exc:
            raise ValueError(f"launch.hosts: {exc}") from exc

    @field_validator("session_store")
    @classmethod
    def _below_home(cls, value: str | None) -> str | None:
        problem = None if value is None else path_problem(value)
        if problem:
            raise ValueError(f"session_store must be a path relative to HOME: {problem}")
        return value

    @model_validator(mode="after")
    def _one_session_form(self) -> Launch:
        if self.session_store is not None and self.sessions is not None:
            raise ValueError("launch.session_store and launch.sessions are exclusive")
        return self

    @property
    def session_files(self) -> SessionFiles | None:
        """What the worker keeps of one session (either form), or None: no resume."""
        if self.session_store is not None:
            return SessionFiles(dir=self.session_store, keep=[SESSION_SLOT])
        return self.sessions

    @model_validator(mode="after")
    def _runtime_outside_closure(self) -> Launch:
        # The worker reads the version by running the host's binary: never a node from the
        # closure (pack code outside the sandbox), which the closure's digest pins anyway.
        first = self.argv[0]
        runs_node = PurePosixPath(first).name in NODE_NAMES
        if self.runtime is not None and runs_node and not _host_path(first):
            raise ValueError(
                "launch.runtime.node checks the host's Node.js: launch.argv[0] must then "
                f"be a host path such as /usr/bin/node, not {first!r}"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # Optional fields left out dump left out, so a manifest dumps as it was written.
        data: dict[str, object] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


def _host_path(arg: str) -> bool:
    return arg.startswith("/") and "{" not in arg


class PackManifest(_Strict):
    """``pack.json``."""

    schema_version: Literal[1] = Field(alias="schema")
    name: Annotated[str, Field(pattern=_SLUG)]
    version: str = Field(min_length=1, max_length=128)
    provider: Annotated[str, Field(pattern=_SLUG)]
    dialect: Annotated[str, Field(pattern=_SLUG)]
    launch: Launch
    platforms: dict[Platform, PlatformPin] = Field(default_factory=dict)
    download: dict[Platform, HttpsSource] | None = Field(
        default=None,
        description="Where each platform's vendor archive is downloaded from when the pack "
        "is locked (`pack lock NAME` without `--url`); its pins, not this, are what runs.",
    )

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


def parse_manifest(data: object, *, path: Path | str) -> PackManifest:
    """Validate manifest JSON; raises InvalidInput naming the offending field."""
    try:
        return PackManifest.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, path=path) from exc


@dataclass(frozen=True, slots=True)
class PlatformTarget:
    """The platform entry a pack resolved to (``any`` when no exact build exists)."""

    platform: Platform
    pin: PlatformPin


@dataclass(frozen=True, slots=True)
class Pack:
    """A loaded pack: its manifest and its folder."""

    manifest: PackManifest
    path: Path

    @property
    def name(self) -> str:
        """The pack's name (equal to its folder name)."""
        return self.manifest.name

    @property
    def credentials(self) -> tuple[str, ...]:
        """Credential names the pack accepts (``launch.credentials``)."""
        return tuple(self.manifest.launch.credentials)

    def for_platform(self, platform: str | None = None) -> PlatformTarget:
        """The entry for *platform* (default: this host's), else the ``any`` entry.

        Raises InvalidInput for an unknown platform name, PackUnlocked when the pack has
        no pins at all (a recipe never locked), PlatformUnsupported when it has neither
        the platform nor ``any``.
        """
        wanted = check_platform(platform) if platform is not None else _host_platform()
        pins = self.manifest.platforms
        if not pins:
            self.refuse_unlocked(wanted)
        for key in (wanted, ANY):
            if key is not None and key in pins:
                return PlatformTarget(key, pins[key])
        raise PlatformUnsupported(
            f"pack {self.name!r} has no build for {wanted or 'this host'}",
            pack=self.name,
            platform=wanted,
            available=sorted(pins),
        )

    @property
    def unlocked(self) -> bool:
        """No platform pinned yet: a recipe, not something that runs."""
        return not self.manifest.platforms

    def lock_command(self, platform: str | None) -> str:
        """The one command that locks this pack for *platform* (its download URL if the
        recipe names one, else a placeholder)."""
        recipe = (self.manifest.download or {}).items()
        url = next((src.url for plat, src in recipe if plat == platform), "<https-url>")
        plat = f" --platform {platform}" if platform else ""
        return f"acp-worker pack lock {self.name} --url {url}{plat}"

    def refuse_unlocked(self, platform: str | None = None) -> None:
        """Raise PackUnlocked if the pack has no pins (*platform*: default this host's).

        Raises:
            PackUnlocked: naming the command that locks it.
        """
        if not self.unlocked:
            return
        command = self.lock_command(platform or _host_platform())
        raise PackUnlocked(
            f"pack {self.name!r} is not locked: its archive and closure digests are not "
            f"pinned yet, so it cannot run. On a machine with internet, run: {command}",
            pack=self.name,
            platform=platform,
            command=command,
        )

    def archive_path(self, target: PlatformTarget) -> Path:
        """Where *target*'s archive lives on this host."""
        return target.pin.archive.source.resolve(self.path)

    def read_lock(self, target: PlatformTarget) -> ClosureLock:
        """*target*'s lock file, checked against the manifest's pins.

        Raises InvalidInput (missing or malformed lock) or DigestMismatch (the lock and
        the manifest disagree).
        """
        path = self.path / "lock" / f"{target.platform}.json"
        lock = read_lock(path)
        _check_agrees(lock, self.name, target, path)
        return lock


def _host_platform() -> Platform | None:
    try:
        return current_platform()
    except PlatformUnsupported:
        return None


def _check_agrees(lock: ClosureLock, name: str, target: PlatformTarget, path: Path) -> None:
    if (lock.pack, lock.platform) != (name, target.platform):
        raise InvalidInput(
            f"{path} is the lock of {lock.pack}/{lock.platform}, not {name}/{target.platform}",
            path=str(path),
            field="pack",
        )
    pin = target.pin
    expected = (pin.archive.sha256, pin.closure.digest, pin.closure.files, pin.closure.bytes)
    actual = (lock.archive_sha256, lock.closure_digest, len(lock.files), lock.total_bytes)
    if expected != actual:
        raise DigestMismatch(
            f"{path} does not match the pins in {MANIFEST}",
            path=str(path),
            expected=list(expected),
            actual=list(actual),
        )


def load_pack(packs_dir: Path, name: str) -> Pack:
    """The pack *name* in *packs_dir*.

    Raises PackNotFound (no such pack; an invalid name is also InvalidInput) or
    InvalidInput (malformed manifest, naming the field).
    """
    check_pack_name(name)
    return load_pack_dir(packs_dir / name)


def load_pack_dir(path: Path) -> Pack:
    """The pack in folder *path*; its manifest's name must equal the folder name.

    Raises PackNotFound (no ``pack.json`` there) or InvalidInput (malformed manifest).
    """
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise PackNotFound(f"no pack at {path} (missing {MANIFEST})", path=str(path))
    manifest = parse_manifest(read_json(manifest_path), path=manifest_path)
    if manifest.name != path.name:
        raise InvalidInput(
            f"{manifest_path}: name {manifest.name!r} differs from its folder {path.name!r}",
            path=str(manifest_path),
            field="name",
        )
    return Pack(manifest, path)
