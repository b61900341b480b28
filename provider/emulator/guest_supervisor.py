# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH103, PTH104, PTH108, PTH112, PTH113, PTH115, PTH118, PTH119, PTH120, PTH208
# ruff: noqa: SIM105
"""In-guest supervisor: pid 1 of one sandbox's PID namespace, run by the host's python3.

Standard library only; the emulator never imports it, it copies the file into its data dir and
bubblewrap binds it read-only into the guest. Messages travel over a SOCK_SEQPACKET unix socket
(fd given as argv[1]): requests from the emulator are ``marshal`` dicts (trusted input), replies
and events back are JSON (the emulator never unmarshals what the guest could forge). File
descriptors go to the emulator with SCM_RIGHTS, so process output and file bodies never pass
through this process. Only builtin modules are imported: this start-up is on the create path.

Requests carry ``{"id": n, "op": ...}`` and get ``{"id": n, "ok": bool, ...}`` replies; events
(``exit``, ``tree_exit``) carry no id. When the socket closes the supervisor exits, and the
kernel kills every process of the namespace with it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import _socket
import errno
import marshal
import os
import select
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ROOTS = ("/paperclip-workspace", "/tmp", "/root")
MAX_MSG = 1 << 20
TREE_POLL_S = 0.05
SIGNALS_RESET = (_signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT, _signal.SIGTERM)
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


class OpError(Exception):
    """A request that cannot be performed; ``code`` is a short machine word."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a guest process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    return rest[0].decode(), int(rest[3])


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``, the supervisor excluded."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        fields = _stat_fields(int(name))
        if fields is not None and fields[1] == sid and fields[0] not in ("Z", "X"):
            members.append(int(name))
    return members


def _inside_roots(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in ROOTS)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def check_path(path: Any) -> str:
    """Resolve an API path in the guest view; it must land inside the writable trees."""
    if not isinstance(path, str) or not path:
        raise OpError("invalid", "path is required")
    if "\x00" in path:
        raise OpError("invalid", "path contains a NUL byte")
    if not path.startswith("/"):
        raise OpError("relative", "path must be absolute")
    real = os.path.realpath(path)
    if not _inside_roots(real):
        raise OpError("outside", "path is outside the writable trees")
    if real in ROOTS:
        raise OpError("is_dir", "path is a directory")
    return real


def open_for_read(path: Any) -> tuple[int, int]:
    real = check_path(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise OpError("not_found", "no such file") from exc
    except NotADirectoryError as exc:
        raise OpError("not_found", "no such file") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OpError("outside", "path changed while opening") from exc
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OpError("is_dir", "path is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise OpError("not_regular", "path is not a regular file")
        if not _inside_roots(_fd_path(fd)):
            raise OpError("outside", "path is outside the writable trees")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_for_write(path: Any) -> tuple[int, str, str]:
    """Create parents and a temp file next to the target; answer (fd, temp path, target)."""
    real = check_path(path)
    if os.path.isdir(real):
        raise OpError("is_dir", "path is a directory")
    parent = os.path.dirname(real)
    try:
        os.makedirs(parent, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise OpError("not_dir", "a parent of the path is not a directory") from exc
    except OSError as exc:
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    real_parent = os.path.realpath(parent)
    if not _inside_roots(real_parent):
        raise OpError("outside", "path is outside the writable trees")
    tmp = os.path.join(real_parent, f".createos-upload-{os.getpid()}-{time.monotonic_ns()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as exc:
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    if not _inside_roots(os.path.dirname(_fd_path(fd))):
        os.close(fd)
        os.unlink(tmp)
        raise OpError("outside", "path is outside the writable trees")
    return fd, tmp, os.path.join(real_parent, os.path.basename(real))


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
    """One selector loop: control requests, SIGCHLD reaping, tree watching and kill timers."""

    def __init__(self, ctrl: _socket.socket) -> None:
        self.ctrl = ctrl
        self.poller = select.epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.children: set[int] = set()
        self.watched: set[int] = set()  # sessions whose leader exited while members remained
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.killers: dict[int, list[Any]] = {}  # sid -> [deadline, request ids]

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
            timeout = None
            if self.timers:
                timeout = max(0.0, min(t for t, _ in self.timers) - time.monotonic())
            if self.watched or self.killers:
                timeout = TREE_POLL_S if timeout is None else min(timeout, TREE_POLL_S)
            try:
                ready = self.poller.poll(-1 if timeout is None else timeout)
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
                elif not self.read_ctrl():
                    return
            self.run_timers()
            self.poll_trees()

    def read_ctrl(self) -> bool:
        try:
            data, ancillary, _flags, _addr = self.ctrl.recvmsg(MAX_MSG, SCM_SPACE)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        for _level, _kind, raw in ancillary:  # the emulator never sends fds; close strays
            for i in range(0, len(raw) - len(raw) % 4, 4):
                os.close(int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True))
        if not data:
            return False
        msg = marshal.loads(data)  # noqa: S302 - written by the emulator, never by the guest
        rid = msg.get("id")
        try:
            getattr(self, "op_" + str(msg.get("op")), self.op_unknown)(rid, msg)
        except OpError as exc:
            self.fail(rid, exc.code, exc.message)
        except OSError as exc:
            self.fail(rid, "os", os.strerror(exc.errno or errno.EIO))
        return True

    def run_timers(self) -> None:
        now = time.monotonic()
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _, callback in due:
            callback()

    # -- children and trees ---------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                event: dict[str, Any] = {"event": "exit", "pid": pid}
                if os.WIFSIGNALED(status):
                    number = os.WTERMSIG(status)
                    event["signal"] = SIGNAL_NAMES.get(number, f"SIG{number}")
                else:
                    event["code"] = os.waitstatus_to_exitcode(status)
                self.send(event)
                self.watched.add(pid)

    def poll_trees(self) -> None:
        for sid in list(self.watched):
            if sid in self.children:
                continue
            if not session_members(sid):
                self.watched.discard(sid)
                self.send({"event": "tree_exit", "sid": sid})
        for sid, entry in list(self.killers.items()):
            members = session_members(sid)
            if not members and sid not in self.children:
                del self.killers[sid]
                for rid in entry[1]:
                    self.reply(rid)
            elif time.monotonic() >= entry[0]:
                for pid in members:
                    self._kill(pid, _signal.SIGKILL)

    @staticmethod
    def _kill(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # -- operations -----------------------------------------------------------------------
    def op_unknown(self, rid: Any, msg: dict[str, Any]) -> None:
        raise OpError("unknown_op", "unknown operation")

    def op_ping(self, rid: Any, msg: dict[str, Any]) -> None:
        self.reply(rid)

    def op_spawn(self, rid: Any, msg: dict[str, Any]) -> None:
        """Start a command in a new session: pipes (fds stdin, stdout, stderr) or, with
        ``pty``, a pseudo-terminal that becomes its controlling tty (fd: the master)."""
        env = {str(k): str(v) for k, v in msg["env"].items()}
        cmd = str(msg["cmd"])
        argv = [cmd, *[str(a) for a in msg.get("args", [])]]
        program = find_program(cmd, env)
        cwd = str(msg.get("cwd") or "/root")
        pty = msg.get("pty")
        child_ends: list[int] = []
        parent_ends: list[int] = []
        actions: list[tuple[Any, ...]]
        if pty:
            master, slave = os.openpty()
            os.set_inheritable(master, False)
            set_winsize(master, int(pty.get("rows", 24)), int(pty.get("cols", 80)))
            child_ends, parent_ends = [slave], [master]
            # Opened after setsid (glibc runs setsid before file actions): it becomes the
            # session's controlling terminal.
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, os.ttyname(slave), os.O_RDWR, 0),
                (os.POSIX_SPAWN_DUP2, 0, 1),
                (os.POSIX_SPAWN_DUP2, 0, 2),
            ]
            os.set_inheritable(slave, False)
        else:
            pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
            child_ends = [pipes[0][0], pipes[1][1], pipes[2][1]]
            parent_ends = [pipes[0][1], pipes[1][0], pipes[2][0]]
            actions = [
                (os.POSIX_SPAWN_DUP2, child_ends[0], 0),
                (os.POSIX_SPAWN_DUP2, child_ends[1], 1),
                (os.POSIX_SPAWN_DUP2, child_ends[2], 2),
            ]
        try:
            try:
                os.chdir(cwd)
            except OSError as exc:
                raise OpError("cwd", f"cannot use {cwd} as working directory") from exc
            try:
                pid = os.posix_spawn(
                    program,
                    argv,
                    env,
                    file_actions=actions,
                    setsid=True,
                    setsigdef=SIGNALS_RESET,
                    setsigmask=(),
                )
            except OSError as exc:
                raise OpError("spawn", f"{cmd}: {os.strerror(exc.errno or errno.EIO)}") from exc
            finally:
                os.chdir("/")
        except BaseException:
            for fd in child_ends + parent_ends:
                os.close(fd)
            raise
        for fd in child_ends:
            os.close(fd)
        self.children.add(pid)
        try:
            self.reply(rid, parent_ends, pid=pid)
        finally:
            for fd in parent_ends:
                os.close(fd)

    def op_signal(self, rid: Any, msg: dict[str, Any]) -> None:
        sig = SIGNAL_NUMBERS[str(msg["signal"])]
        sid = int(msg["sid"])
        sent = 0
        try:
            os.killpg(sid, sig)
            sent += 1
        except ProcessLookupError:
            pass
        if msg.get("tree"):
            for pid in session_members(sid):
                self._kill(pid, sig)
                sent += 1
        self.reply(rid, delivered=sent > 0)

    def op_kill_tree(self, rid: Any, msg: dict[str, Any]) -> None:
        sid = int(msg["sid"])
        grace = max(0, int(msg.get("grace_ms", 1000))) / 1000.0
        for pid in session_members(sid):
            self._kill(pid, _signal.SIGTERM)
        entry = self.killers.setdefault(sid, [time.monotonic() + grace, []])
        entry[0] = min(entry[0], time.monotonic() + grace)
        entry[1].append(rid)
        self.poll_trees()

    def op_tree(self, rid: Any, msg: dict[str, Any]) -> None:
        self.reply(rid, pids=session_members(int(msg["sid"])))

    def op_freeze(self, rid: Any, msg: dict[str, Any]) -> None:
        sig = _signal.SIGSTOP if msg.get("stop", True) else _signal.SIGCONT
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            pass
        self.reply(rid)

    def op_open_read(self, rid: Any, msg: dict[str, Any]) -> None:
        fd, size = open_for_read(msg.get("path"))
        try:
            self.reply(rid, [fd], size=size)
        finally:
            os.close(fd)

    def op_open_write(self, rid: Any, msg: dict[str, Any]) -> None:
        fd, tmp, target = open_for_write(msg.get("path"))
        try:
            self.reply(rid, [fd], tmp=tmp, target=target)
        finally:
            os.close(fd)

    def op_commit(self, rid: Any, msg: dict[str, Any]) -> None:
        tmp, target = str(msg["tmp"]), str(msg["target"])
        if not (_inside_roots(tmp) and _inside_roots(target)):
            raise OpError("outside", "path is outside the writable trees")
        try:
            os.rename(tmp, target)
        except IsADirectoryError as exc:
            self._unlink(tmp)
            raise OpError("is_dir", "path is a directory") from exc
        except OSError:
            self._unlink(tmp)
            raise
        self.reply(rid)

    def op_abort(self, rid: Any, msg: dict[str, Any]) -> None:
        tmp = str(msg["tmp"])
        if _inside_roots(tmp) and os.path.basename(tmp).startswith(".createos-upload-"):
            self._unlink(tmp)
        self.reply(rid)

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass


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
