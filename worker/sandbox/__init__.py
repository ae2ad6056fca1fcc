"""Sandbox backends behind one small async seam (``base.SandboxBackend``)."""
