# This file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: SIM105
"""The in-guest agent: ``http://127.0.0.1:1029`` inside one sandbox's network namespace.

Imported by ``guest_supervisor.py`` (builtin modules only, like it), which opens it at start
when its command line says ``agent`` and polls :meth:`Agent.fileno` (an epoll of the listener
and its connections) in its own loop: nothing here blocks. It serves what CreateOS's agent
serves to a guest: ``POST /self/delete`` and ``POST /self/pause`` (any ``?reason=``), answered
``202`` with a small JSON body; the supervisor then forwards a ``self`` event to the emulator,
which deletes or pauses the sandbox as an API call would. Other paths are 404, other methods on
those paths 405, a request line it cannot read 400. A request is read up to its blank line (at
most :data:`MAX_HEAD` bytes; a body is ignored) and answered with ``Connection: close``; after
the answer the connection is drained until the client closes it (closing with unread bytes
would reset it and could lose the answer), all within :data:`CONN_TIMEOUT_S`.
"""

from __future__ import annotations

import _socket
import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PORT = 1029
MAX_HEAD = 8192
MAX_CONNS = 32
MAX_REASON = 200
CONN_TIMEOUT_S = 5.0
ACTIONS = ("delete", "pause")
REASONS = {202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class Conn:
    """One accepted connection: what it sent so far, and whether it was answered."""

    __slots__ = ("answered", "buf", "deadline", "sock")

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.answered = False
        self.deadline = time.monotonic() + CONN_TIMEOUT_S


class Agent:
    """The listener and its connections, behind one epoll fd the supervisor polls."""

    def __init__(self, listener: _socket.socket) -> None:
        self.listener = listener
        self.poller = select.epoll()
        self.poller.register(listener.fileno(), select.EPOLLIN)
        self.conns: dict[int, Conn] = {}

    @classmethod
    def open(cls) -> Agent:
        """Listen on 127.0.0.1:1029 (raises OSError, e.g. when a guest process holds it)."""
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", PORT))
            sock.listen(16)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    def fileno(self) -> int:
        return self.poller.fileno()

    def timeout(self) -> float | None:
        """Seconds until the oldest connection expires; None when there is none."""
        if not self.conns:
            return None
        return max(0.0, min(c.deadline for c in self.conns.values()) - time.monotonic())

    def service(self) -> list[tuple[str, str]]:
        """Accept, read and answer what is ready; drop expired connections. Answers the
        ``(action, reason)`` of every accepted self request, in order."""
        asked: list[tuple[str, str]] = []
        for fd, _ in self.poller.poll(0):
            if fd == self.listener.fileno():
                self._accept()
                continue
            conn = self.conns.get(fd)
            if conn is not None:
                request = self._read(conn)
                if request is not None:
                    asked.append(request)
        now = time.monotonic()
        for conn in [c for c in self.conns.values() if c.deadline <= now]:
            self._close(conn)
        return asked

    def _accept(self) -> None:
        while True:
            try:
                fd, _addr = self.listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: the client sees a reset, the agent carries on
                return
            sock = _socket.socket(fileno=fd)
            if len(self.conns) >= MAX_CONNS:
                sock.close()
                continue
            sock.setblocking(False)
            self.conns[fd] = Conn(sock)
            self.poller.register(fd, select.EPOLLIN)

    def _read(self, conn: Conn) -> tuple[str, str] | None:
        try:
            chunk = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk or conn.answered:  # closed by the client, or drained after the answer
            if not chunk:
                self._close(conn)
            return None
        conn.buf += chunk
        head, found, _ = conn.buf.replace(b"\r\n", b"\n").partition(b"\n\n")
        if not found and len(conn.buf) < MAX_HEAD:
            return None
        status, action, reason = route(head.split(b"\n", 1)[0] if found else b"")
        self._answer(conn, status, action)
        return (action, reason) if status == 202 else None

    def _answer(self, conn: Conn, status: int, action: str) -> None:
        body = (
            f'{{"status":"accepted","action":"{action}"}}'
            if status == 202
            else f'{{"status":"error","code":{status}}}'
        ).encode()
        head = f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
        if status == 405:
            head += "Allow: POST\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        try:
            conn.sock.send(head.encode() + body)  # small: fits the socket buffer in one go
            conn.sock.shutdown(_socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.answered = True
        conn.buf = b""

    def _close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if self.conns.pop(fd, None) is not None:
            try:
                self.poller.unregister(fd)
            except OSError:
                pass
        conn.sock.close()

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn)
        self.listener.close()
        self.poller.close()


def route(line: bytes) -> tuple[int, str, str]:
    """``(status, action, reason)`` of one request line (``POST /self/delete?reason=x
    HTTP/1.1``)."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return 400, "", ""
    method, target = parts[0], parts[1].decode("latin-1")
    path, _, query = target.partition("?")
    action = path.removeprefix("/self/") if path.startswith("/self/") else ""
    if action not in ACTIONS:
        return 404, "", ""
    if method != b"POST":
        return 405, "", ""
    return 202, action, reason_of(query)


def reason_of(query: str) -> str:
    """The ``reason`` query parameter, decoded (at most :data:`MAX_REASON` characters)."""
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "reason":
            return unquote(value.replace("+", " "))[:MAX_REASON]
    return ""


def unquote(text: str) -> str:
    """Percent-decoding as UTF-8 (invalid sequences replaced): no urllib on the create path."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
            continue
        out += ch.encode("utf-8", "replace")
        i += 1
    return out.decode("utf-8", "replace")


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair)


def event(action: str, reason: str) -> dict[str, Any]:
    """The control-channel event that asks the emulator to act."""
    return {"event": "self", "action": action, "reason": reason}
