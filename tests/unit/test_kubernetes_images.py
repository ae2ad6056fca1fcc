"""A sandbox pod's pack image found in the pin store alone (``k8s_base_image_id``): no
engine is reached, the pushed digest reference is what the kubelet gets, and anything
else is a ``SandboxError``."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.errors import SandboxError
from worker.images.build import PinStore
from worker.images.identity import ImageIdentity, PinnedImage, PushedImage
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes import images

BASE = "sha256:" + "b" * 64
CLOSURE = "c" * 64
PUSHED = PushedImage("registry.example/acpw-pack", "x", "sha256:" + "d" * 64)


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("no engine may be reached")

    monkeypatch.setattr(images, "connect", refuse)


def _setup(tmp_path: Path, pushed: PushedImage | None) -> tuple[KubernetesConfig, Path]:
    config = KubernetesConfig(cache_dir=tmp_path, k8s_base_image_id=BASE)
    closure = tmp_path / "closures" / CLOSURE
    closure.mkdir(parents=True)
    identity = ImageIdentity(BASE, f"sha256:{CLOSURE}")
    PinStore(tmp_path / "images" / "pins").write(
        PinnedImage(identity, "sha256:" + "e" * 64, pushed)
    )
    return config, closure


def test_the_pushed_reference_is_found_without_an_engine(tmp_path: Path) -> None:
    config, closure = _setup(tmp_path, PUSHED)
    assert images.pack_image(config, closure, None) == PUSHED.reference


def test_an_image_never_pushed_is_refused(tmp_path: Path) -> None:
    config, closure = _setup(tmp_path, None)
    with pytest.raises(SandboxError, match="no pushed pack image"):
        images.pack_image(config, closure, None)


def test_another_base_finds_nothing(tmp_path: Path) -> None:
    config, closure = _setup(tmp_path, PUSHED)
    other = config.model_copy(update={"k8s_base_image_id": "sha256:" + "f" * 64})
    with pytest.raises(SandboxError, match="no pushed pack image"):
        images.pack_image(other, closure, None)


def test_a_corrupt_pin_is_a_sandbox_error(tmp_path: Path) -> None:
    config, closure = _setup(tmp_path, PUSHED)
    [pin] = (tmp_path / "images" / "pins").iterdir()
    pin.write_text('{"pushed": {"repository": 1}}')
    with pytest.raises(SandboxError, match="unreadable"):
        images.pack_image(config, closure, None)


def test_a_closure_outside_the_cache_is_refused(tmp_path: Path) -> None:
    config, _ = _setup(tmp_path, PUSHED)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(SandboxError, match="pack cache"):
        images.pack_image(config, tmp_path / "elsewhere", None)
