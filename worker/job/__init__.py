"""Running one job, from a validated spec to exactly one ``job.completed``.

    validate (caller) → job.accepted → credentials → pack verify (closure held) →
    workspace → sandbox → re-admission → agent → initialize → session/new (+mode/model)
    → session/prompt → settle → teardown

Every failure on the way becomes a typed error in the terminal event; the sandbox and
the agent are torn down whatever happened. The modules, one per part:

- ``pipeline``: ``run_job``, the phase order, cancel and deadline checks between phases.
- ``prepare``: credentials, the pack and its closure hold, workspace, sandbox.
- ``turn``: launch (after admission in the sandbox's view), session, prompt, interrupt.
- ``teardown`` and ``results``: stop, destroy, save the session, capture and upload.
- ``outcome``: how a job settled; ``state``: the context, the shared instruments and
  each phase's result; ``standalone``: a pack's agent in a sandbox outside any job
  (``acp-worker agents probe``).
"""

from worker.job.outcome import JobOutcome
from worker.job.pipeline import run_job

__all__ = ["JobOutcome", "run_job"]
