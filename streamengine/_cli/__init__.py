"""The ``streamengine`` command: ``main`` (commands), ``build`` (flags to objects), ``chat``, ``output``,
``log``, ``demo``.
"""
