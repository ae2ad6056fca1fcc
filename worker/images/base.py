"""The sandbox base image: a root filesystem tarball, built once, imported FROM scratch.

No registry is reachable from the workers, so the base image is made here:

1. ``rootfs_tarball``: ``mmdebstrap`` (Debian ``essential`` + ``PACKAGES``) from the
   configured apt mirror, plus the host's Node binary, the ``agent`` user (1000:1000),
   ``/workspace``, ``/home/agent``, ``/opt/acp-pack`` and ``/tmp`` 1777. Cached under
   ``<images_dir>/rootfs/<recipe>.tar`` (≈ 55 s to make here, ≈ 290 MB).
2. ``ensure_base``: ``images/base.Containerfile`` (``FROM scratch`` + ``ADD rootfs.tar``)
   built by the engine and tagged ``localhost/acpw-base:<recipe>`` (≈ 15 s).

The *recipe* digest covers everything that goes in (suite, mirror, packages, hooks, the
Containerfile, the Node binary's size and mtime), so it is known without building and
names both the tarball and the image. The image's own id is the base digest that pack
image identities are computed over.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.errors import SandboxError
from worker.images.engine import EngineConfig, translate
from worker.images.identity import BASE_REPO, BUILDER_VERSION, LABEL_BASE_RECIPE

if TYPE_CHECKING:
    import docker

Progress = Callable[[str], None]


#: How long an interrupted mmdebstrap has to clean up after SIGTERM before SIGKILL.
MMDEBSTRAP_STOP_S = 60


def _images_src() -> Path:
    """``images/`` of the source tree, or where an installed package finds the
    Containerfiles (``<prefix>/share/acp-worker/images``: the worker image puts them there).
    """
    tree = Path(__file__).resolve().parents[2] / "images"
    if (tree / "base.Containerfile").is_file():
        return tree
    return Path(sys.prefix) / "share" / "acp-worker" / "images"


IMAGES_SRC = _images_src()
PACKAGES = ("python3", "git", "ca-certificates", "libstdc++6")
NODE_BINARY = Path("/usr/bin/node")
# Run by mmdebstrap with the new root as $1 (after packages are installed).
HOOKS = (
    'echo "agent:x:1000:1000:agent:/home/agent:/bin/sh" >> "$1/etc/passwd"',
    'echo "agent:x:1000:" >> "$1/etc/group"',
    'mkdir -p "$1/workspace" "$1/home/agent" "$1/opt/acp-pack"',
    'chown 1000:1000 "$1/workspace" "$1/home/agent" && chmod 0700 "$1/home/agent"',
    'chmod 1777 "$1/tmp"',
    'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/var/log/*',
)
_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")


@dataclass(frozen=True, slots=True)
class BaseRecipe:
    """Everything the base image is made from."""

    suite: str
    mirror: str
    containerfile: str
    node: tuple[str, int, int] | None  # path, size, mtime_ns of the copied Node binary
    packages: tuple[str, ...] = PACKAGES
    hooks: tuple[str, ...] = HOOKS

    @classmethod
    def from_config(cls, config: EngineConfig, images_src: Path = IMAGES_SRC) -> BaseRecipe:
        """The recipe for ``config`` (reads the Containerfile, stats the Node binary).

        Raises:
            SandboxError: ``images/base.Containerfile`` is missing.
        """
        path = images_src / "base.Containerfile"
        try:
            text = path.read_text()
        except OSError as exc:
            raise SandboxError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
        node = None
        if NODE_BINARY.is_file():
            st = NODE_BINARY.stat()
            node = (str(NODE_BINARY), st.st_size, st.st_mtime_ns)
        return cls(config.suite, config.apt_mirror, text, node)

    @property
    def digest(self) -> str:
        fields: dict[str, object] = {
            "builder": BUILDER_VERSION,
            "suite": self.suite,
            "mirror": self.mirror,
            "containerfile": self.containerfile,
            "node": list(self.node) if self.node else None,
            "packages": list(self.packages),
            "hooks": list(self.hooks),
        }
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def tag(self) -> str:
        return f"{BASE_REPO}:{self.digest.removeprefix('sha256:')}"

    def mmdebstrap_argv(self, output: Path) -> list[str]:
        argv = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=tar"]
        argv.append("--include=" + ",".join(self.packages))
        argv += [f"--dpkgopt=path-exclude={pattern}" for pattern in _EXCLUDES]
        if self.node:
            argv.append(f"--customize-hook=copy-in {self.node[0]} /usr/bin")
        argv += [f"--customize-hook={hook}" for hook in self.hooks]
        return [*argv, self.suite, str(output), self.mirror]


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def rootfs_tarball(config: EngineConfig, recipe: BaseRecipe, progress: Progress) -> Path:
    """The cached rootfs tarball of ``recipe``, made with mmdebstrap when missing.

    One process makes it (a lock); it appears under its final name only complete.

    Raises:
        SandboxError: mmdebstrap is missing or failed.
    """
    hex_ = recipe.digest.removeprefix("sha256:")
    final = config.images_dir / "rootfs" / f"{hex_}.tar"
    with _file_lock(config.images_dir / "rootfs" / f"{hex_}.lock"):
        if final.is_file():
            return final
        if shutil.which("mmdebstrap") is None:
            raise SandboxError("mmdebstrap is not installed (apt-get install mmdebstrap)")
        tmp = final.with_name(f".{hex_}.{os.getpid()}.tar")
        progress(f"making the base rootfs with mmdebstrap from {recipe.mirror} (about a minute)")
        try:
            _run_mmdebstrap(recipe.mmdebstrap_argv(tmp))
            tmp.rename(final)
        finally:
            tmp.unlink(missing_ok=True)
    return final


def _run_mmdebstrap(argv: list[str]) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            _, stderr = proc.communicate()
        except BaseException:
            # Interrupted (Ctrl-C, a caller's timeout): SIGTERM, so that mmdebstrap unmounts
            # and removes what it made in $TMPDIR (its gpg home, the new root); a SIGKILL,
            # as subprocess.run sends, left them there.
            proc.terminate()
            try:
                proc.wait(timeout=MMDEBSTRAP_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if proc.returncode != 0:
        raise SandboxError(
            f"mmdebstrap failed with exit {proc.returncode}", stderr_tail=stderr[-2000:]
        )


def find_base(client: docker.DockerClient, recipe: BaseRecipe) -> str | None:
    """The id of the base image built from ``recipe``, if the engine has it."""
    import docker.errors

    with translate("inspect base image", tag=recipe.tag):
        try:
            attrs: dict[str, Any] = low_level_api(client).inspect_image(recipe.tag)
        except docker.errors.ImageNotFound:
            return None
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_BASE_RECIPE) != recipe.digest:
        return None
    return str(attrs["Id"])


def ensure_base(
    client: docker.DockerClient,
    config: EngineConfig,
    recipe: BaseRecipe,
    progress: Progress,
) -> str:
    """The base image id, building the image (and its rootfs) when missing.

    Raises:
        SandboxError: mmdebstrap or the engine's build failed.
    """
    found = find_base(client, recipe)
    if found is not None:
        return found
    tarball = rootfs_tarball(config, recipe, progress)
    with tempfile.TemporaryDirectory(dir=config.images_dir) as context:
        os.link(tarball, Path(context) / "rootfs.tar")
        (Path(context) / "Containerfile").write_text(recipe.containerfile)
        progress(f"building {recipe.tag}")
        return build_image(
            client,
            path=context,
            tag=recipe.tag,
            labels={LABEL_BASE_RECIPE: recipe.digest},
            buildargs={},
            progress=progress,
        )


def build_image(
    client: docker.DockerClient,
    *,
    path: str,
    tag: str,
    labels: dict[str, str],
    buildargs: dict[str, str],
    progress: Progress,
) -> str:
    """Build ``path`` (with its ``Containerfile``), streaming the log to ``progress``.

    Raises:
        SandboxError: the engine reported a build error or no image id.
    """
    image_id: str | None = None
    with translate("build image", tag=tag):
        for chunk in client.api.build(
            path=path,
            dockerfile="Containerfile",
            tag=tag,
            labels=labels,
            buildargs=buildargs,
            rm=True,
            forcerm=True,
            decode=True,
        ):
            image_id = build_chunk(chunk, progress) or image_id
    if image_id is None:
        raise SandboxError("the engine's build reported no image id", tag=tag)
    return image_id


def build_chunk(chunk: dict[str, object], progress: Progress) -> str | None:
    if "error" in chunk:
        detail = chunk.get("errorDetail") or {}
        raise SandboxError(f"image build failed: {chunk['error']}".strip(), detail=detail)
    text = str(chunk.get("stream", "")).rstrip()
    if text:
        progress(text)
    aux = chunk.get("aux")
    if isinstance(aux, dict) and "ID" in aux:
        return str(aux["ID"])
    return None


def low_level_api(client: docker.DockerClient) -> Any:
    # A few low-level SDK methods have no annotations; typed as Any at this one place.
    return client.api
