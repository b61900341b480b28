"""environmentExecute's own work (docs/protocol.md 3): its command checked before any
request, then run on the leased sandbox with its output relayed live.

:func:`command_spec` turns the params into a :class:`CommandSpec` and refuses a bad or oversized
value (3.1) before the lease is claimed; :func:`run_relayed` runs it inside the leased call
(:mod:`provider.driver.leased`), the :class:`LiveRelay` writing ``execute.log`` notifications
beside it. The result is answered once every live chunk was sent.
"""

from __future__ import annotations

import anyio

from provider.driver.commands.command_types import CommandResult, CommandSpec, LogSink
from provider.driver.commands.execute import prepare_command, run_command, timeout_seconds
from provider.driver.commands.live import LiveRelay, Notify
from provider.driver.core.budget import host_bound
from provider.driver.core.params import ExecuteParams
from provider.driver.core.runtime import BoundCall, LeasedCall


def command_spec(params: ExecuteParams, call: BoundCall) -> CommandSpec:
    """The command of ``params`` (its timeout defaults to the config's), checked and planned:
    raises InvalidParams (or RequestRefused) before any request, never echoing a value."""
    timeout = (
        call.timeout
        if params.timeoutMs is None
        else timeout_seconds(params.timeoutMs, "The command's timeoutMs")
    )
    spec = CommandSpec(
        command=params.command,
        args=params.args or [],
        cwd=params.cwd,
        env=params.env or {},
        stdin=params.stdin,
        timeout=timeout,
    )
    prepare_command(spec)
    return spec


async def run_relayed(
    leased: LeasedCall, spec: CommandSpec, *, notify: Notify, log: LogSink
) -> CommandResult:
    """Run ``spec`` with its live output sent through ``notify``; cleanup stays within the
    host's budget for the call."""
    call = leased.call
    relay = LiveRelay(notify)
    failure: Exception | None = None
    # The relay's writer runs beside the command; the result is answered once it has sent
    # every live chunk. A failure is re-raised outside the task group so that it keeps its own
    # type (never an ExceptionGroup); cancellation passes through.
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        try:
            result = await run_command(
                leased.client,
                leased.scope.lease_id,
                spec,
                on_output=relay.put,
                cleanup_timeout=host_bound(call.timeout, spec.timeout, since=call.received),
                record=leased.records,
                log=log,
            )
        except Exception as exc:
            failure = exc
        finally:
            relay.close()
    if failure is not None:
        raise failure
    return result
