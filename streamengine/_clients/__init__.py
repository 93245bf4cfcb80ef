"""Provider clients: the boundary where HTTP and third-party errors become ours.

``base`` (the client protocol), ``http/`` (shared transport), one module per
wire (``openai``, ``responses``, ``anthropic``), ``routed`` (a client per model prefix) and
``scripted`` (no network).  The clients are exported from :mod:`streamengine`.
"""
