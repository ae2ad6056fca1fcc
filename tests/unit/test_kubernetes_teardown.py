"""The end of a sandbox pod, over stubs of the API (no cluster needed for these): the
copy-out is bounded by the worker's own disk as its bytes arrive, and the pod is
deleted as the API server means deletion: gracefully first, forced only past the grace.
The same against the API double: tests/integration/test_kubernetes_backend.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.errors import WorkerDiskExceeded
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes import backend as backend_module
from worker.sandbox.kubernetes.backend import KubernetesBackend
from worker.sandbox.kubernetes.manifests import TERMINATION_GRACE_S
from worker.sandbox.kubernetes.stream import ERROR, STDOUT
from worker.sandbox.kubernetes.transfer import DiskBudget, get_tree

MIB = 1024 * 1024


class _Socket:
    def shutdown(self) -> None:
        pass


class _Exec:
    """A ``tar -c`` exec that sends ``chunks`` chunks of 256 KiB, then success."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks
        self.sent = 0
        self.closed = False
        self.sock = _Socket()
        self._status = b""

    def is_open(self) -> bool:
        return not self.closed and (self.left > 0 or self._status != b"done")

    def update(self, timeout: float) -> None:
        del timeout

    def read_channel(self, channel: int) -> bytes:
        if channel == STDOUT and self.left > 0:
            self.left -= 1
            self.sent += 1
            return b"\0" * (256 * 1024)
        if channel == ERROR and self.left == 0 and self._status != b"done":
            self._status = b"done"
            return json.dumps({"status": "Success"}).encode()
        return b""

    def close(self) -> None:
        self.closed = True


class _Api:
    #: The exec side's deadlines and ping period (``PodApi``'s), long enough not to matter.
    exec_timeout_s = copy_timeout_s = 60.0
    ping_s = 5.0

    def __init__(self, ws: _Exec) -> None:
        self.ws = ws

    def exec(self, *args: Any, **kwargs: Any) -> _Exec:
        return self.ws


def test_a_copy_out_past_the_workers_disk_bound_is_refused_as_it_arrives(
    tmp_path: Path,
) -> None:
    """The bound is the worker's (every copy-out of the process together), not the
    pod's: with 1 MiB already held by another job's copy-out, a 3 MiB archive is
    refused once it passes the 2 MiB left, before the rest is read, and what it took
    is given back."""
    target = tmp_path / "ws"
    target.mkdir()
    (target / "kept").write_text("the host's workspace stays as it was")
    budget = DiskBudget(3 * MIB)
    budget.take(1 * MIB)  # another job's copy-out, in flight
    ws = _Exec(chunks=12)
    with pytest.raises(WorkerDiskExceeded) as refused:
        get_tree(_Api(ws), "pod", "agent", "/workspace", target,  # type: ignore[arg-type]
                 max_bytes=10 * MIB, owner=None, budget=budget)  # fmt: skip
    assert refused.value.code == "worker_disk_exceeded"
    assert refused.value.details["bound"] == 3 * MIB
    assert ws.sent == 9  # refused with 2.25 MiB arrived: the rest unread
    assert ws.left == 3
    assert ws.closed
    assert budget.used == 1 * MIB  # only the other copy-out's
    assert (target / "kept").read_text() == "the host's workspace stays as it was"
    # Nothing spooled is left beside the workspace (nor anywhere else).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]


def test_the_spool_is_on_the_state_volume_not_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive is spooled next to its target (the worker's state volume), never in
    ``/tmp`` (a small emptyDir of the worker pod)."""
    import tempfile

    made: list[str | None] = []
    real = tempfile.TemporaryFile

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(None if kwargs.get("dir") is None else str(kwargs["dir"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", spy)
    target = tmp_path / "job" / "ws"
    target.mkdir(parents=True)
    budget = DiskBudget(10 * MIB)
    # 256 KiB of zeros: an empty archive (end-of-archive blocks).
    get_tree(_Api(_Exec(chunks=1)), "pod", "agent", "/workspace", target,  # type: ignore[arg-type]
             max_bytes=10 * MIB, owner=None, budget=budget)  # fmt: skip
    assert made == [str(tmp_path / "job")]
    assert budget.used == 0


class _Deleting:
    """A PodApi whose pod is gone after a graceful delete only when ``gone`` says."""

    def __init__(self, *, gone_after_grace: bool) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gone_after_grace = gone_after_grace
        self.forced = False

    def delete_pod(self, name: str, *, grace_s: int) -> bool:
        self.calls.append(("delete", grace_s))
        self.forced = self.forced or grace_s == 0
        return True

    def wait_gone(self, name: str, timeout_s: float) -> bool:
        self.calls.append(("wait_gone", timeout_s))
        return self.gone_after_grace or self.forced


def _backend(api: _Deleting) -> KubernetesBackend:
    return KubernetesBackend(KubernetesConfig(k8s_start_timeout_s=7), api=api)  # type: ignore[arg-type]


def test_a_pod_is_deleted_with_its_grace_and_confirmed_gone() -> None:
    api = _Deleting(gone_after_grace=True)
    assert _backend(api)._remove("acpw-j-1-abc")
    margin = backend_module.DELETE_MARGIN_S
    assert api.calls == [
        ("delete", TERMINATION_GRACE_S),
        ("wait_gone", TERMINATION_GRACE_S + margin),
    ]


def test_a_pod_still_there_past_its_grace_is_forced() -> None:
    """A kubelet that does not stop the pod (a lost node) leaves it terminating: only
    then is it deleted with grace 0, and that too confirmed."""
    api = _Deleting(gone_after_grace=False)
    assert _backend(api)._remove("acpw-j-1-abc")
    margin = backend_module.DELETE_MARGIN_S
    assert api.calls == [
        ("delete", TERMINATION_GRACE_S),
        ("wait_gone", TERMINATION_GRACE_S + margin),
        ("delete", 0),
        ("wait_gone", 7),
    ]
