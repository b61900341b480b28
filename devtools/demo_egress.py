"""The demo's egress check: a listener on this machine's loopback and the command that tries it.

``loopback_listener()`` serves one greeting line on ``127.0.0.1:<free port>`` for as long as the
block runs and counts the connections it accepted. ``connect_script(port)`` is the bash text a
sandbox runs to reach it: ``connected: <greeting>`` and exit 0 when it gets through, else bash's
own error (``connect: Connection refused``) and a non-zero exit, within a few seconds.

On the emulator a lease whose egress list is restrictive runs in its own network namespace
(loopback only), so the host's listener is out of its reach, while an allow-all lease gets the
greeting through its user-mode network (the host's loopback is 10.0.2.2 there) or, on a host
without slirp4netns, the host network itself (127.0.0.1): the script tries both.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import anyio
from anyio.abc import SocketAttribute, SocketStream

from provider.emulator.usernet import HOST_ADDRESS

GREETING: Final = "hello from the host"
CONNECT_TIMEOUT_S: Final = 5
RESTRICTED_EGRESS: Final = ("example.com",)


@dataclass
class LoopbackListener:
    port: int
    connections: int = 0


@asynccontextmanager
async def loopback_listener() -> AsyncIterator[LoopbackListener]:
    """Serve :data:`GREETING` on a free port of ``127.0.0.1`` while the block runs."""
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = multi.listeners[0].extra(SocketAttribute.local_port)  # noqa: S610 (anyio, not Django)
    state = LoopbackListener(port=port)

    async def greet(stream: SocketStream) -> None:
        state.connections += 1
        async with stream:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(f"{GREETING}\n".encode())

    async with multi, anyio.create_task_group() as group:
        group.start_soon(multi.serve, greet, group)
        try:
            yield state
        finally:
            group.cancel_scope.cancel()


def connect_script(port: int) -> str:
    """Bash that connects to the host's ``127.0.0.1:port`` (at 10.0.2.2, then 127.0.0.1) and
    prints the first line it reads."""
    inner = (
        f"for address in {HOST_ADDRESS} 127.0.0.1; do exec 3<>/dev/tcp/$address/{port} && "
        'echo "connected: $(head -n 1 <&3)" && exit; done; exit 1'
    )
    return f"timeout {CONNECT_TIMEOUT_S} bash -c {shlex.quote(inner)}"
