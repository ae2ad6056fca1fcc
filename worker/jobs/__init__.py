"""Job spec (the control plane's input) and job statuses."""
