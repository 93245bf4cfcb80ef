"""One run: the engine (``run``), its rounds, tool dispatch, continuation, events and result."""
