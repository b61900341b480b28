"""A worker whose handler writes to stdout every way it can (run as a subprocess by the tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import anyio

from provider.rpc.dispatcher import Dispatcher
from provider.rpc.runner import serve_stdio
from provider.rpc.stdio import guard_stdout


async def noisy(params: dict[str, Any]) -> str:
    print("stray print from a handler")
    sys.stdout.write("stray sys.stdout.write\n")
    os.write(1, b"stray os.write to fd 1\n")
    subprocess.run(["echo", "stray output of a child process"], check=True)
    return "done"


def main() -> None:
    protocol_fd = guard_stdout()
    print("stray print at start-up")
    anyio.run(serve_stdio, protocol_fd, Dispatcher({"environmentProbe": noisy}))


if __name__ == "__main__":
    main()
