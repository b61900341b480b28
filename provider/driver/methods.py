"""The environment-driver method table the dispatcher serves (``method_table``) and the driver's
shutdown hook. Heavy modules (pydantic, httpx) are imported inside the handlers so the worker
answers ``initialize`` fast; keep it that way when adding verbs here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

MethodHandler = Callable[[dict[str, Any]], Awaitable[Any]]
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]


async def environment_validate_config(params: dict[str, Any]) -> dict[str, object]:
    """``environmentValidateConfig``: validate and normalize; never touches the network."""
    from provider.config import validate_config

    return validate_config(params.get("config"))


def method_table(notify: Notify, log: Log) -> dict[str, MethodHandler]:
    """Map of JSON-RPC method name to handler; ``notify``/``log`` reach the host."""
    return {
        "environmentValidateConfig": environment_validate_config,
    }


async def shutdown() -> None:
    """Abort active driver work and wait for its cleanup (the dispatcher bounds the wait)."""
    return None
