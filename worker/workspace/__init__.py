"""Preparing a job's workspace on the worker host (the sources: local for now)."""
