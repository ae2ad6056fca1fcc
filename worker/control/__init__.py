"""The control stream ``acpw:{J}:control``: what the control plane tells a running job."""

from worker.control.watch import CANCEL, ControlWatcher, control_fields

__all__ = ["CANCEL", "ControlWatcher", "control_fields"]
