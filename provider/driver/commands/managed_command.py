"""Run one command as a CreateOS managed process (docs/protocol.md 3.3): the path
for servers without the exec stream (:mod:`provider.driver.commands.streamed` is the default).

The command runs as an argv inside a bash wrapper that waits for EOF on its stdin (the start
gate), so nothing is printed before the output stream is attached: create, connect, close is the
whole sequence (3 requests). Stdin up to 256 KiB travels through one ``/input`` instead of the
close, the wrapper waiting for exactly that many bytes (3 requests); larger stdin is staged as a
file before the process is created (4 requests). Output is followed frame by frame, decoded per
stream, sent live through ``on_output`` and kept as a bounded tail. Whatever ends the command
early (deadline, cancellation, a protocol failure) kills the whole remote process tree under a
fresh, shielded deadline that never passes the host's budget (:mod:`provider.driver.core.budget`);
if that kill (or the creation itself) cannot be confirmed, :class:`CleanupUnconfirmed` replaces the
outcome and the caller poisons the lease. The creation's outcome is unknown only once its
request was sent: a deadline that passes while it still waits for the rate-limit queue
(:class:`~provider.createos.wire.Wire`) leaves nothing behind and fails with
:class:`RateLimitQueued`; one that passes while the create is on the wire lets it finish
(:data:`CREATE_SETTLE_SECONDS` at most), then kills what it started.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio

from provider.createos.client import MAX_INPUT_BYTES, CreateOSClient
from provider.createos.errors import Conflict, MalformedFrame, NotFound
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.stream import follow_process_output
from provider.createos.wire import Wire
from provider.driver.commands.command_size import check_script
from provider.driver.commands.command_types import CommandResult, CommandSpec, ProcessRecord
from provider.driver.commands.output import CommandOutput, OutputSink, StreamDecoder
from provider.driver.commands.sandbox_ops import kill_tree
from provider.driver.commands.sandbox_text import StdinMode, build_wrapper_script
from provider.driver.core.budget import CleanupBound, not_started
from provider.errors import CleanupUnconfirmed, ProviderError

GATE_SLACK_SECONDS = 20  # the start gate's bounded wait: the command timeout plus this
CREATE_SETTLE_SECONDS = 10.0
"""A process create already sent may finish this long past the command's deadline, so that its
outcome is known (the process is then killed) rather than poisoning the lease."""


@dataclass(frozen=True)
class PreparedCommand:
    """What :func:`run_managed` sends: the wrapper script and where the stdin goes."""

    script: str
    stdin: bytes
    stdin_path: str | None  # the staged stdin file, for stdin over one /input


def prepare_managed(spec: CommandSpec, inputs: list[tuple[str, str]]) -> PreparedCommand:
    """The managed wrapper of ``spec`` (already checked), held to the one-argument bound."""
    stdin = spec.stdin.encode("utf-8") if spec.stdin else b""
    stdin_path: str | None = None
    mode: StdinMode = "none"
    if len(stdin) > MAX_INPUT_BYTES:
        mode, stdin_path = "file", f"/tmp/paperclip-stdin-{uuid.uuid4().hex}"
    elif stdin:
        mode = "pipe"
    script = build_wrapper_script(
        command=spec.command,
        args=spec.args,
        env=spec.env,
        cwd=spec.cwd,
        gate_seconds=math.ceil(spec.timeout) + GATE_SLACK_SECONDS,
        stdin=mode,
        stdin_path=stdin_path,
        stdin_length=len(stdin) if mode == "pipe" else 0,
    )
    check_script(script, "The command", inputs, LARGE_DATA_HINT)
    return PreparedCommand(script, stdin, stdin_path)


LARGE_DATA_HINT = "Pass large data as stdin or in a file synced in first (neither travels in it)."


@dataclass
class _Run(CommandOutput):
    process_id: str | None = None
    create: Wire = field(default_factory=lambda: Wire(settle=CREATE_SETTLE_SECONDS))
    exit: ExitFrame | None = None
    decoders: dict[str, StreamDecoder] = field(
        default_factory=lambda: {"stdout": StreamDecoder(), "stderr": StreamDecoder()}
    )

    async def flush(self, sink: OutputSink | None) -> None:
        for stream, decoder in self.decoders.items():
            await self.emit(stream, decoder.flush(), sink)

    @property
    def creation_unknown(self) -> bool:
        """The create was sent and never answered with a process."""
        return self.process_id is None and self.create.sent

    def metadata(self) -> dict[str, Any]:
        return {
            "processId": self.process_id,
            "outputTruncated": self.truncated,
        }


async def run_managed(
    client: CreateOSClient,
    sandbox_id: str,
    spec: CommandSpec,
    prepared: PreparedCommand,
    *,
    on_output: OutputSink | None,
    cleanup: CleanupBound,
    record: ProcessRecord | None = None,
) -> CommandResult:
    """Run ``spec`` to completion or deadline; see the module docstring for the guarantees.
    ``cleanup`` bounds the whole cleanup."""
    script, stdin, stdin_path = prepared.script, prepared.stdin, prepared.stdin_path
    run = _Run()
    try:
        with anyio.move_on_after(spec.timeout) as timer:
            await _start_and_follow(
                client, sandbox_id, spec, script, stdin, stdin_path, run, on_output, record
            )
        await run.flush(on_output)
    finally:
        await _cleanup(client, sandbox_id, run, stdin_path, cleanup, record)
    if run.exit is None:
        assert timer.cancelled_caught
        if run.process_id is None and run.create.queued:
            raise not_started(spec.timeout)
        return CommandResult(
            exit_code=None,
            timed_out=True,
            stdout=run.stdout.getvalue(),
            stderr=run.stderr.getvalue(),
            metadata=run.metadata(),
        )
    return CommandResult(
        exit_code=run.exit.exit_code if run.exit.signal is None else None,
        signal=run.exit.signal,
        timed_out=False,
        stdout=run.stdout.getvalue(),
        stderr=run.stderr.getvalue(),
        metadata=run.metadata(),
    )


async def _start_and_follow(
    client: CreateOSClient,
    sandbox_id: str,
    spec: CommandSpec,
    script: str,
    stdin: bytes,
    stdin_path: str | None,
    run: _Run,
    on_output: OutputSink | None,
    record: ProcessRecord | None,
) -> None:
    """Requests: [PUT staged stdin,] create, connect, then input or stdin close (3.3)."""
    if stdin_path is not None:
        await client.put_file(sandbox_id, stdin_path, stdin)
    view = await client.create_process(
        sandbox_id, cmd="/bin/bash", args=["-lc", script], cwd=spec.cwd, wire=run.create
    )
    run.process_id = view.process_id
    if record is not None:
        await record.started(view.process_id)

    async def open_gate() -> None:
        """The stream is open: start the command. Small stdin is the gate itself (the wrapper
        waits for exactly its length); otherwise EOF on stdin is."""
        if stdin and stdin_path is None:
            await client.write_input(sandbox_id, view.process_id, stdin)
            return
        with contextlib.suppress(Conflict, NotFound):
            await client.close_stdin(sandbox_id, view.process_id)

    frames = follow_process_output(client, sandbox_id, view.process_id, on_open=open_gate)
    async with contextlib.aclosing(frames):  # close the stream at once when stopped early
        async for frame in frames:
            if isinstance(frame, DataFrame):
                if frame.stream == "pty":
                    raise MalformedFrame("CreateOS sent terminal output for a pipe process.")
                await run.emit(frame.stream, run.decoders[frame.stream].feed(frame.data), on_output)
            elif isinstance(frame, ExitFrame):
                run.exit = frame


async def _cleanup(
    client: CreateOSClient,
    sandbox_id: str,
    run: _Run,
    stdin_path: str | None,
    bound: CleanupBound,
    record: ProcessRecord | None,
) -> None:
    """Kill the tree if it may still run (3.8). A command that ran stages nothing that outlives
    it (the wrapper unlinks its stdin file first thing), so only a staged stdin file whose
    command may never have started is removed here, by one more request. Both share ``bound``."""
    confirmed = not run.creation_unknown
    with bound.scope():
        if run.process_id is not None and run.exit is None:
            confirmed = False  # stays False if the deadline ends the kill
            confirmed = await kill_tree(client, sandbox_id, run.process_id)
        if confirmed and record is not None and run.process_id is not None:
            await record.ended(run.process_id)
        if stdin_path is not None and run.exit is None:
            with contextlib.suppress(ProviderError):
                await client.exec(sandbox_id, "/bin/rm", ["-f", "--", stdin_path])
    if not confirmed:
        if run.process_id is None:
            raise CleanupUnconfirmed(
                "Starting the command failed in a way that leaves its outcome unknown: a process "
                "may be running unseen in the sandbox. Destroy the lease to recover."
            )
        raise CleanupUnconfirmed(
            f"Stopping the command's process tree ({run.process_id}) could not be confirmed; it "
            "may still be running. Destroy the lease to recover."
        )
