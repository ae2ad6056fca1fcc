"""Why an agent ended: its exit status or signal as a sandbox reports it, whether the
shutdown caused it, and how a death settles the job (``agent_exited`` with the status,
``oom_killed`` naming the memory bound)."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from worker.acp.agent import AgentProcess
from worker.errors import AgentExited, AgentTimeout, SandboxEvicted
from worker.job.outcome import JobOutcome, after_agent_exit, settled
from worker.sandbox.base import ExitDiagnosis, ended
from worker.sandbox.fake import FakeProcess


@pytest.mark.parametrize(
    ("returncode", "diagnosis"),
    [
        (None, ExitDiagnosis(None, None)),
        (0, ExitDiagnosis(0, None)),
        (3, ExitDiagnosis(3, None)),
        (128, ExitDiagnosis(128, None)),
        (-signal.SIGTERM, ExitDiagnosis(None, "SIGTERM")),  # asyncio's own
        (128 + signal.SIGKILL, ExitDiagnosis(None, "SIGKILL")),  # bwrap's, an init's
        (128 + signal.NSIG, ExitDiagnosis(128 + signal.NSIG, None)),
    ],
)
def test_a_status_is_an_exit_code_or_a_signal(
    returncode: int | None, diagnosis: ExitDiagnosis
) -> None:
    assert ended(returncode) == diagnosis


def test_details_name_exactly_one_of_them() -> None:
    assert ExitDiagnosis(3, None).details() == {"exit_code": 3}
    assert ExitDiagnosis(None, "SIGKILL", oom_killed=True).details() == {"signal": "SIGKILL"}
    assert ExitDiagnosis(None, None).details() == {}


def _died(**details: object) -> JobOutcome:
    error = AgentExited("agent closed its stdout", **details)
    return JobOutcome("failed", None, error, error.exit_code)


def test_an_agent_death_carries_its_status() -> None:
    outcome = after_agent_exit(_died(stderr_preview="boom"), ExitDiagnosis(3, None), memory_mb=512)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.to_dict() == {
        "code": "agent_exited",
        "message": "agent closed its stdout",
        "details": {"stderr_preview": "boom", "exit_code": 3},
    }


def test_an_oom_kill_is_the_jobs_error_naming_the_bound() -> None:
    diagnosis = ExitDiagnosis(None, "SIGKILL", oom_killed=True)
    outcome = after_agent_exit(_died(stderr_preview="x"), diagnosis, memory_mb=64)
    assert outcome.status == "failed"
    assert outcome.exit_code == 1
    assert outcome.error is not None
    assert outcome.error.code == "oom_killed"
    assert isinstance(outcome.error, AgentExited)  # still an agent death to a caller
    assert "limits.memory_mb = 64" in outcome.error.message
    assert outcome.error.details == {"stderr_preview": "x", "signal": "SIGKILL", "memory_mb": 64}


def test_a_sandbox_the_platform_ended_is_the_jobs_error() -> None:
    """The pod was evicted under the agent: that, not the agent's end, failed the job;
    the agent's end stays in the details, the platform's word wins where both speak."""
    evicted = SandboxEvicted("the sandbox pod ended: low on memory", pod="p", reason="Evicted")
    diagnosis = ExitDiagnosis(None, "SIGKILL", sandbox_error=evicted)
    outcome = after_agent_exit(_died(stderr_preview="x", reason="mine"), diagnosis, memory_mb=64)
    assert (outcome.status, outcome.exit_code) == ("failed", evicted.exit_code)
    assert outcome.error is evicted
    assert evicted.to_dict() == {
        "code": "sandbox_evicted",
        "message": "the sandbox pod ended: low on memory",
        "details": {"stderr_preview": "x", "signal": "SIGKILL", "pod": "p", "reason": "Evicted"},
    }


def test_a_diagnosis_without_a_sandbox_error_is_unchanged_by_the_field() -> None:
    assert ExitDiagnosis(3, None) == ExitDiagnosis(3, None, sandbox_error=None)
    assert ExitDiagnosis(3, None).sandbox_error is None


def test_other_outcomes_are_left_alone() -> None:
    diagnosis = ExitDiagnosis(None, "SIGKILL", oom_killed=True)
    succeeded = settled("end_turn")
    assert after_agent_exit(succeeded, diagnosis, memory_mb=64) is succeeded
    timeout = AgentTimeout("no answer")
    hung = JobOutcome("failed", None, timeout, timeout.exit_code)
    assert after_agent_exit(hung, diagnosis, memory_mb=64) is hung
    died = _died()
    assert after_agent_exit(died, None, memory_mb=64) is died
    ended_pod = ExitDiagnosis(None, "SIGKILL", sandbox_error=SandboxEvicted("gone"))
    assert after_agent_exit(succeeded, ended_pod, memory_mb=64) is succeeded


async def _agent(code: str) -> AgentProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    agent = AgentProcess(FakeProcess(proc), line_limit=1 << 16, request_timeout=5, stderr_limit=64)
    agent.start()
    return agent


async def test_an_agent_that_ends_by_itself_is_not_signalled() -> None:
    agent = await _agent("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    await agent.shutdown(eof_grace=30, term_grace=30)
    assert not agent.signalled
    assert await agent.process.exit_diagnosis() == ExitDiagnosis(None, "SIGTERM")


async def test_an_agent_the_shutdown_had_to_signal_says_so() -> None:
    agent = await _agent("import time; time.sleep(60)")  # deaf to stdin EOF
    await agent.shutdown(eof_grace=0.01, term_grace=30)
    assert agent.signalled  # the teardown does not read this status as the agent's own
    assert await agent.process.exit_diagnosis() == ExitDiagnosis(None, "SIGTERM")


async def test_an_agent_deaf_to_eof_and_sigterm_is_killed_after_both_graces() -> None:
    """What bounds the wait for a slow agent after its turn (issue 14): the EOF grace,
    then the SIGTERM grace; never the agent's own exit (this one would take a minute)."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    agent = await _agent(code)
    await asyncio.sleep(0.2)  # let it install its handler
    await agent.shutdown(eof_grace=0.01, term_grace=0.01)
    assert agent.signalled
    assert await agent.process.exit_diagnosis() == ExitDiagnosis(None, "SIGKILL")
