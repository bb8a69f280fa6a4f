"""Command line: ``python -m healthkit {demo,doctor,explain}`` (also the ``healthkit`` script)."""

from __future__ import annotations

import sys

from healthkit._tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
