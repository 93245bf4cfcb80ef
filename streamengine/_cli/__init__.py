"""The ``streamengine`` command: ``main`` (commands), ``build`` (flags to objects), ``chat``, ``output``, ``demo``."""
