"""Who recorded a journal entry, and whether that worker still runs.

Every :mod:`provider.driver.core.journal` entry carries an *owner* ``<pid>:<start time>:<boot id>``
(:func:`current_owner`). Recovery cleans up after an owner that is gone (:func:`owner_alive`):
a pid alone would not do, since pids are reused and count again from zero after a reboot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ABANDONED = "abandoned-until:"
"""Owner prefix of a create handed to recovery (``LeaseJournal.abandon_create``)."""

DEAD_STATES = frozenset("ZXx")
"""Process states of /proc/<pid>/stat that mean the process has ended: ``Z`` a zombie (exited,
not reaped yet by its parent), ``X`` dead (``x`` on Linux 2.6.33 to 3.13)."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that liveness needs."""

    state: str
    start_time: str
    """Field 22, ``starttime``: clock ticks from boot to the process's start (decimal text)."""


def parse_proc_stat(text: str) -> ProcStat | None:
    """Parse a ``/proc/<pid>/stat`` line; None when malformed.

    The line is ``pid (comm) state ppid ...``; ``comm`` (up to 15 bytes of the program name) may
    hold spaces and parentheses, so it ends at the *last* ``)``.
    """
    head, paren, tail = text.rpartition(")")
    if not paren or "(" not in head:
        return None
    fields = tail.split()  # fields[0] is field 3 (state), fields[19] is field 22 (starttime)
    if len(fields) < 20 or len(fields[0]) != 1 or not _is_decimal(fields[19]):
        return None
    return ProcStat(state=fields[0], start_time=fields[19])


def _boot_id() -> str | None:
    """The kernel's boot id (a fresh UUID at every boot); None where Linux does not offer it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return boot if boot and ":" not in boot else None


def _proc_usable() -> bool:
    return Path("/proc/self/stat").exists()


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` exists, for systems without /proc (no zombie or pid-reuse check there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, run by another user
    except (OSError, OverflowError):
        return False
    return True


def _is_decimal(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20


@dataclass(frozen=True)
class Owner:
    """A parsed owner string (see :func:`current_owner`)."""

    pid: int
    start_time: str | None
    """``starttime`` of ``/proc/<pid>/stat``; None when unknown (not recorded)."""
    boot_id: str | None
    """Kernel boot id at recording; None when unknown or in the legacy format."""


def current_owner() -> str:
    """This process as an owner: ``<pid>:<start time>:<boot id>``.

    The start time (clock ticks since boot, /proc/<pid>/stat field 22) tells this process from a
    later one given the same pid; the boot id tells this boot from a later one, where pids and
    start times count again from zero. A field Linux does not give (no /proc) is left empty.
    Databases written before boot ids were recorded hold ``<pid>:<start time>`` (or
    ``<pid>:None``); :func:`parse_owner` reads both.
    """
    pid = os.getpid()
    try:
        stat = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text(errors="replace"))
    except OSError:
        stat = None
    return f"{pid}:{stat.start_time if stat else ''}:{_boot_id() or ''}"


def parse_owner(owner: str) -> Owner | None:
    """Read an owner string; None when malformed.

    Accepted: ``<pid>:<start>:<boot>[:...]`` (fields after the third are ignored, so a later
    version may append some) and the legacy ``<pid>:<start>``. An empty start or boot field, or
    the legacy ``None`` start, means unknown. The pid must be a positive decimal number and a
    known start time a decimal number.
    """
    parts = owner.split(":")
    if len(parts) < 2 or not _is_decimal(parts[0]) or len(parts[0]) > 10 or int(parts[0]) <= 0:
        return None  # pids stay below 2**22 (Linux pid_max); 10 digits keeps int() cheap
    start = None if parts[1] in ("", "None") else parts[1]
    if start is not None and not _is_decimal(start):
        return None
    boot = parts[2] if len(parts) >= 3 and parts[2] else None
    return Owner(pid=int(parts[0]), start_time=start, boot_id=boot)


def owner_alive(owner: str) -> bool:
    """Whether the worker that recorded ``owner`` still runs.

    Dead: an abandoned create's marker; a malformed owner (no worker writes one); a boot id other
    than the current one (recorded before a reboot); no ``/proc/<pid>`` entry; a zombie or dead
    process there (``Z``/``X``: a SIGKILLed worker whose parent has not reaped it yet); a start
    time other than the recorded one (the pid now belongs to another process).

    Where the record cannot tell, the owner counts as alive, since treating a live worker as dead
    would kill the command it is running while a wrong "alive" only delays a cleanup: a legacy
    owner without boot id is judged by pid, state and start time alone (a pid and start tick both
    repeating after a reboot is the remaining, unlikely, gap); an owner without start time by
    pid and state; and without /proc (not Linux) a pid that exists is alive.
    """
    if owner.startswith(ABANDONED):
        return False  # handed to recovery (LeaseJournal.abandon_create)
    parsed = parse_owner(owner)
    if parsed is None:
        return False
    if parsed.boot_id is not None:
        boot = _boot_id()
        if boot is not None and boot != parsed.boot_id:
            return False  # recorded before a reboot
    try:
        text = Path(f"/proc/{parsed.pid}/stat").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return not _proc_usable() and _pid_exists(parsed.pid)  # no such process, or no /proc
    except OSError:
        return _pid_exists(parsed.pid)  # there but unreadable (hidepid=1): judge by existence
    stat = parse_proc_stat(text)
    if stat is None:
        return _pid_exists(parsed.pid)
    if stat.state in DEAD_STATES:
        return False
    return parsed.start_time is None or parsed.start_time == stat.start_time
