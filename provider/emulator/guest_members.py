# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH208, SIM105
"""In-guest tree membership: which processes belong to a tree, and killing them all.

Imported by ``guest_supervisor.py`` and ``guest_ops.py`` (builtin modules only, like them). A
tree (``guest_trees.py``) is every descendant of its reaper; a *detached* tree (its reaper was
SIGKILLed) is every process no live reaper owns. Both are read from one :func:`scan` of
``/proc``, which is not atomic: a process forked during the scan shows up in the next one, so
:func:`freeze_and_kill` stops members until a scan finds no new one before it kills them.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

FREEZE_ROUNDS = 20
Table = dict[int, tuple[int, bool]]  # guest pid -> (parent pid, alive: not a zombie)


def scan() -> Table:
    """Every guest process with its parent (one pass over ``/proc``)."""
    table: Table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2 :].split()
        table[int(name)] = (int(rest[1]), rest[0] not in (b"Z", b"X"))
    return table


def descendants(root: int, table: Table) -> list[int]:
    """Live descendants of ``root`` (itself excluded)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _alive) in table.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    seen = {root}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in seen:  # a pid reused while /proc was read could fake a cycle
            continue
        seen.add(pid)
        if table[pid][1]:
            found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def unowned(table: Table, reapers: set[int]) -> list[int]:
    """Live processes that no reaper in ``reapers`` owns (pid 1 excluded): what detached trees
    left behind. A process whose parent is not in the table counts as owned (never claim a
    process that may belong to a live tree)."""
    owner: dict[int, bool] = dict.fromkeys(reapers, True)
    owner[1] = False
    found: list[int] = []
    for pid, (_parent, alive) in table.items():
        chain: list[int] = []
        node = pid
        while node not in owner:
            entry = table.get(node)
            if entry is None or node in chain:
                owner[node] = True
                break
            chain.append(node)
            node = entry[0]
        verdict = owner[node]
        for member in chain:
            owner[member] = verdict
        if alive and pid != 1 and pid not in reapers and not verdict:
            found.append(pid)
    return found


def send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def freeze_and_kill(members: Callable[[], list[int]]) -> None:
    """SIGSTOP every member until a scan finds no new one (a fork racing the scan shows up in
    the next), then SIGKILL them all. Callers repeat until the tree is gone."""
    stopped: set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        fresh = [pid for pid in members() if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            send(pid, _signal.SIGSTOP)
            stopped.add(pid)
    for pid in stopped:
        send(pid, _signal.SIGKILL)
