"""Ending a subprocess a test started: nothing of it outlives the test, not even a pipe."""

from __future__ import annotations

import subprocess
from typing import Any


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs, wait for it and close every pipe to it."""
    with proc:  # on leaving: closes stdout, stderr and stdin, then waits
        if proc.poll() is None:
            proc.kill()
