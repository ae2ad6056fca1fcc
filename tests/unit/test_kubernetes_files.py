"""What the file helper in a sandbox pod answers is untrusted (the pod is the agent's):
an answer out of protocol is the path's refusal, never a crash, a wrong size or text
taken on trust. The helper itself runs in a real pod: integration/test_kubernetes_files.py."""

from __future__ import annotations

from typing import Any

import pytest

from worker.errors import SandboxError
from worker.events.artifacts import Verdict
from worker.sandbox.files import PathRefused
from worker.sandbox.kubernetes import files as k8s_files


class Answering(k8s_files.KubernetesWorkspaceFiles):
    """The helper's answer fixed: what a pod could send, whatever it was asked."""

    def __init__(self, answer: bytes) -> None:
        super().__init__(api=None, pod="p", container="c")  # type: ignore[arg-type]
        self.answer = answer
        self.asked: list[tuple[str, int, list[str], int, bytes | None]] = []

    def _exchange_now(
        self, op: str, limit: int, rels: list[str], bound: int, data: bytes | None
    ) -> bytes:
        self.asked.append((op, limit, rels, bound, data))
        return self.answer


@pytest.mark.parametrize(
    "line",
    [b"", b"ok", b"ok -1", b"ok 1e3", b"ok \xd9\xa3", b"no", b"no such_reason", b"yes 3"],
)
def test_an_answer_out_of_protocol_is_a_typed_error(line: bytes) -> None:
    with pytest.raises(SandboxError):
        k8s_files._answer(line)


def test_answers_in_protocol() -> None:
    assert k8s_files._answer(b"ok 12") == ("ok", 12)
    assert k8s_files._answer(b"no symlink") == ("symlink", 0)
    assert k8s_files._lines(b"ok 1\nno missing\n", 2) == [b"ok 1", b"no missing"]
    for out in (b"ok 1\n", b"ok 1\nok 2\nok 3\n", b"ok 1\nok 2"):
        with pytest.raises(SandboxError):
            k8s_files._lines(out, 2)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"ok 5\nabc", "unreadable"),  # fewer bytes than it claims
        (b"ok 20\n" + b"x" * 20, "unreadable"),  # over the limit it was given
        (b"no such\n", "unreadable"),
        (b"no too_large\n", "too_large"),
    ],
)
async def test_a_read_takes_nothing_on_trust(answer: bytes, reason: str) -> None:
    files = Answering(answer)
    with pytest.raises(PathRefused) as refused:
        await files.read_text("/workspace/a.txt", limit=10)
    assert refused.value.reason == reason
    assert files.asked == [("read", 10, ["a.txt"], 64 + 10, None)]


async def test_a_write_and_lookups_out_of_protocol_are_refusals() -> None:
    files = Answering(b"ok 1\nok 2\n")
    with pytest.raises(PathRefused, match="not_writable"):
        await files.write_text("a.txt", "é")
    assert files.asked[-1][4] == "é".encode()
    await files.look_up(["a.txt", "b.txt", "c.txt", "../x", "a.txt"])
    assert files.asked[-1][:3] == ("look", 0, ["a.txt", "b.txt", "c.txt"])
    assert {files.artifact(p).reason for p in ("a.txt", "b.txt", "c.txt")} == {"unreadable"}
    files.answer = b"ok 7\n"
    await files.write_text("a.txt", "content")  # known at once: no lookup needed
    assert files.artifact("a.txt") == Verdict(relative="a.txt", size=7)


def test_artifact_outside_an_event_loop_is_refused_not_raised() -> None:
    files: Any = Answering(b"")
    assert files.artifact("a.txt") == Verdict(reason="workspace_not_reachable")
    assert files.artifact("../a") == Verdict(reason="traversal")


class _BrokenStream:
    """An exec stream that breaks once used (a pod gone mid-way); closes cleanly."""

    def __init__(self) -> None:
        self.sock = self
        self.closed = False

    def write_channel(self, channel: int, data: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def is_open(self) -> bool:
        raise ConnectionResetError(104, "Connection reset by peer")

    def close(self) -> None:
        self.closed = True

    def shutdown(self) -> None:
        pass


class _Api:
    exec_timeout_s = ping_s = 5.0

    def __init__(self) -> None:
        self.streams: list[_BrokenStream] = []

    def exec(
        self, name: str, container: str, command: list[str], *, stdin: bool, timeout_s: float
    ) -> Any:
        self.streams.append(_BrokenStream())
        return self.streams[-1]


async def test_a_stream_that_breaks_is_the_paths_refusal_and_is_closed() -> None:
    api = _Api()
    files = k8s_files.KubernetesWorkspaceFiles(api, "p", "c")  # type: ignore[arg-type]
    with pytest.raises(PathRefused, match="not_writable"):
        await files.write_text("a.txt", "x")
    with pytest.raises(PathRefused, match="unreadable"):
        await files.read_text("a.txt", limit=1)
    await files.look_up(["a.txt"])
    assert files.artifact("a.txt") == Verdict(reason="unreadable")
    assert [s.closed for s in api.streams] == [True, True, True]
