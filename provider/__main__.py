"""``python -m provider``: the Paperclip worker, serving JSON-RPC on stdio.

Start-up order matters: die with the shim first, then move the protocol stream off fd 1, answer
``initialize``, and only then import the async machinery (see ``provider.rpc.handshake``).
"""

from __future__ import annotations

import os
import signal
import sys

SHIM_PID_ENV = "PAPERCLIP_CREATEOS_SHIM_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM us when the parent (the Node shim) dies; exit now if it already has."""
    shim_pid = os.environ.pop(SHIM_PID_ENV, None)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if shim_pid is not None and shim_pid.isdigit() and os.getppid() != int(shim_pid):
        os._exit(0)  # the shim died before prctl took effect


def main(argv: list[str]) -> int:
    if argv:
        sys.stderr.write("usage: python -m provider   (serves the Paperclip host on stdio)\n")
        return 2
    die_with_parent()
    from provider.app import run_stdio

    run_stdio()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # do not wait for worker threads stuck on a terminal read
