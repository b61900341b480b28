"""Process facts read from ``/proc`` (Linux): liveness, children, command lines.

For the dev tools and tests that watch the real worker manager's processes (the shim, the
Python worker behind it) without signalling them.
"""

from __future__ import annotations

from pathlib import Path

import anyio


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # fields after "pid (comm)": state, ppid, ...


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def child_pids(pid: int) -> list[int]:
    """Live children of ``pid`` (scans /proc)."""
    children: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[1] == str(pid) and fields[0] not in ("Z", "X"):
            children.append(int(entry.name))
    return sorted(children)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


async def wait_until_gone(pid: int, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll until ``pid`` is gone; False if it still lives after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while pid_alive(pid):  # noqa: ASYNC110 - a process's death has no event to await here
            await anyio.sleep(poll_s)
        return True
    return not pid_alive(pid)
