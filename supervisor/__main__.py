"""``python -m supervisor``: the ``duplex-supervisor`` command."""

from __future__ import annotations

import sys

from supervisor.cli._commands import main

if __name__ == "__main__":
    sys.exit(main())
