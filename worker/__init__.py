"""acp-worker: runs ACP coding agents in isolated sandboxes for a control plane."""

__version__ = "0.1.0"
