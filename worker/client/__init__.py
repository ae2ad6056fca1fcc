"""The control-plane client (``Client``) and the Celery contract it shares with ``tasks/``."""

from worker.client.client import Client, JobState, StreamEvent, Submission

__all__ = ["Client", "JobState", "StreamEvent", "Submission"]
