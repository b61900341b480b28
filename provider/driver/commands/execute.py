"""Run one command in a sandbox: the funnel of execute, the sync steps and the probe.

:func:`run_command` checks the command before any request (3.1, and the size bounds of
:mod:`provider.driver.commands.command_size`), then runs it as one streaming exec
(:mod:`provider.driver.commands.streamed`, docs/protocol.md 3.9: 1 request, 2 with staged
stdin). An origin whose exec stream answers 404 (an older CreateOS) runs commands as managed
processes from then on (:mod:`provider.driver.commands.managed_command`, 3.3), with one log line.
Both paths give the same guarantees and the same
:class:`~provider.driver.commands.command_types.CommandResult`; what they cannot confirm raises
:class:`~provider.errors.CleanupUnconfirmed`.
"""

from __future__ import annotations

import math

from provider.createos.client import CreateOSClient
from provider.createos.exec_stream import ExecStreamUnsupported, exec_stream_supported
from provider.driver.commands.command_size import check_script
from provider.driver.commands.command_types import (
    CommandResult,
    CommandSpec,
    LogSink,
    ProcessRecord,
)
from provider.driver.commands.managed_command import LARGE_DATA_HINT, prepare_managed, run_managed
from provider.driver.commands.output import OutputSink
from provider.driver.commands.sandbox_text import validate_env
from provider.driver.commands.streamed import StreamPlan, plan_stream, run_streamed
from provider.driver.core.budget import CleanupBound, as_bound
from provider.errors import InvalidParams

__all__ = [
    "CommandResult",
    "CommandSpec",
    "LogSink",
    "OutputSink",
    "ProcessRecord",
    "build_command",
    "check_command",
    "prepare_command",
    "run_command",
    "timeout_seconds",
]

MAX_TIMEOUT_MS = 86_400_000


def check_command(spec: CommandSpec) -> None:
    """Pre-flight (3.1): refuse bad values before any HTTP request, never echoing them."""
    if not spec.command:
        raise InvalidParams("The command is empty.")
    for what, value in (("command", spec.command), ("cwd", spec.cwd or "")):
        if "\0" in value:
            raise InvalidParams(f"The {what} contains a NUL character.")
    if any("\0" in arg for arg in spec.args):
        raise InvalidParams("An argument contains a NUL character.")
    validate_env(spec.env)


def _inputs(spec: CommandSpec) -> list[tuple[str, str]]:
    return [
        ("the command", spec.command),
        ("the cwd", spec.cwd or ""),
        *((f"args[{index}]", arg) for index, arg in enumerate(spec.args)),
        *((f"the env value of {name}", value) for name, value in spec.env.items()),
    ]


def build_command(spec: CommandSpec) -> StreamPlan:
    """The exec ``spec`` becomes after the checks of 3.1, whatever its size (the token and
    nonce are placeholders of their real length)."""
    check_command(spec)
    return plan_stream(spec, "0" * 32, "0" * 32)


def prepare_command(spec: CommandSpec) -> StreamPlan:
    """Check ``spec`` (3.1, and the one-argument bound) and plan its exec; raises InvalidParams
    (or RequestRefused) before any request, never echoing a value."""
    plan = build_command(spec)
    check_script(plan.script, "The command", _inputs(spec), LARGE_DATA_HINT)
    return plan


async def run_command(
    client: CreateOSClient,
    sandbox_id: str,
    spec: CommandSpec,
    *,
    on_output: OutputSink | None,
    cleanup_timeout: CleanupBound | float,
    record: ProcessRecord | None = None,
    log: LogSink | None = None,
) -> CommandResult:
    """Run ``spec`` to completion or deadline (module docstring). ``cleanup_timeout`` bounds the
    whole cleanup (a number: seconds, with no host budget); ``log`` hears the fallback."""
    prepare_command(spec)
    cleanup = as_bound(cleanup_timeout)
    if exec_stream_supported(client.base_url):
        try:
            return await run_streamed(
                client, sandbox_id, spec, on_output=on_output, cleanup=cleanup, record=record
            )
        except ExecStreamUnsupported:
            if log is not None:
                await log(
                    "warn",
                    f"CreateOS at {client.base_url} has no exec stream (an older server): "
                    "commands run as managed processes there from now on (3 requests each "
                    "instead of 1).",
                    None,
                )
    prepared = prepare_managed(spec, _inputs(spec))
    return await run_managed(
        client, sandbox_id, spec, prepared, on_output=on_output, cleanup=cleanup, record=record
    )


def timeout_seconds(timeout_ms: object, what: str) -> float:
    """An integral millisecond count in [1, 86,400,000] (integral floats accepted)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float):
        raise InvalidParams(f"{what} must be an integer number of milliseconds.")
    if isinstance(timeout_ms, float) and not (
        math.isfinite(timeout_ms) and timeout_ms.is_integer()
    ):
        raise InvalidParams(f"{what} must be an integer number of milliseconds.")
    if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise InvalidParams(f"{what} must be between 1 and {MAX_TIMEOUT_MS} milliseconds.")
    return int(timeout_ms) / 1000
