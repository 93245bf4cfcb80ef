"""The HTTP boundary every client shares: transport, connections, body reading, SSE reading, errors, request options."""
