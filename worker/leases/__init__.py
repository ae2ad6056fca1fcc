"""Job leases with fencing tokens, the guarded run of a delivered job, and the reaper."""

from worker.leases.lease import Heartbeat, Lease, Refusal, acquire, release, renew

__all__ = ["Heartbeat", "Lease", "Refusal", "acquire", "release", "renew"]
