"""JSON-RPC 2.0 over newline-delimited JSON: the transport ACP runs on (:mod:`worker.rpc.
connection`). Its own package, below both the ACP client and the interaction broker,
which answers agent requests with a :class:`~worker.rpc.connection.Reply`."""
