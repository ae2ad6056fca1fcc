"""The control-plane client (``Client``) and the Celery contract it shares with ``tasks/``."""

from worker.client.client import Client, Requeue, StreamEvent, Submission
from worker.store.state import JobState

__all__ = ["Client", "JobState", "Requeue", "StreamEvent", "Submission"]
