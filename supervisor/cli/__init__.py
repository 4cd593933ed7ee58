"""The ``duplex-supervisor`` command: serve, chaos, demo, and the processes they start.

Internal: the command is the interface (``duplex-supervisor --help``).
"""
