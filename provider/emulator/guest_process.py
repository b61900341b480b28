"""The host process of one guest: launching ``bwrap``, learning who its supervisor is, ending it.

:func:`launch` starts ``bwrap`` with an ``--info-fd`` pipe, whose JSON (:func:`read_info`) names
the supervisor's host pid; :func:`supervisor_identity` turns it into a pidfd and the PID
namespace. Ending a guest is :func:`stop_supervisor` (SIGKILL pid 1 through its pidfd: the kernel
then kills the whole namespace), :func:`reap_bwrap` and, belt and braces,
:func:`empty_namespace`. The control channel to the supervisor is :class:`~.guest.Guest`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import anyio

from .bwrap import GuestRuntime
from .hostscan import scan_host

log = logging.getLogger("provider.emulator")

KILL_WAIT_S = 5.0


def launch(
    argv: list[str], runtime: GuestRuntime, ctrl_fd: int, log_path: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` (:func:`~.bwrap.sandbox_argv`) passing it ``ctrl_fd`` and an info pipe;
    answer the process and the pipe's read end. Call it from the event-loop thread, so that
    ``--die-with-parent`` is tied to a thread that lives as long as the emulator."""
    info_r, info_w = os.pipe()
    try:
        with log_path.open("ab") as errlog:
            proc = subprocess.Popen(
                [argv[0], "--info-fd", str(info_w), *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errlog,
                pass_fds=(ctrl_fd, info_w),
                close_fds=True,
                user=runtime.drop_to_uid,
                group=runtime.drop_to_uid,
                extra_groups=None if runtime.drop_to_uid is None else [],
            )
    except BaseException:
        os.close(info_r)
        raise
    finally:
        os.close(info_w)
    return proc, info_r


async def read_info(fd: int) -> bytes:
    """Read bwrap's ``--info-fd`` JSON (ends at its closing brace or EOF)."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        chunks.append(chunk)
        if not chunk or b"}" in chunk:
            return b"".join(chunks)


def supervisor_identity(info: bytes) -> tuple[int | None, int | None, str | None]:
    """The supervisor's host pid, a pidfd on it and its PID namespace (e.g. ``pid:[4026532]``),
    from bwrap's info JSON; each None when it cannot be learned."""
    host_pid = pidfd = pid_ns = None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        host_pid = int(json.loads(info or b"{}")["child-pid"])
    if host_pid is not None:
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(host_pid)
            pid_ns = os.readlink(f"/proc/{host_pid}/ns/pid")  # noqa: PTH115
    return host_pid, pidfd, pid_ns


async def stop_supervisor(pidfd: int) -> None:
    """SIGKILL the supervisor and wait (bounded) until it is gone; closes ``pidfd``."""
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with anyio.move_on_after(KILL_WAIT_S):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def reap_bwrap(proc: subprocess.Popen[bytes]) -> None:
    """Wait (bounded) for bwrap to exit, SIGKILL it past that, and reap it."""
    with anyio.move_on_after(KILL_WAIT_S):
        while proc.poll() is None:  # noqa: ASYNC110 - Popen offers no awaitable exit
            await anyio.sleep(0.005)
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
        await anyio.to_thread.run_sync(proc.wait)


def empty_namespace(pid_ns: str) -> None:
    """SIGKILL whatever is still in the namespace (belt and braces; blocking)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        left = scan_host({pid_ns: None}).get(pid_ns, [])
        if not left:
            return
        for member in left:
            with contextlib.suppress(OSError):
                os.kill(member.host_pid, signal.SIGKILL)
        time.sleep(0.01)
    log.warning("sandbox namespace %s still has processes after kill", pid_ns)


def log_tail(path: Path, limit: int = 600) -> str:
    """The end of a guest's stderr log (bwrap's own errors land there), for a start failure."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
            text = fh.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f": {text}" if text else ""
