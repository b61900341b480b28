"""Start-up before the async machinery: the fd 1 guard and a standard-library ``initialize``.

The worker answers the host's first ``initialize`` here, with the standard library only, and
imports anyio/asyncio/msgspec afterwards: the host's ``startWorker`` resolves as soon as we can
name our methods, and the imports overlap with the host's own work. Requests that arrive
meanwhile wait in the pipe and are served once the dispatcher runs. Anything other than a
well-formed ``initialize`` as the first line is left untouched for the dispatcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any, Final

from provider.verbs import ENVIRONMENT_VERBS, INTERACTIVE_VERBS

# The order of ``supportedMethods`` (docs/protocol.md H10.1, H10.4): see provider.verbs.
ENVIRONMENT_METHOD_ORDER: Final = ENVIRONMENT_VERBS
INTERACTIVE_METHOD_ORDER: Final = INTERACTIVE_VERBS


def supported_methods(names: Iterable[str]) -> tuple[str, ...]:
    """The ``environment*`` names (canonical verbs first in the order of docs/protocol.md
    H6.2, others after), then the served interactive verbs (login PTY, duplex channels) in the
    order of H10.1."""
    names = list(names)
    env = [name for name in names if name.startswith("environment")]
    ordered: list[str] = [name for name in ENVIRONMENT_METHOD_ORDER if name in env]
    interactive: list[str] = [name for name in INTERACTIVE_METHOD_ORDER if name in names]
    return tuple(ordered + [name for name in env if name not in ordered] + interactive)


def guard_stdout() -> int:
    """Move the protocol stream off fd 1; returns the private fd that now carries it.

    fd 1 and ``sys.stdout`` then point at stderr, so a stray ``print``, a C library or a child
    process can never write into the protocol stream. The private fd is not inheritable.
    """
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


SHIM_PID_ENV: Final = "PAPERCLIP_CREATEOS_SHIM_PID"
_PR_SET_PDEATHSIG: Final = 1


def die_with_parent() -> None:
    """SIGTERM us when the parent (the Node shim) dies; exit now if it already has.

    Without this, a shim killed with SIGKILL leaves an orphan whose stdin stays open for as
    long as the server lives. The shim passes its pid so a shim that died before ``prctl``
    took effect is noticed too.
    """
    shim_pid = os.environ.pop(SHIM_PID_ENV, None)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if shim_pid is not None and shim_pid.isdigit() and os.getppid() != int(shim_pid):
        os._exit(0)


def exit_on_stop_signals() -> None:
    """Until the dispatcher installs its own handlers, a stop signal ends us at once.

    Nothing is running yet, so there is nothing to clean up; exit 0 like a served shutdown.
    """
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: os._exit(0))


def read_first_line(fd: int) -> tuple[bytes, bytes]:
    """Block until the first LF (or end of input); returns (line, bytes read after it)."""
    buffer = bytearray()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(buffer), b""
        start = len(buffer)
        buffer += chunk
        index = buffer.find(b"\n", start)
        if index >= 0:
            return bytes(buffer[:index]), bytes(buffer[index + 1 :])


def initialize_request_id(line: bytes) -> int | str | None:
    """The id of ``line`` when it is a well-formed ``initialize`` request, else ``None``."""
    try:
        message: Any = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None
    request_id = message.get("id")
    valid_id = isinstance(request_id, str) or (
        isinstance(request_id, int) and not isinstance(request_id, bool)
    )
    if message.get("method") != "initialize" or not valid_id:
        return None
    if not isinstance(message.get("params"), dict):
        return None
    return request_id if isinstance(request_id, int | str) else None


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def answer_initialize(protocol_fd: int, request_id: int | str, methods: tuple[str, ...]) -> None:
    """Write the ``initialize`` success reply (ASCII JSON, one line)."""
    reply = {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"ok": True, "supportedMethods": list(methods)},
    }
    line = json.dumps(reply, ensure_ascii=True, separators=(",", ":")) + "\n"
    write_all(protocol_fd, line.encode("ascii"))
