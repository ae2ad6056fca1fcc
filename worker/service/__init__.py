"""What runs a delivered job as a service: the guarded run under a lease, and the reaper."""
