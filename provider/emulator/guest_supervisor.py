# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH100, PTH113, PTH118, PTH120
# ruff: noqa: SIM105
"""In-guest supervisor: pid 1 of one sandbox's PID namespace, run by the host's python3.

Standard library only; the emulator never imports it, it copies this file and its two helpers
(``guest_files.py``: file operations, ``guest_trees.py``: one subreaper per command) into its
data dir and bubblewrap binds that folder read-only into the guest. Messages travel over a
SOCK_SEQPACKET unix socket (fd given as argv[1]): requests from the emulator are ``marshal``
dicts (trusted input), replies and events back are JSON (the emulator never unmarshals what the
guest could forge). A request too large for one socket message (a spawn with a large argv)
arrives as ``{"op": "via_fd"}`` with a memfd holding the real request. File descriptors go to
the emulator with SCM_RIGHTS, so process output and file bodies never pass through this
process. Only builtin modules are imported at start: this start-up is on the create path.

Requests carry ``{"id": n, "op": ...}`` and get ``{"id": n, "ok": bool, ...}`` replies; events
(``exit``, ``tree_exit``, naming the ``tree`` id a spawn answered) carry no id. When the
socket closes the supervisor exits, and the kernel kills every process of the namespace with it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import _socket
import errno
import marshal
import os
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

if TYPE_CHECKING or __package__:  # imported by the emulator's tests
    from . import guest_files as files
    from .guest_trees import Tree, descendants, freeze_and_kill, scan, send, start_tree, unowned
else:  # run in the guest as a script: the helpers are bound next to it
    sys.dont_write_bytecode = True  # the folder is read-only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import guest_files as files
    from guest_trees import Tree, descendants, freeze_and_kill, scan, send, start_tree, unowned

OpError = files.OpError
MAX_MSG = 1 << 20
TREE_POLL_S = 0.05
SIGNAL_ALIASES = ("SIGCLD", "SIGPOLL", "SIGIOT")
SIGNAL_NUMBERS = {
    name: getattr(_signal, name)
    for name in dir(_signal)
    if name.startswith("SIG")
    and not name.startswith("SIG_")
    and name not in SIGNAL_ALIASES
    and not name.startswith("SIGRT")
}
SIGNAL_NAMES = {number: name for name, number in SIGNAL_NUMBERS.items()}
SCM_SPACE = _socket.CMSG_SPACE(8 * 4)


def to_json(value: Any) -> str:
    """JSON for the small values replies carry (ASCII only, so any string survives)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        out = ['"']
        for ch in value:
            code = ord(ch)
            if ch in '\\"' or code < 0x20 or code > 0x7E:
                if code > 0xFFFF:
                    code -= 0x10000
                    high, low = 0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)
                    out.append(f"\\u{high:04x}\\u{low:04x}")
                else:
                    out.append(f"\\u{code:04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    raise TypeError(f"cannot encode {type(value).__name__}")


def read_all(fd: int) -> bytes:
    """The whole content of a memfd, from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


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


class Supervisor:
    """One selector loop: control requests, reaper status pipes, reaping and kill rounds."""

    def __init__(self, ctrl: _socket.socket) -> None:
        self.ctrl = ctrl
        self.poller = select.epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.trees: dict[int, Tree] = {}  # tree id -> tree, until its tree_exit is sent
        self.by_fd: dict[int, Tree] = {}  # status pipe -> tree, until the pipe ends
        self.reapers: dict[int, Tree] = {}  # live reaper pid -> its tree
        self.next_tid = 0

    # -- plumbing -------------------------------------------------------------------------
    def send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        data = to_json(msg).encode("ascii")
        if fds:
            raw = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
            self.ctrl.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, raw)])
        else:
            self.ctrl.send(data)

    def reply(self, rid: Any, fds: list[int] | None = None, **fields: Any) -> None:
        self.send({"id": rid, "ok": True, **fields}, fds)

    def fail(self, rid: Any, code: str, message: str) -> None:
        self.send({"id": rid, "ok": False, "error": code, "message": message})

    def run(self) -> None:
        _signal.set_wakeup_fd(self.wake_w)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        self.poller.register(self.ctrl.fileno(), select.EPOLLIN)
        self.poller.register(self.wake_r, select.EPOLLIN)
        self.send({"event": "ready", "pid": os.getpid()})
        while True:
            polling = any(t.detached or t.deadline is not None for t in self.trees.values())
            try:
                ready = self.poller.poll(TREE_POLL_S if polling else -1)
            except InterruptedError:
                ready = []
            for fd, _ in ready:
                if fd == self.wake_r:
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                elif fd in self.by_fd:
                    self.read_status(self.by_fd[fd])
                elif not self.read_ctrl():
                    return
            self.poll_trees()

    def read_ctrl(self) -> bool:
        try:
            data, ancillary, _flags, _addr = self.ctrl.recvmsg(MAX_MSG, SCM_SPACE)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        fds = [
            int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True)
            for _level, _kind, raw in ancillary
            for i in range(0, len(raw) - len(raw) % 4, 4)
        ]
        try:
            if not data:
                return False
            msg = marshal.loads(data)  # noqa: S302 - written by the emulator, never by the guest
            if msg.get("op") == "via_fd" and len(fds) == 1:  # a large request (docstring)
                msg = marshal.loads(read_all(fds[0]))  # noqa: S302 - the emulator's, too
        finally:
            for fd in fds:  # the only fd the emulator sends is a request's memfd
                os.close(fd)
        rid = msg.get("id")
        try:
            getattr(self, "op_" + str(msg.get("op")), self.op_unknown)(rid, msg)
        except OpError as exc:
            self.fail(rid, exc.code, exc.message)
        except OSError as exc:
            self.fail(rid, "os", os.strerror(exc.errno or errno.EIO))
        return True

    # -- trees ----------------------------------------------------------------------------
    def reap(self) -> None:
        """Reap ended reapers, and leaders whose reaper a guest SIGKILLed (pid 1 adopted them)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for tree in self.trees.values():
                if tree.status is None and tree.leader == pid:
                    self.leader_exit(tree, status)

    def read_status(self, tree: Tree) -> None:
        try:
            chunk = os.read(tree.fd, 4096)
        except BlockingIOError:
            return
        if chunk:
            tree.buf += chunk
            self.feed(tree)
            return
        self.poller.unregister(tree.fd)
        os.close(tree.fd)
        del self.by_fd[tree.fd]
        if not tree.finished:  # the reaper was killed: its orphans now belong to pid 1
            tree.detached = True
            self.reapers.pop(tree.reaper, None)

    def feed(self, tree: Tree) -> None:
        for line in tree.lines():
            if line.startswith(b"X") and tree.status is None:
                self.leader_exit(tree, int(line[1:]))
            elif line == b"D":
                self.finish(tree)

    def leader_exit(self, tree: Tree, status: int) -> None:
        tree.status = status
        event: dict[str, Any] = {"event": "exit", "tree": tree.tid}
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            event["signal"] = SIGNAL_NAMES.get(number, f"SIG{number}")
        else:
            event["code"] = os.waitstatus_to_exitcode(status)
        self.send(event)

    def finish(self, tree: Tree) -> None:
        """The tree is empty: report it (after the leader's exit) and answer the kills."""
        if tree.finished:
            return
        tree.finished = True
        if tree.status is None:  # a killed reaper took the leader's status with it
            self.leader_exit(tree, _signal.SIGKILL)
        self.send({"event": "tree_exit", "tree": tree.tid})
        for rid in tree.waiters:
            self.reply(rid)
        del self.trees[tree.tid]
        self.reapers.pop(tree.reaper, None)

    def members(self, tree: Tree) -> list[int]:
        """Live processes of the tree: below its reaper, or unowned once it is detached."""
        if tree.detached:
            return unowned(scan(), set(self.reapers))
        return descendants(tree.reaper, scan())

    def poll_trees(self) -> None:
        now = time.monotonic()
        for tree in list(self.trees.values()):
            if tree.detached and not self.members(tree) and not self.members(tree):
                self.finish(tree)  # empty twice in a row: /proc is not read atomically
            elif tree.deadline is not None and now >= tree.deadline:
                if not tree.detached:
                    send(tree.reaper, _signal.SIGCONT)  # a guest may have stopped it
                freeze_and_kill(self._members_of(tree))

    def _members_of(self, tree: Tree) -> Callable[[], list[int]]:
        def members() -> list[int]:
            return self.members(tree)

        return members

    # -- operations -----------------------------------------------------------------------
    def op_unknown(self, rid: Any, msg: dict[str, Any]) -> None:
        raise OpError("unknown_op", "unknown operation")

    def op_ping(self, rid: Any, msg: dict[str, Any]) -> None:
        self.reply(rid)

    def op_spawn(self, rid: Any, msg: dict[str, Any]) -> None:
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
            tree = start_tree(self.next_tid + 1, program, argv, env, cwd, stdio)
        except BaseException:
            for fd in child_ends + parent_ends:
                os.close(fd)
            raise
        for fd in child_ends:
            os.close(fd)
        self.next_tid = tree.tid
        self.trees[tree.tid] = self.reapers[tree.reaper] = self.by_fd[tree.fd] = tree
        os.set_blocking(tree.fd, False)
        self.poller.register(tree.fd, select.EPOLLIN)
        try:
            self.reply(rid, parent_ends, pid=tree.leader, tree=tree.tid)
        finally:
            for fd in parent_ends:
                os.close(fd)
        self.feed(tree)  # a quick command's exit may have come with its pid

    def op_signal(self, rid: Any, msg: dict[str, Any]) -> None:
        """Signal the leader's process group; with ``tree``, every member of that tree too."""
        sig = SIGNAL_NUMBERS[str(msg["signal"])]
        sent = 0
        try:
            os.killpg(int(msg["pgid"]), sig)
            sent += 1
        except ProcessLookupError:
            pass
        tree = self.trees.get(int(msg.get("tree") or 0))
        if tree is not None:
            for pid in self.members(tree):
                send(pid, sig)
                sent += 1
        self.reply(rid, delivered=sent > 0)

    def op_kill_tree(self, rid: Any, msg: dict[str, Any]) -> None:
        """SIGTERM every member; from ``grace_ms`` on, freeze and SIGKILL them each poll until
        the tree is empty, then answer. A tree already gone answers at once."""
        tree = self.trees.get(int(msg["tree"]))
        if tree is None:
            self.reply(rid)
            return
        for pid in self.members(tree):
            send(pid, _signal.SIGTERM)
        deadline = time.monotonic() + max(0, int(msg.get("grace_ms", 1000))) / 1000.0
        tree.deadline = deadline if tree.deadline is None else min(tree.deadline, deadline)
        tree.waiters.append(rid)

    def op_freeze(self, rid: Any, msg: dict[str, Any]) -> None:
        sig = _signal.SIGSTOP if msg.get("stop", True) else _signal.SIGCONT
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            pass
        self.reply(rid)

    def op_open_read(self, rid: Any, msg: dict[str, Any]) -> None:
        fd, size = files.open_for_read(msg.get("path"))
        try:
            self.reply(rid, [fd], size=size)
        finally:
            os.close(fd)

    def op_open_write(self, rid: Any, msg: dict[str, Any]) -> None:
        fd, tmp, target = files.open_for_write(msg.get("path"))
        try:
            self.reply(rid, [fd], tmp=tmp, target=target)
        finally:
            os.close(fd)

    def op_commit(self, rid: Any, msg: dict[str, Any]) -> None:
        files.commit(str(msg["tmp"]), str(msg["target"]))
        self.reply(rid)

    def op_abort(self, rid: Any, msg: dict[str, Any]) -> None:
        files.abort(str(msg["tmp"]))
        self.reply(rid)


def main() -> None:
    os.umask(0o022)
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)
    ctrl = _socket.socket(fileno=fd)
    ctrl.setblocking(True)
    os.chdir("/")
    Supervisor(ctrl).run()


if __name__ == "__main__":
    main()
