"""Every read and write of a job's Redis keys: key names (``keys``), the state hash's
field names (``fields``) and its typed view (``state``), leases and their owner
(``lease``, ``owner``), the Lua programs (``scripts``, ``lua/``), the fenced event sink
(``fenced``), the control stream (``control``), interaction records (``interactions``),
the control plane's synchronous reads and writes (``jobs``), the default Redis
(``url``) and every connection to it (``connect``).

The layer below the runner and the service: it imports nothing of ``worker`` but
``errors``, ``settings``, ``jobs`` and ``events.models``.
"""
