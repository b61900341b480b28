# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: SIM105
"""In-guest process trees: one subreaper per command the supervisor starts.

Imported by ``guest_supervisor.py`` (builtin modules only, plus ``ctypes`` for ``prctl``, loaded
at the first spawn). For every command the supervisor (pid 1) forks a *reaper*: a copy of
itself that marks itself ``PR_SET_CHILD_SUBREAPER``, forks the leader (new session, its stdio,
then ``execve``) and then only reaps. The kernel re-parents an orphan to its nearest subreaper
ancestor, so every descendant of the leader (double-forked, ``setsid``, ``setpgid``, ``nohup``)
stays below its reaper: the tree is "every descendant of the reaper", and "the reaper has no
child left" is exactly "the tree is empty". Nothing is ever attributed by session or group.

A reaper reports on a pipe, one line each: ``P<leader pid>`` (the leader is held until then),
``S`` once it runs the program (or ``E<code> <message>`` when it could not start it),
``X<wait status>`` when the leader exits and ``D`` when its last child is gone, then it exits.
It ignores every catchable signal, so a guest ``kill -TERM -1`` or ``pkill`` cannot cut a tree
loose; if a guest SIGKILLs a reaper anyway (the pipe ends without ``D``), the tree is
*detached*: its members are then the processes that no live reaper owns (they were re-parented
to pid 1), which only such trees can leave behind. Finding a tree's members and killing them is
``guest_members.py``.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING or __package__:
    from .guest_files import OpError
else:  # run in the guest: the modules are plain files next to each other
    from guest_files import OpError

PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
REAPER_NAME = b"createos-reaper"
REAPER_IGNORES = tuple(
    getattr(_signal, name)
    for name in (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGIO",
    )
)
# The leader starts with default dispositions: ignored signals would survive its exec.
LEADER_SIGDEF = (_signal.SIGCHLD, *REAPER_IGNORES)

_libc: Any = None


def load_libc() -> None:
    """Load libc for ``prctl`` (once, in the supervisor, so reapers inherit it)."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int | bytes) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        import ctypes

        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


class Tree:
    """The supervisor's record of one spawned command: its reaper, leader and status pipe."""

    __slots__ = (
        "buf",
        "deadline",
        "detached",
        "fd",
        "finished",
        "leader",
        "reaper",
        "status",
        "tid",
        "waiters",
    )

    def __init__(self, tid: int, reaper: int, fd: int) -> None:
        self.tid = tid
        self.reaper = reaper
        self.fd = fd
        self.leader = 0
        self.buf = b""
        self.status: int | None = None  # the leader's wait status, once reaped
        self.finished = False  # tree_exit sent
        self.detached = False  # the reaper died before its tree did
        self.deadline: float | None = None  # SIGKILL rounds start then (a DELETE is pending)
        self.waiters: list[Any] = []  # kill_tree requests answered when the tree is gone

    def lines(self) -> list[bytes]:
        """Complete status lines received so far (the rest stays buffered)."""
        *done, self.buf = self.buf.split(b"\n")
        return done


def start_tree(
    tid: int, program: str, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int] | str
) -> Tree:
    """Fork a reaper that starts ``program``; answer once the leader runs (``tree.leader``).

    ``stdio``: three fds for the leader's 0, 1 and 2, or the path of a PTY slave it opens as
    its controlling terminal. Status lines read along with the start stay in ``tree.buf``. A
    leader that cannot start raises :class:`OpError` (``cwd`` or ``spawn``); that reaper exits
    on its own.
    """
    load_libc()
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:
        try:
            _reaper_main(w, program, argv, env, cwd, stdio)
        finally:
            os._exit(127)
    os.close(w)
    tree = Tree(tid, pid, r)
    while True:
        line, found, rest = tree.buf.partition(b"\n")
        if found and line.startswith(b"P"):  # the leader's pid: it waits for the next line
            tree.leader, tree.buf = int(line[1:]), rest
            continue
        chunk = b"" if found else os.read(r, 4096)
        if chunk:
            tree.buf += chunk
            continue
        if found and line == b"S":
            tree.buf = rest
            return tree
        if tree.leader and not found:  # the reaper was killed once the leader was known
            return tree
        os.close(r)
        head = line.decode("utf-8", "replace") if found else "Espawn the reaper died"
        code, _, message = head[1:].partition(" ")
        raise OpError(code or "spawn", message)


def _reaper_main(
    w: int, program: str, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int] | str
) -> None:
    """The reaper's whole life, in the forked child (the caller exits when this returns).

    The leader is forked *gated*: it runs only once its pid is on the pipe, so even a leader
    that SIGKILLs its reaper at once is known to the supervisor (a reaper killed before it
    announced the pid takes its gated child with it: that child sees EOF and exits).
    """
    _signal.set_wakeup_fd(-1)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    for number in REAPER_IGNORES:
        _signal.signal(number, _signal.SIG_IGN)
    low = 3  # close every fd the supervisor had but ours (close_range: no /proc walk)
    for fd in sorted({w, *(stdio if isinstance(stdio, list) else ())}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))  # the supervisor never lowers RLIMIT_NOFILE

    def say(line: str) -> None:
        try:
            os.write(w, line.replace("\n", " ").encode("utf-8", "replace") + b"\n")
        except OSError:
            pass

    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_NAME, REAPER_NAME)
    except OSError as exc:
        say(f"Espawn cannot become a subreaper: {exc.strerror}")
        return
    try:
        os.chdir(cwd)
    except OSError:
        say(f"Ecwd cannot use {cwd} as working directory")
        return
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    try:
        leader = os.fork()
    except OSError as exc:
        say(f"Espawn {argv[0]}: {os.strerror(exc.errno or errno.EIO)}")
        return
    if leader == 0:
        try:
            os.close(gate_w)
            os.close(errors_r)
            if os.read(gate_r, 1) == b"g":
                _exec_leader(program, argv, env, stdio)
        except Exception as exc:  # a NUL byte in argv or env is a ValueError
            number = exc.errno if isinstance(exc, OSError) else None
            try:
                os.write(errors_w, str(number or errno.EINVAL).encode())
            except OSError:
                pass
        finally:
            os._exit(127)
    os.close(gate_r)
    os.close(errors_w)
    say(f"P{leader}")
    os.write(gate_w, b"g")
    os.close(gate_w)
    failure = os.read(errors_r, 32)  # EOF: the exec worked (the pipe is close-on-exec)
    os.close(errors_r)
    for fd in stdio if isinstance(stdio, list) else ():
        os.close(fd)
    if failure:
        say(f"Espawn {argv[0]}: {os.strerror(int(failure))}")
        os.waitpid(leader, 0)
        return
    say("S")
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == leader:
            say(f"X{status}")
    say("D")
    os._exit(0)


def _exec_leader(
    program: str, argv: list[str], env: dict[str, str], stdio: list[int] | str
) -> None:
    """In the leader's child: new session, default signals, stdio, then the program."""
    for number in LEADER_SIGDEF:
        _signal.signal(number, _signal.SIG_DFL)
    os.setsid()
    if isinstance(stdio, str):  # opened after setsid: it becomes the controlling terminal
        tty = os.open(stdio, os.O_RDWR)
        stdio = [tty, tty, tty]
    for target, fd in enumerate(stdio):
        if fd != target:
            os.dup2(fd, target)
    os.execve(program, argv, env)  # noqa: S606 - argv from the API, never through a shell
