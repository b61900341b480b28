"""Sandbox state changes the lease logic builds on: waiting for a state, confirmed deletion,
the process sweep.

``transition`` follows docs/protocol.md 2.2: read, submit pause/resume at most once when the
current state allows it, keep polling through transitional states (a fork's ``forking``
included), and fail on a state from which the wanted one cannot be reached.
``delete_sandbox_confirmed`` follows the delete routine of 2.5: a sandbox counts as gone only
when the API says ``destroyed`` or 404. ``stop_every_tree`` is the sweep of 2.10.4 (the warm
release, and capture in 8.3): every process tree still alive is killed and confirmed gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import Conflict, NotFound
from provider.createos.models import SANDBOX_STATES
from provider.driver.commands.command_script import EVERY_COMMAND, kill_confirmed, kill_script
from provider.errors import ProviderError

POLL_INTERVAL = 0.25
TRANSITIONAL = frozenset({"creating", "pausing", "resuming", "forking"})
KILL_GRACE_MS = 1000
COMMAND_PREFIX: Final = "cmd:"
"""How a streamed command's token is journaled among process ids."""


class SandboxStateError(ProviderError):
    """The sandbox is in a state from which the wanted one cannot be reached."""

    def __init__(self, message: str, *, status: str) -> None:
        super().__init__(message)
        self.status = status


async def read_status(client: CreateOSClient, sandbox_id: str) -> str:
    view = await client.get_sandbox(sandbox_id)
    if view.status not in SANDBOX_STATES:
        raise SandboxStateError(
            f"CreateOS reported an unknown state for sandbox {sandbox_id}.", status=view.status
        )
    return view.status


async def transition(
    client: CreateOSClient, sandbox_id: str, desired: Literal["running", "paused"]
) -> None:
    """Bring the sandbox to ``desired``; the caller's cancel scope is the deadline."""
    submitted = False
    while True:
        status = await read_status(client, sandbox_id)
        if status == desired:
            return
        can_submit = (desired == "running" and status in ("paused", "error")) or (
            desired == "paused" and status == "running"
        )
        if can_submit:
            if not submitted:
                try:
                    if desired == "running":
                        await client.resume_sandbox(sandbox_id)
                    else:
                        await client.pause_sandbox(sandbox_id)
                    submitted = True
                except Conflict:
                    pass  # the next read decides
        elif status not in TRANSITIONAL:
            raise SandboxStateError(
                f"Sandbox {sandbox_id} is {status} and cannot become {desired}.", status=status
            )
        await anyio.sleep(POLL_INTERVAL)


async def delete_sandbox_confirmed(client: CreateOSClient, sandbox_id: str) -> None:
    """Delete and wait until CreateOS confirms the sandbox is destroyed (or unknown)."""
    try:
        status = await client.delete_sandbox(sandbox_id)
    except NotFound:
        return
    while status != "destroyed":
        await anyio.sleep(POLL_INTERVAL)
        try:
            status = (await client.get_sandbox(sandbox_id)).status
        except NotFound:
            return
        # Any other status (a stale read right after the delete) keeps us polling; the
        # caller's deadline bounds the wait.


async def kill_tree(client: CreateOSClient, sandbox_id: str, process_id: str) -> bool:
    """``DELETE ?grace_ms=1000`` of one process tree: True once CreateOS confirms the tree gone
    (``tree_exited: true``, or 404: the process or its sandbox is gone), False when that could
    not be confirmed (any other failure). A journaled streamed command (``cmd:<token>``) is
    killed by its token instead (:func:`kill_command`)."""
    if process_id.startswith(COMMAND_PREFIX):
        return await kill_command(client, sandbox_id, process_id.removeprefix(COMMAND_PREFIX))
    try:
        view = await client.delete_process(sandbox_id, process_id, grace_ms=KILL_GRACE_MS)
    except NotFound:
        return True
    except ProviderError:
        return False
    return view.tree_exited


async def kill_command(
    client: CreateOSClient, sandbox_id: str, token: str, *, remove: Sequence[str] = ()
) -> bool:
    """One buffered exec of :func:`~provider.driver.commands.command_script.kill_script`: True once
    it reports that nothing carrying ``token`` is left (or the sandbox is gone: 404), False when
    that could not be confirmed. ``token`` ``"*"`` means every streamed command's tree."""
    try:
        result = await client.exec(
            sandbox_id, "/bin/bash", ["-c", kill_script(token, remove=remove)]
        )
    except NotFound:
        return True
    except ProviderError:
        return False
    return result.exit_code == 0 and kill_confirmed(result.stdout)


async def stop_every_tree(client: CreateOSClient, sandbox_id: str) -> bool:
    """Kill every listed process whose tree is alive (``DELETE ?grace_ms=1000``, 2.10.4): True
    once each answered ``tree_exited: true`` (or 404); False at the first kill that could not
    be confirmed (the caller decides what that poisons). Failures of the listing propagate.
    Streamed commands' trees (background children of finished commands included) go first, by
    one kill of every token."""
    if not await kill_command(client, sandbox_id, EVERY_COMMAND):
        return False
    for view in await client.list_processes(sandbox_id):
        if not view.tree_exited and not await kill_tree(client, sandbox_id, view.process_id):
            return False
    return True


def scratch_removal(path: str, *, parts: bool) -> tuple[str, list[str]]:
    """``POST /exec`` argv removing a sync scratch file at ``path``, and with ``parts`` every
    ``<path>.part-*`` too (a glob, so the parts of a pack or an upload that stopped halfway go
    too). Recovery removes journaled scratches with it without knowing the transfer wing."""
    if not parts:
        return "/bin/rm", ["-f", "--", path]
    return "/bin/bash", ["-c", 'rm -f -- "$1" "$1".part-*', "rm", path]
