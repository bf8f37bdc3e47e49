"""How long the storms run: a bounded budget by default, the long one on a flag.

The storms (workers and a trainer killed over and over, writers racing a reader) find
more the longer they run, but the developer loop and CI need them bounded. By default
they run a budget that still goes through every kind of fault; `ARTSTORE_LONG=1` runs the
long version (docs/contributing.md, "Running the tests").
"""

from __future__ import annotations

import os

LONG = os.environ.get("ARTSTORE_LONG", "") not in ("", "0")


def budget(bounded: int, long: int) -> int:
    """`long` under ARTSTORE_LONG=1, else `bounded`."""
    return long if LONG else bounded
