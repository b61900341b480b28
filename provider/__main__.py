"""``python -m provider``: the Paperclip worker, serving JSON-RPC on stdio.

Start-up order (see ``provider.app.run_stdio``): move the protocol stream off fd 1, answer
``initialize`` with the standard library, tie our life to the shim's, and only then import the
async machinery.

``python -m provider shell [--api-url ORIGIN] SANDBOX_ID`` is the operator's attach helper
(:mod:`provider.shell`, docs/protocol.md 8.1); it is imported only for that subcommand.
``python -m provider doctor --api-url URL ...`` checks a live endpoint's behaviour
(:mod:`provider.doctor`), likewise imported only for that subcommand.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if argv and argv[0] == "shell":
        from provider.shell.cli import main as shell_main

        return shell_main(argv[1:])
    if argv and argv[0] == "doctor":
        from provider.doctor.cli import main as doctor_main

        return doctor_main(argv[1:])
    if argv:
        sys.stderr.write(
            "usage: python -m provider   (serves the Paperclip host on stdio)\n"
            "       python -m provider shell [--api-url ORIGIN] SANDBOX_ID"
            "   (a shell in a sandbox, on this terminal)\n"
            "       python -m provider doctor --api-url URL [--api-key-file FILE] ..."
            "   (check a CreateOS endpoint)\n"
        )
        return 2
    from provider.app import run_stdio

    run_stdio()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # do not wait for worker threads stuck on a terminal read
