"""The operator's side of the attach helper: terminal size, raw mode and status lines.

Standard library only. Status lines go to stderr and end in CR LF, so they read the same in raw
mode (no output post-processing) and in cooked mode. Nothing here ever sees the API key.
"""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Iterator
from typing import Final

DEFAULT_SIZE: Final = (24, 80)
"""(rows, cols) when neither stdin nor stdout is a terminal that knows its size."""
MAX_SIDE: Final = 1000
"""The largest PTY side the API accepts (docs/protocol.md C8.6); larger terminals are clamped."""
STATUS_PREFIX: Final = "provider shell: "


def terminal_size(*fds: int) -> tuple[int, int]:
    """(rows, cols) of the first of ``fds`` that is a terminal with a size (TIOCGWINSZ), each
    side clamped to 1..:data:`MAX_SIDE`; :data:`DEFAULT_SIZE` when none is."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except (OSError, ValueError):
            continue
        if size.lines > 0 and size.columns > 0:
            return min(size.lines, MAX_SIDE), min(size.columns, MAX_SIDE)
    return DEFAULT_SIZE


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[bool]:
    """Put the terminal on ``fd`` in raw mode for the block (yields whether it did) and put
    its saved attributes back on every way out, exceptions and cancellation included.

    Raw mode passes every byte through (Ctrl-C, Ctrl-D and Ctrl-Z go to the remote shell, not
    to this process) and stops local echo and output processing; the remote terminal does both.
    Keys typed before the switch are kept; keys typed but not read by the end are discarded
    (``TCSAFLUSH``), so they never reach the local shell. Not a terminal: nothing changes.
    """
    try:
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError):
        yield False
        return
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield True
    finally:
        # The terminal may be gone already (hang-up): then there is nothing to restore.
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def write_status(message: str, *, fd: int = 2) -> None:
    """One status line on ``fd`` (stderr); a leading newline in ``message`` first ends the
    current line. A closed or hung-up terminal is not an error."""
    text = message.lstrip("\n")
    lead = "\r\n" if len(text) < len(message) else ""
    line = f"{lead}{STATUS_PREFIX}{text}\r\n".encode(errors="replace")
    with contextlib.suppress(OSError):
        while line:
            written = os.write(fd, line)
            line = line[written:]


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (blocking; run it in a worker thread)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
