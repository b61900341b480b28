"""Command checks: the worker's own streamed-command path against the endpoint (3.9).

The worker runs every ordinary command as one exec stream whose bash wrapper names the
command's tree with a token and reads the exit status from ``/proc`` (see
:mod:`provider.driver.commands.command_script`). What that relies on in the sandbox is checked here
with the worker's own code:

- ``command_status``: an exit code and a death by signal come back told apart (``/proc/<pid>/stat``
  field 52 of a zombie, and the end markers through the stream);
- ``command_daemon``: a command that leaves a child holding stdout returns at its leader's exit;
- ``command_kill``: a command whose stream was dropped is found by its token in
  ``/proc/*/environ`` and killed, and the rescan confirms it (it also says whether the dropped
  stream had killed anything by itself).

Every command ends by itself or is killed, so nothing outlives the checks.
"""

from __future__ import annotations

from typing import Final

import anyio

from provider.createos.exec_stream import ExecOutput
from provider.doctor.checks_streams import Target
from provider.doctor.report import Finding, ok, violated
from provider.driver.commands.command_script import (
    TREE_VAR,
    kill_confirmed,
    kill_script,
    new_token,
    stream_wrapper,
)
from provider.driver.commands.execute import CommandResult, CommandSpec, run_command

COMMAND_TIMEOUT_S: Final = 30.0
DAEMON_HOLD_S: Final = 20
"""How long the daemon check's background child holds stdout (the call must return long before)."""


async def _run(target: Target, script: str) -> CommandResult:
    spec = CommandSpec("/bin/bash", ["-c", script], timeout=COMMAND_TIMEOUT_S)
    return await run_command(
        target.wire.client, target.sandbox_id, spec, on_output=None, cleanup_timeout=15.0
    )


async def command_status(target: Target) -> Finding:
    key = "command_status"
    coded = await _run(target, "echo out; exit 7")
    signalled = await _run(target, "echo out; kill -TERM $$")
    got = [
        (coded.exit_code, coded.signal, coded.stdout),
        (signalled.exit_code, signalled.signal, signalled.stdout),
    ]
    if got != [(7, None, "out\n"), (None, "SIGTERM", "out\n")]:
        shown = ", ".join(f"exitCode {code}, signal {sig}" for code, sig, _ in got)
        return violated(key, f"expected exit 7, then SIGTERM; got {shown}")
    return ok(key, "exit 7 and SIGTERM told apart, output whole")


async def command_daemon(target: Target) -> Finding:
    key = "command_daemon"
    started = anyio.current_time()
    result = await _run(target, f"(sleep {DAEMON_HOLD_S}; echo late) & echo leader")
    took = anyio.current_time() - started
    if result.exit_code != 0 or result.stdout != "leader\n":
        return violated(key, f"exitCode {result.exit_code}, output not as printed")
    if took >= DAEMON_HOLD_S:
        return violated(key, f"returned only after {took:.1f} s, when the child let go")
    return ok(key, f"returned after {took:.2f} s while the child held stdout")


async def command_kill(target: Target) -> Finding:
    """Start ``sleep`` under a token with a double-forked and a setsid child, drop the stream
    after its first output, then kill by the token and read the verdict."""
    key = "command_kill"
    token = new_token()
    script = stream_wrapper(
        nonce=new_token(),
        command="/bin/bash",
        args=["-c", "(sleep 300 &); setsid sleep 301 & echo started; sleep 302"],
        env={},
        cwd=None,
        timeout=120,
        stdin="none",
    )
    argv = [f"{TREE_VAR}={token}", "/bin/bash", "-lc", script]
    client = target.wire.client
    async with client.exec_stream(target.sandbox_id, "/usr/bin/env", argv) as events:
        async for event in events:
            if isinstance(event, ExecOutput) and "started" in event.text:
                break
    await anyio.sleep(1.0)  # what a hang-up kills, it has killed by now
    answer = await client.exec(target.sandbox_id, "/bin/bash", ["-c", kill_script(token)])
    verdict = answer.stdout.strip().splitlines()[-1:] or [""]
    if not kill_confirmed(answer.stdout):
        return violated(key, f"the kill by token was not confirmed: {verdict[0][:80]!r}")
    found = verdict[0].split()[1] if verdict[0].startswith("paperclip-kill ") else "?"
    return ok(
        key, f"after the hang-up {found.removeprefix('found=')} process(es) ran on; all killed"
    )
