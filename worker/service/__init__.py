"""What runs a delivered job as a service: owning a job's lease (``ownership``, also used
by ``acp-worker run --redis``), the guarded run of a Celery delivery (``guarded``) and the
reaper (``reaper``). Above the runner and the store; never imports the CLI."""
