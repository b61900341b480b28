"""A test worker for the real host: our dispatcher with a fake ``environmentExecute`` that streams.

tests/host copies this file to ``<tmp>/provider/__main__.py`` beside a copy of ``shim.mjs``; the
tmp ``provider/__init__.py`` extends ``__path__`` to this checkout's ``provider``, so everything
but ``__main__`` is the real code.
"""

from __future__ import annotations

from typing import Any

import anyio

from provider.rpc.dispatcher import Dispatcher
from provider.rpc.handshake import guard_stdout
from provider.rpc.outbound import current_invocation_id
from provider.rpc.runner import serve_stdio


async def execute(params: dict[str, Any]) -> dict[str, Any]:
    chunks = [str(chunk) for chunk in params.get("chunks", [])]
    for chunk in chunks:
        await dispatcher.notify("execute.log", {"stream": "stdout", "chunk": chunk})
    await dispatcher.notify("execute.log", {"stream": "stderr", "chunk": "warn\n"})
    return {
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "stdout": "".join(chunks),
        "stderr": "warn\n",
        "metadata": {"invocationId": current_invocation_id()},
    }


dispatcher = Dispatcher({"environmentExecute": execute})

if __name__ == "__main__":
    anyio.run(serve_stdio, guard_stdout(), dispatcher)
