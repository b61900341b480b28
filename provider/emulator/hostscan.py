"""Host-side view of sandbox processes: every host pid living in a given PID namespace.

Used for leak checks (the admin state view, the test fixture), to make sure a destroyed
sandbox's namespace is really empty, and to describe a PTY's foreground job as the guest sees
it. Reads ``/proc/<pid>/ns/pid``, ``/proc/<pid>/status`` and ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class HostProcess:
    host_pid: int
    guest_pid: int
    guest_sid: int
    state: str


def _last_field(status: str, name: str) -> int | None:
    for line in status.splitlines():
        if line.startswith(name + ":"):
            parts = line.split()
            return int(parts[-1]) if len(parts) > 1 else None
    return None


def boot_ticks() -> float:
    """Now, in the unit of ``/proc/<pid>/stat`` start times (clock ticks since boot)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) * TICKS


def _start_ticks(entry: Path) -> float:
    raw = (entry / "stat").read_bytes()
    return float(raw[raw.rfind(b")") + 2 :].split()[19])


def scan_host(namespaces: Mapping[str, float | None]) -> dict[str, list[HostProcess]]:
    """Every host process living in one of ``namespaces`` (pid-namespace link strings).

    Each namespace maps to the boot-tick time it was torn down (None while in use): a process
    that started later lives in a new namespace that reused the inode number, not in ours.
    """
    found: dict[str, list[HostProcess]] = {}
    if not namespaces:
        return found
    for entry in Path("/proc").iterdir():
        name = entry.name
        if not name.isdigit():
            continue
        try:
            ns = str((entry / "ns" / "pid").readlink())
            if ns not in namespaces:
                continue
            status = (entry / "status").read_text()
            ended = namespaces[ns]
            if ended is not None and _start_ticks(entry) > ended + 1:
                continue
        except (OSError, ValueError, IndexError):
            continue
        guest_pid = _last_field(status, "NSpid")
        guest_sid = _last_field(status, "NSsid")
        state_line = re.search(r"^State:\s+(\S)", status, re.M)
        state = state_line.group(1) if state_line else "?"
        if guest_pid is None or state in ("Z", "X"):
            continue
        found.setdefault(ns, []).append(
            HostProcess(int(name), guest_pid, guest_sid if guest_sid is not None else -1, state)
        )
    return found


def guest_command(host_pid: int) -> dict[str, Any] | None:
    """``{pid, cmd, args}`` of a host process as its sandbox sees it (its pid in the innermost
    PID namespace, its argv split into the command and the rest), or None once it is gone."""
    entry = Path(f"/proc/{host_pid}")
    try:
        guest_pid = _last_field((entry / "status").read_text(), "NSpid")
        argv = (entry / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if argv and not argv[-1]:
        argv.pop()  # the terminating NUL
    if guest_pid is None or not argv:  # gone, or a zombie (empty cmdline)
        return None
    words = [word.decode("utf-8", "replace") for word in argv]
    return {"pid": guest_pid, "cmd": words[0], "args": words[1:]}
