# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH113, PTH118
# ruff: noqa: SIM105
"""The requests the in-guest supervisor performs, one function per ``op``.

Imported by ``guest_supervisor.py`` (builtin modules only, like it), whose loop looks a
request's ``op`` up in :data:`OPS` and calls ``op(supervisor, request id, request)``. An op
answers through ``supervisor.channel`` (at once, or, for ``kill_tree``, once the tree is gone);
an :class:`~.guest_files.OpError` or ``OSError`` it raises is answered by the loop as a failure.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import os
import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .guest_supervisor import Supervisor

if TYPE_CHECKING or __package__:
    from . import guest_files as files
    from .guest_channel import SIGNAL_NUMBERS
    from .guest_members import send
    from .guest_trees import start_tree
else:  # run in the guest: the modules are plain files next to each other
    import guest_files as files
    from guest_channel import SIGNAL_NUMBERS
    from guest_members import send
    from guest_trees import start_tree

OpError = files.OpError


def set_winsize(fd: int, rows: int, cols: int) -> None:
    import fcntl  # only PTY processes need these
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def find_program(cmd: str, env: dict[str, str]) -> str:
    if "/" in cmd:
        return cmd
    for folder in env.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = os.path.join(folder or ".", cmd)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise OpError("spawn", f"{cmd}: command not found")


def op_unknown(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    raise OpError("unknown_op", "unknown operation")


def op_ping(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    sup.channel.reply(rid)


def op_spawn(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    """Start a command under its own reaper, in a new session: pipes (fds stdin, stdout,
    stderr) or, with ``pty``, a pseudo-terminal that becomes its controlling tty (fd: the
    master). Answers the leader's ``pid`` and the ``tree`` id its events name."""
    env = {str(k): str(v) for k, v in msg["env"].items()}
    cmd = str(msg["cmd"])
    argv = [cmd, *[str(a) for a in msg.get("args", [])]]
    program = find_program(cmd, env)
    cwd = str(msg.get("cwd") or "/root")
    pty = msg.get("pty")
    stdio: list[int] | str
    if pty:
        master, slave = os.openpty()
        os.set_inheritable(master, False)
        os.set_inheritable(slave, False)
        set_winsize(master, int(pty.get("rows", 24)), int(pty.get("cols", 80)))
        child_ends, parent_ends, stdio = [slave], [master], os.ttyname(slave)
    else:
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        child_ends = [pipes[0][0], pipes[1][1], pipes[2][1]]
        parent_ends = [pipes[0][1], pipes[1][0], pipes[2][0]]
        stdio = child_ends
    try:
        tree = start_tree(sup.next_tid + 1, program, argv, env, cwd, stdio)
    except BaseException:
        for fd in child_ends + parent_ends:
            os.close(fd)
        raise
    for fd in child_ends:
        os.close(fd)
    sup.next_tid = tree.tid
    sup.trees[tree.tid] = sup.reapers[tree.reaper] = sup.by_fd[tree.fd] = tree
    os.set_blocking(tree.fd, False)
    sup.poller.register(tree.fd, select.EPOLLIN)
    try:
        sup.channel.reply(rid, parent_ends, pid=tree.leader, tree=tree.tid)
    finally:
        for fd in parent_ends:
            os.close(fd)
    sup.feed(tree)  # a quick command's exit may have come with its pid


def op_signal(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    """Signal the leader's process group; with ``tree``, every member of that tree too."""
    sig = SIGNAL_NUMBERS[str(msg["signal"])]
    sent = 0
    try:
        os.killpg(int(msg["pgid"]), sig)
        sent += 1
    except ProcessLookupError:
        pass
    tree = sup.trees.get(int(msg.get("tree") or 0))
    if tree is not None:
        for pid in sup.members(tree):
            send(pid, sig)
            sent += 1
    sup.channel.reply(rid, delivered=sent > 0)


def op_kill_tree(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    """SIGTERM every member; from ``grace_ms`` on, freeze and SIGKILL them each poll until
    the tree is empty, then answer. A tree already gone answers at once."""
    tree = sup.trees.get(int(msg["tree"]))
    if tree is None:
        sup.channel.reply(rid)
        return
    for pid in sup.members(tree):
        send(pid, _signal.SIGTERM)
    deadline = time.monotonic() + max(0, int(msg.get("grace_ms", 1000))) / 1000.0
    tree.deadline = deadline if tree.deadline is None else min(tree.deadline, deadline)
    tree.waiters.append(rid)


def op_freeze(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    sig = _signal.SIGSTOP if msg.get("stop", True) else _signal.SIGCONT
    try:
        os.kill(-1, sig)
    except ProcessLookupError:
        pass
    sup.channel.reply(rid)


def op_open_read(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    fd, size = files.open_for_read(msg.get("path"))
    try:
        sup.channel.reply(rid, [fd], size=size)
    finally:
        os.close(fd)


def op_open_write(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    fd, tmp, target = files.open_for_write(msg.get("path"))
    try:
        sup.channel.reply(rid, [fd], tmp=tmp, target=target)
    finally:
        os.close(fd)


def op_commit(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    files.commit(str(msg["tmp"]), str(msg["target"]))
    sup.channel.reply(rid)


def op_abort(sup: Supervisor, rid: Any, msg: dict[str, Any]) -> None:
    files.abort(str(msg["tmp"]))
    sup.channel.reply(rid)


OPS: dict[str, Callable[[Supervisor, Any, dict[str, Any]], None]] = {
    "ping": op_ping,
    "spawn": op_spawn,
    "signal": op_signal,
    "kill_tree": op_kill_tree,
    "freeze": op_freeze,
    "open_read": op_open_read,
    "open_write": op_open_write,
    "commit": op_commit,
    "abort": op_abort,
}
