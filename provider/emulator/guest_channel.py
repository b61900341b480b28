# Raw os calls: this file runs standalone, by the host python3, in the guest.
"""The in-guest supervisor's end of its control socket: what it reads and what it writes.

Imported by ``guest_supervisor.py`` and ``guest_ops.py`` (builtin modules only, like them). The
socket is SOCK_SEQPACKET, one message per request, reply or event. Requests from the emulator
are ``marshal`` dicts (trusted input); one too large for a socket message arrives as ``{"op":
"via_fd"}`` with a memfd holding the real request. Replies and events go back as JSON written
by :func:`to_json` (no ``json`` import on the create path, and the emulator never unmarshals
what the guest could forge), file descriptors beside them with SCM_RIGHTS. Signals travel by
name (:data:`SIGNAL_NUMBERS`, :data:`SIGNAL_NAMES`).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import _socket
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MSG = 1 << 20
VIA_FD = "via_fd"  # the op of a large request's inline part (its memfd holds the request)
SCM_SPACE = _socket.CMSG_SPACE(8 * 4)
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
NOTHING: dict[str, Any] = {}
"""What :meth:`Channel.receive` answers when no request is ready yet (compared by identity)."""


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


class Channel:
    """The control socket. Requests carry ``{"id": n, "op": ...}`` and get ``{"id": n, "ok":
    bool, ...}`` replies; events carry no id."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        data = to_json(msg).encode("ascii")
        if fds:
            raw = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
            self.sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, raw)])
        else:
            self.sock.send(data)

    def reply(self, rid: Any, fds: list[int] | None = None, **fields: Any) -> None:
        self.send({"id": rid, "ok": True, **fields}, fds)

    def fail(self, rid: Any, code: str, message: str) -> None:
        self.send({"id": rid, "ok": False, "error": code, "message": message})

    def receive(self) -> dict[str, Any] | None:
        """The next request; :data:`NOTHING` when none is ready, None once the socket closed."""
        try:
            data, ancillary, _flags, _addr = self.sock.recvmsg(MAX_MSG, SCM_SPACE)
        except (BlockingIOError, InterruptedError):
            return NOTHING
        except OSError:
            return None
        fds = [
            int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True)
            for _level, _kind, raw in ancillary
            for i in range(0, len(raw) - len(raw) % 4, 4)
        ]
        try:
            if not data:
                return None
            msg: dict[str, Any] = marshal.loads(data)  # noqa: S302 - the emulator's, never the guest's
            if msg.get("op") == VIA_FD and len(fds) == 1:  # a large request (module docstring)
                msg = marshal.loads(read_all(fds[0]))  # noqa: S302 - the emulator's, too
        finally:
            for fd in fds:  # the only fd the emulator sends is a request's memfd
                os.close(fd)
        return msg
