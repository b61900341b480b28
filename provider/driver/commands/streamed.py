"""Run one command as one streaming exec (docs/protocol.md 3.9).

The command travels in one ``POST /exec?stream=true`` with its stdin in the body (up to
:data:`INLINE_STDIN_BYTES`; more is staged as a file first, 2 requests), wrapped by
:func:`~provider.driver.commands.command_script.stream_wrapper`: a per-command token names its
process tree, the wrapper enforces the timeout itself, and marker lines end each stream at the
leader's exit (:mod:`provider.driver.commands.stream_end`), so the call completes then even while a
background child keeps the stream open. Output frames are relayed live and kept as a bounded tail.

What ends a command early is cleaned up by one more request, a kill by token that confirms
nothing carrying it is left (:func:`~provider.driver.commands.sandbox_ops.kill_command`), under a
fresh, shielded bound that never passes the host's budget:

- the worker's own deadline (timeout + :data:`WORKER_SLACK`), a cancellation (release, destroy,
  shutdown) or an outcome left unknown (the exec sent and no answer, a 5xx): confirmed kill ->
  a timed-out result or the cancellation; unconfirmed -> :class:`CleanupUnconfirmed` (poison);
- a lost stream (cut, malformed, ended without markers): confirmed -> :class:`CommandLost`,
  the lease stays usable; unconfirmed -> :class:`CleanupUnconfirmed`.

Closing the stream is never taken for a kill. A refused exec (a status below 500, or 429/503
after retries) ran nothing; a deadline spent in the rate-limit queue sent nothing
(:class:`RateLimitQueued`). The token is journaled before the exec is sent, so a worker that
crashes mid-command has its tree killed by the next one (:mod:`provider.driver.leases.recovery`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Final

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import CreateOSError
from provider.createos.exec_stream import ExecError, ExecEvent, ExecOutput
from provider.createos.wire import Wire
from provider.driver.commands.command_script import (
    TREE_VAR,
    StreamStdin,
    end_tag,
    new_token,
    stream_wrapper,
)
from provider.driver.commands.command_types import CommandResult, CommandSpec, ProcessRecord
from provider.driver.commands.output import CommandOutput, OutputSink
from provider.driver.commands.sandbox_ops import COMMAND_PREFIX, kill_command
from provider.driver.commands.stream_end import EndScanner, EndStatus
from provider.driver.core.budget import CleanupBound, not_started
from provider.errors import CleanupUnconfirmed, ProviderError

INLINE_STDIN_BYTES: Final = 262_144
"""Stdin up to this many UTF-8 bytes travels in the exec's body; more is staged as a file."""
WORKER_SLACK: Final = 10.0
"""The worker's own deadline is the command's timeout plus this: the wrapper's clock ends the
command first unless the sandbox cannot answer."""
EXIT_FRAME_WAIT: Final = 0.05
"""How long the rest of a stream is read after the end markers (see :func:`_follow`)."""
SETTLE_SECONDS: Final = 10.0
"""An exec already sent may take this long past the deadline to answer, so that its outcome is
known rather than cleaned up blind."""


class CommandLost(ProviderError):
    """The command's output stream was lost; its tree was killed (confirmed)."""


@dataclass
class _Run(CommandOutput):
    nonce: str = field(default_factory=new_token)
    exec_wire: Wire = field(default_factory=lambda: Wire(settle=SETTLE_SECONDS))
    end: EndStatus | None = None
    problem: str | None = None  # why the stream is lost, when it is
    open_timed_out: bool = False  # the command's timeout passed before its stream opened
    scanners: dict[str, EndScanner] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tag = end_tag(self.nonce)
        self.scanners = {"stdout": EndScanner(tag), "stderr": EndScanner(tag)}

    @property
    def ended(self) -> bool:
        return all(scanner.end is not None for scanner in self.scanners.values())

    def result(self, *, timed_out: bool = False) -> CommandResult:
        """The command's result as the managed path gives it."""
        end = None if timed_out else self.end
        return CommandResult(
            exit_code=end.code if end is not None and end.kind == "exit" else None,
            signal=end.signal_name if end is not None and end.kind == "signal" else None,
            timed_out=timed_out,
            stdout=self.stdout.getvalue(),
            stderr=self.stderr.getvalue(),
            metadata={"outputTruncated": self.truncated},
        )


@dataclass(frozen=True)
class StreamPlan:
    """What one streamed command sends: the exec's argv, its inline stdin, the staged file."""

    argv: list[str]
    stdin: str | None  # inline in the body
    staged: str | None  # the path of the stdin file put first, when too large to inline
    data: bytes  # the stdin as UTF-8

    @property
    def script(self) -> str:
        return self.argv[-1]


def plan_stream(spec: CommandSpec, token: str, nonce: str) -> StreamPlan:
    """The exec of ``spec`` (checked by the caller) for ``token`` and end marker ``nonce``."""
    data = (spec.stdin or "").encode("utf-8")
    mode: StreamStdin = "inline" if data else "none"
    staged = None
    if len(data) > INLINE_STDIN_BYTES:
        mode, staged = "file", f"/tmp/paperclip-stdin-{token}"
    script = stream_wrapper(
        nonce=nonce,
        command=spec.command,
        args=spec.args,
        env=spec.env,
        cwd=spec.cwd,
        timeout=spec.timeout,
        stdin=mode,
        stdin_path=staged,
    )
    argv = [f"{TREE_VAR}={token}", "/bin/bash", "-lc", script]
    return StreamPlan(argv, spec.stdin if mode == "inline" else None, staged, data)


async def run_streamed(
    client: CreateOSClient,
    sandbox_id: str,
    spec: CommandSpec,
    *,
    on_output: OutputSink | None,
    cleanup: CleanupBound,
    record: ProcessRecord | None,
) -> CommandResult:
    """Run ``spec`` (module docstring); its values were checked by the caller."""
    token, run = new_token(), _Run()
    plan = plan_stream(spec, token, run.nonce)
    staged, timeout = plan.staged, spec.timeout
    if record is not None:
        await record.started(COMMAND_PREFIX + token)
    try:
        with anyio.move_on_after(timeout + WORKER_SLACK) as timer:
            if staged is not None:
                await client.put_file(sandbox_id, staged, plan.data)
            try:
                async with AsyncExitStack() as stack:
                    # Waiting for a turn in the rate-limit queue counts against the command's
                    # own timeout, as it always did; the run is then the wrapper's to time.
                    events = None
                    with anyio.move_on_after(timeout) as opening:
                        events = await stack.enter_async_context(
                            client.exec_stream(
                                sandbox_id, "/usr/bin/env", plan.argv, stdin=plan.stdin,
                                wire=run.exec_wire,
                            )
                        )  # fmt: skip
                    run.open_timed_out = opening.cancelled_caught
                    if events is not None:
                        await _follow(events, run, on_output)
            except CreateOSError as exc:
                if not run.exec_wire.sent:
                    raise  # refused (a status below 500, or 429/503 after retries): nothing ran
                run.problem = str(exc)
    finally:
        await _cleanup(client, sandbox_id, token, run, staged, cleanup, record)
    if run.end is not None and run.end.kind in ("exit", "signal"):
        return run.result()
    timed_out = timer.cancelled_caught or run.open_timed_out
    if (run.end is not None and run.end.kind == "timeout") or timed_out:
        if not run.exec_wire.sent:
            raise not_started(timeout)
        return run.result(timed_out=True)
    raise CommandLost(_lost_message(run))


async def _follow(
    events: AsyncIterator[ExecEvent], run: _Run, on_output: OutputSink | None
) -> None:
    """Relay frames until both markers are in or the stream ends. After the markers the rest
    of the stream (its exit frame, at once unless a background child holds stdout) is read for
    at most :data:`EXIT_FRAME_WAIT`: a stream read to its end gives its connection back to the
    pool, where one closed early costs the next command a new connection (TLS included)."""
    async for event in events:
        if isinstance(event, ExecOutput):
            scanner = run.scanners[event.stream]
            await run.emit(event.stream, scanner.feed(event.text), on_output)
            if run.ended:
                out, err = (run.scanners[name].end for name in ("stdout", "stderr"))
                run.end = out if out == err else EndStatus("lost")
                with anyio.move_on_after(EXIT_FRAME_WAIT), contextlib.suppress(CreateOSError):
                    async for _ in events:  # what a background child writes later is dropped
                        pass
                return
        elif isinstance(event, ExecError):
            run.problem = f"CreateOS reported: {event.message}"
    for name, scanner in run.scanners.items():
        await run.emit(name, scanner.flush(), on_output)
    if run.problem is None:
        run.problem = "the stream ended before the command's end was reported"


async def _cleanup(
    client: CreateOSClient,
    sandbox_id: str,
    token: str,
    run: _Run,
    staged: str | None,
    bound: CleanupBound,
    record: ProcessRecord | None,
) -> None:
    """Kill by token unless the command is known to have ended or never ran, then drop its
    journal row; an unconfirmed kill poisons the lease (module docstring)."""
    end = run.end
    done = end is not None and (
        end.kind in ("exit", "signal") or (end.kind == "timeout" and not end.code)
    )
    ran = run.exec_wire.sent  # False: refused, or never sent
    confirmed = True
    with bound.scope():
        if ran and not done:
            confirmed = False  # stays False if the bound ends the kill
            confirmed = await kill_command(
                client, sandbox_id, token, remove=[staged] if staged is not None else []
            )
        elif staged is not None and not ran:
            with contextlib.suppress(ProviderError):
                await client.exec(sandbox_id, "/bin/rm", ["-f", "--", staged])
        if confirmed and record is not None:
            await record.ended(COMMAND_PREFIX + token)
    if not confirmed:
        raise CleanupUnconfirmed(
            "Stopping the command's process tree could not be confirmed; it may still be "
            "running. Destroy the lease to recover."
        )


def _lost_message(run: _Run) -> str:
    why = run.problem or "its exit status could not be read in the sandbox"
    if run.end is not None and run.end.kind in ("lost", "cancelled"):
        why = "its exit status could not be read in the sandbox"
    tail = (run.stderr.getvalue()[-300:] or run.stdout.getvalue()[-300:]).strip()
    return (
        f"The command's output stream from CreateOS was lost ({why}). Its process tree was "
        "then killed, confirmed: nothing of it still runs, and it was not run again. Output "
        "received before the loss was sent as live output"
        + (f"; it ended with: {tail}" if tail else ".")
    )
