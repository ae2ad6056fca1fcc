"""Every read and write of a job's Redis keys: key names, leases and their owner, the Lua
programs, the fenced event sink, the control stream and interaction records."""
