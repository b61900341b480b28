"""The doctor's run: one sandbox, three phases of checks, and a cleanup that always runs.

1. Create the sandbox (not armed: an idle pause must not freeze the stream checks' commands)
   and wait until it runs.
2. Concurrently: the stream checks, ``PUT /files`` parents, another key's view, and the list
   filter while the sandbox runs. Every command they start ends by itself.
3. Alone (nothing else may touch the sandbox): the in-guest agent pauses the sandbox on request
   (it is resumed after); then arm the idle pause, then the auto-pause and keepalive check.
4. With the sandbox paused (paused explicitly when it did not pause itself): the list filter
   again and the answers of a paused sandbox.

Each check runs under its own deadline, and a check that fails (an API error, a timeout, a bug)
becomes a ``violated`` row while the others go on. The whole run has a deadline too; it and
Ctrl-C (a cancel of the caller's scope) stop the checks, never the cleanup: every sandbox the
doctor created (and one whose create answer was lost, found by its unique name) is deleted
under a fresh, shielded scope bounded by :data:`CLEANUP_S`. A delete that cannot be confirmed
(neither 2xx nor 404) is listed in :attr:`RunResult.left_behind`.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio

from provider.createos.errors import APIStatusError, CreateOSError, NotFound
from provider.doctor import checks_agent as agent_checks
from provider.doctor import checks_commands as command_checks
from provider.doctor import checks_sandbox as sandbox_checks
from provider.doctor import checks_streams as stream_checks
from provider.doctor.checks_streams import Target
from provider.doctor.report import Finding, complete, violated
from provider.doctor.wire import Wire, never_sent

CLEANUP_S: Final = 60.0
SETUP_S: Final = 180.0
CHECK_S: Final = 120.0


@dataclass(frozen=True)
class Options:
    origin: str
    api_key: str = field(repr=False)
    second_api_key: str | None = field(default=None, repr=False)
    shape: str = "s-1vcpu-1gb"
    rootfs: str | None = None
    auto_pause_seconds: int = 60
    stream_seconds: float = 35.0
    deadline_s: float = 900.0


@dataclass
class RunResult:
    """What the run found and left; filled as it goes, so an interrupted run still reports."""

    found: list[Finding] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)
    setup_error: str | None = None
    stopped: str | None = None
    requests: int = 0
    pending_name: str | None = None

    def findings(self) -> list[Finding]:
        reason = self.stopped or ("no sandbox to check" if self.setup_error else "not reached")
        return complete(self.found, reason)


class SetupFailed(Exception):
    """The sandbox could not be created or started: nothing can be checked."""


Say = Callable[[str], None]


async def run(
    options: Options,
    result: RunResult,
    *,
    say: Say = lambda _: None,
) -> None:
    """Run every check into ``result``; cleanup is shielded, so it also runs on a cancel."""
    wire = Wire(options.origin, options.api_key)
    other = Wire(options.origin, options.second_api_key) if options.second_api_key else None
    try:
        with anyio.move_on_after(options.deadline_s) as scope:
            try:
                await _phases(options, wire, other, result, say)
            except SetupFailed as exc:
                result.setup_error = str(exc)
        if scope.cancelled_caught:
            result.stopped = f"the doctor's deadline ({options.deadline_s:g} s) passed"
    finally:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(CLEANUP_S):
                await _cleanup(wire, result, say)
            result.left_behind = [i for i in result.created if i not in result.deleted]
            if result.pending_name is not None:
                result.left_behind.append(f"a sandbox named {result.pending_name}, if created")
            seen = wire.seen + (other.seen if other else [])
            result.found.append(sandbox_checks.retry_after(seen))
            result.requests = len(seen)
            for each in (wire, other):
                if each is not None:
                    await each.aclose()


async def _phases(
    options: Options, wire: Wire, other: Wire | None, result: RunResult, say: Say
) -> None:
    sandbox_id = await _create(options, wire, result, say)
    target = Target(wire, sandbox_id, options.stream_seconds)
    stream_s = options.stream_seconds + CHECK_S
    say(f"checking streams, files and the list filter ({options.stream_seconds:g} s)")
    filter_violation: list[Finding] = []
    async with anyio.create_task_group() as group:
        for key, check, limit in (
            ("connect_heartbeat", stream_checks.connect_heartbeat, stream_s),
            ("exec_heartbeat", stream_checks.exec_heartbeat, stream_s),
            ("exec_stream_end", stream_checks.exec_stream_end, stream_s),
            ("command_status", command_checks.command_status, CHECK_S),
            ("command_daemon", command_checks.command_daemon, CHECK_S),
            ("command_kill", command_checks.command_kill, CHECK_S),
            ("put_creates_parents", sandbox_checks.put_creates_parents, CHECK_S),
        ):
            group.start_soon(_guarded, result.found, [key], limit, _one(check, target))
        group.start_soon(
            _guarded,
            result.found,
            ["foreign_sandbox"],
            CHECK_S,
            _one(lambda t: sandbox_checks.foreign_sandbox(t, other), target),
        )
        group.start_soon(
            _guarded,
            filter_violation,
            ["list_paused_filter"],
            CHECK_S,
            _optional(sandbox_checks.paused_filter_while_running, target),
        )
    result.found.extend(filter_violation)
    say("checking the in-guest agent: the sandbox pauses itself, then it is resumed")
    await _guarded(
        result.found,
        ["guest_agent_pause"],
        2 * CHECK_S,
        _one(agent_checks.guest_agent_pause, target),
    )
    window = options.auto_pause_seconds
    say(f"checking the idle auto-pause of a {window} s window (about {4 * window} s)")
    await _guarded(
        result.found,
        ["idle_pause", "get_resets_idle"],
        4 * window + 2 * CHECK_S,
        lambda: sandbox_checks.idle_pause(target, window),
    )
    say("checking a paused sandbox")
    try:
        with anyio.fail_after(CHECK_S):
            await _ensure_paused(wire, sandbox_id)
    except (CreateOSError, TimeoutError) as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else str(exc)
        result.stopped = f"the sandbox could not be paused ({why})"
        return
    if not filter_violation:
        await _guarded(
            result.found,
            ["list_paused_filter"],
            CHECK_S,
            _one(sandbox_checks.paused_filter_while_paused, target),
        )
    await _guarded(
        result.found, ["paused_sandbox"], CHECK_S, _one(sandbox_checks.paused_sandbox, target)
    )


def _one(
    check: Callable[[Target], Awaitable[Finding]], target: Target
) -> Callable[[], Awaitable[list[Finding]]]:
    async def call() -> list[Finding]:
        return [await check(target)]

    return call


def _optional(
    check: Callable[[Target], Awaitable[Finding | None]], target: Target
) -> Callable[[], Awaitable[list[Finding]]]:
    async def call() -> list[Finding]:
        finding = await check(target)
        return [] if finding is None else [finding]

    return call


async def _guarded(
    into: list[Finding],
    keys: Sequence[str],
    limit: float,
    check: Callable[[], Awaitable[list[Finding]]],
) -> None:
    """Run one check under ``limit`` seconds; its failure is a violated row for each key."""
    try:
        with anyio.fail_after(limit):
            found = await check()
    except TimeoutError:
        found = [violated(key, f"no answer within {limit:g} s") for key in keys]
    except CreateOSError as exc:
        found = [violated(key, str(exc)) for key in keys]
    except Exception as exc:  # a check's own bug must not stop the others or the cleanup
        found = [violated(key, f"the check failed: {type(exc).__name__}: {exc}") for key in keys]
    into.extend(found)


async def _create(options: Options, wire: Wire, result: RunResult, say: Say) -> str:
    name = f"pc-doctor-{secrets.token_hex(6)}"
    say(f"creating sandbox {name} (shape {options.shape}); it is deleted at the end")
    result.pending_name = name  # until the answer arrives, cleanup looks the name up
    try:
        with anyio.fail_after(SETUP_S):
            sandbox_id, _ = await wire.client.create_sandbox_status(
                shape=options.shape,
                name=name,
                rootfs=options.rootfs,
                region=None,
            )
            result.created.append(sandbox_id)
            result.pending_name = None
            view = await sandbox_checks.wait_status(wire, sandbox_id, ("running",))
    except TimeoutError:
        raise SetupFailed(f"the sandbox was not running within {SETUP_S:g} s") from None
    except CreateOSError as exc:
        if (isinstance(exc, APIStatusError) and exc.rejected) or never_sent(exc):
            result.pending_name = None  # a refused or never sent create made nothing
        raise SetupFailed(f"could not create the sandbox: {exc}") from exc
    if view.status != "running":
        raise SetupFailed(f"the new sandbox went {view.status} instead of running")
    say(f"sandbox {sandbox_id} is running")
    return sandbox_id


async def _ensure_paused(wire: Wire, sandbox_id: str) -> None:
    view = await wire.client.get_sandbox(sandbox_id)
    if view.status == "running":
        await wire.client.pause_sandbox(sandbox_id)
    view = await sandbox_checks.wait_status(wire, sandbox_id, ("paused",))
    if view.status != "paused":
        raise CreateOSError(f"the sandbox is {view.status}, not paused")


async def _cleanup(wire: Wire, result: RunResult, say: Say) -> None:
    """Delete every sandbox created; a create whose answer was lost is found by its name."""
    if result.pending_name is not None:
        with anyio.move_on_after(CHECK_S):
            try:
                views = await wire.client.list_sandboxes()
            except CreateOSError as exc:
                say(f"could not look for sandbox {result.pending_name}: {exc}")
            else:
                result.created += [v.id for v in views if v.name == result.pending_name]
                result.pending_name = None
    for sandbox_id in result.created:
        try:
            await wire.client.delete_sandbox(sandbox_id)
        except NotFound:
            pass
        except CreateOSError as exc:
            say(f"could not confirm the delete of {sandbox_id}: {exc}")
            continue
        result.deleted.append(sandbox_id)
        say(f"deleted sandbox {sandbox_id}")
