"""Celery intake (thin, sync layer over ``worker.runner``). Built by the job-service issue."""
