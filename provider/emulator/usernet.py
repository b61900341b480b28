"""Network modes of a sandbox, and the user-mode network of the allow-all ones (slirp4netns).

Every sandbox gets its own network namespace (``bwrap --unshare-net``), so that each can own
``127.0.0.1:1029``, its guest agent (``guest_agent.py``). What else the namespace holds is its
*mode*, decided at create or fork and kept for the sandbox's life:

- :data:`USER_MODE` (allow-all egress): one ``slirp4netns`` per sandbox, attached to the
  namespace of the supervisor (its host pid comes from bwrap's ``--info-fd``) with
  ``--configure``: a ``tap0`` with ``10.0.2.100/24``, a default route through ``10.0.2.2`` and
  DNS at ``10.0.2.3`` (written into the guest's ``/etc/resolv.conf``). The host's loopback
  services are reached at :data:`HOST_ADDRESS` (``10.0.2.2``). The helper is started after the
  supervisor (bounded by its ``--ready-fd``) and stopped with the guest (:meth:`UserNet.stop`);
  its ``--exit-fd`` pipe also ends it when the emulator dies without stopping it.
- :data:`LOOPBACK_ONLY` (restrictive egress, or ``--unshare-net``): the namespace's loopback only.
- :data:`HOST` (allow-all egress on a host without slirp4netns): the host's network, as the
  emulator had before user-mode networking, and so no guest agent (``127.0.0.1:1029`` would be
  the host's, shared by every sandbox); a warning at start says so.

slirp4netns runs as the emulator's user (on root hosts ``/dev/net/tun`` is root's only, so not
as the guest uid) with ``--enable-sandbox`` (its own mount namespace, every capability dropped)
and ``--enable-seccomp``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from pathlib import Path

import anyio

from .guest_process import reap_bwrap

USER_MODE = "user-mode"
LOOPBACK_ONLY = "loopback-only"
HOST = "host"
HOST_ADDRESS = "10.0.2.2"  # the host's 127.0.0.1 as a user-mode sandbox sees it
DNS_ADDRESS = "10.0.2.3"
READY_TIMEOUT_S = 10.0
INSTALL_HINT = "install it with `apt-get install slirp4netns`"


class UserNetError(RuntimeError):
    """slirp4netns could not attach to a sandbox's network namespace."""


@functools.cache
def find_slirp4netns() -> str | None:
    """The slirp4netns binary (``$CREATEOS_EMULATOR_SLIRP4NETNS`` overrides; an empty value
    or a missing file means none), cached per process."""
    override = os.environ.get("CREATEOS_EMULATOR_SLIRP4NETNS")
    if override is not None:
        return override if override and Path(override).is_file() else None
    return shutil.which("slirp4netns")


def choose_mode(*, restricted: bool) -> str:
    """The network mode of a new sandbox: restricted ones are loopback-only, allow-all ones
    user-mode when slirp4netns is here, else the host's network."""
    if restricted:
        return LOOPBACK_ONLY
    return USER_MODE if find_slirp4netns() is not None else HOST


def missing_warning() -> str:
    return (
        "slirp4netns not found: allow-all sandboxes share the host's network (mode `host`) and "
        f"have no guest agent on 127.0.0.1:1029; {INSTALL_HINT}"
    )


def write_resolv_conf(etc_dir: Path) -> None:
    """The guest's ``/etc/resolv.conf`` of a user-mode sandbox: slirp4netns's DNS forwarder
    (the host's own may be a loopback resolver, out of the guest's reach)."""
    path = etc_dir / "resolv.conf"
    path.write_text(f"nameserver {DNS_ADDRESS}\n")
    path.chmod(0o644)


class UserNet:
    """One running slirp4netns, serving the network namespace of one sandbox."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_w: int) -> None:
        self.proc = proc
        self._exit_w: int | None = exit_w  # closing it tells slirp4netns to exit

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    @classmethod
    async def attach(cls, target_pid: int | None, state_dir: Path) -> UserNet:
        """Start slirp4netns on the network namespace of host pid ``target_pid`` and wait
        (bounded) until the interface is configured; it logs to ``state_dir/supervisor.log``.
        Call it from the event-loop thread."""
        binary = find_slirp4netns()
        if binary is None or target_pid is None:
            raise UserNetError("no user-mode network: slirp4netns or the guest's pid is missing")
        net, ready_r = cls._launch(binary, target_pid, state_dir / "supervisor.log")
        try:
            with anyio.move_on_after(READY_TIMEOUT_S):
                await anyio.wait_readable(ready_r)
            os.set_blocking(ready_r, False)
            with contextlib.suppress(BlockingIOError):
                if os.read(ready_r, 1) == b"1":
                    return net
            raise UserNetError(
                f"slirp4netns did not configure the sandbox network within {READY_TIMEOUT_S} s"
                " (its log is the sandbox's supervisor.log)"
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await net.stop()
            raise
        finally:
            os.close(ready_r)

    @classmethod
    def _launch(cls, binary: str, target_pid: int, log_path: Path) -> tuple[UserNet, int]:
        """Popen slirp4netns; answer it and the read end of its ready pipe."""
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        argv = [binary, "--configure", "--mtu=65520", "--enable-sandbox", "--enable-seccomp"]
        argv += ["--ready-fd", str(ready_w), "--exit-fd", str(exit_r), str(target_pid), "tap0"]
        try:
            with log_path.open("ab") as errlog:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=errlog,
                    stderr=errlog,
                    pass_fds=(ready_w, exit_r),
                    close_fds=True,
                )
        except OSError as exc:
            for fd in (ready_r, exit_w):
                os.close(fd)
            raise UserNetError(f"slirp4netns cannot start: {exc}") from exc
        finally:
            os.close(ready_w)
            os.close(exit_r)
        return cls(proc, exit_w), ready_r

    async def stop(self) -> None:
        """Tell slirp4netns to exit, SIGKILL it past a bound, reap it. Idempotent."""
        exit_w, self._exit_w = self._exit_w, None
        if exit_w is not None:
            os.close(exit_w)
        await reap_bwrap(self.proc)
