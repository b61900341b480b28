"""Managed process routes: create, list, get, connect, input, stdin close, signal, wait, delete."""

from __future__ import annotations

import binascii
import contextlib
import os
import signal

import anyio

from .guest import GuestGone, GuestOpError
from .http_messages import Response
from .journal import follow
from .jsend import ApiError, bad_request, conflict, fail, not_found, ok
from .processes import MAX_INPUT, MAX_QUEUED_INPUT, SIGNALS, ManagedProcess
from .route_inputs import HOME, call_env, command_fields, json_body, require_running, sandbox_of
from .router import Ctx, Route, route
from .sandboxes import Sandbox

DEFAULT_CMD = "/bin/bash"
DEFAULT_WAIT_MS = 30_000
MAX_WAIT_MS = 600_000


def process_of(ctx: Ctx) -> tuple[Sandbox, ManagedProcess]:
    sandbox = sandbox_of(ctx)
    process = sandbox.processes.get(ctx.match["pid"])
    if process is None:
        raise not_found("process")
    return sandbox, process


def _int_param(ctx: Ctx, name: str, default: int) -> int:
    raw = ctx.req.params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise bad_request(name, f"{name} must be an integer") from exc
    if value < 0:
        raise bad_request(name, f"{name} must not be negative")
    return value


async def create_process(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    body = await json_body(ctx, required=False)
    require_running(sandbox)
    pty = _pty_size(body.get("pty"), "pty")
    cmd, args = command_fields(body, default_cmd=DEFAULT_CMD)
    cwd = body.get("cwd") or HOME
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise bad_request("cwd", "cwd must be an absolute path")
    env = call_env(sandbox, body.get("env"))
    sandbox.touch()
    try:
        process = await sandbox.start_process(cmd, args, env, cwd, pty)
    except GuestOpError as exc:
        field = "cwd" if exc.code == "cwd" else "cmd"
        raise bad_request(field, exc.message) from exc
    ctx.core.register_process(sandbox, process)
    return ok(process.view())


async def list_processes(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    return ok({"processes": [p.view() for p in sandbox.processes.values()]})


async def get_process(ctx: Ctx) -> Response:
    _sandbox, process = process_of(ctx)
    return ok(process.view())


async def connect(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    require_running(sandbox)
    after = _int_param(ctx, "after", 0)
    journal = process.journal
    if journal.expired(after):
        return fail(
            410,
            {
                "error": "output_offset_expired",
                "oldest_available_seq": journal.oldest_seq,
                "code": "output_offset_expired",
            },
        )
    sandbox.touch()
    limit = ctx.fault.cut_after_frames if ctx.fault is not None else None
    heartbeat = ctx.core.settings.heartbeat_ms / 1000
    stream = follow(journal, after, heartbeat, frame_limit=limit)
    response = Response(200, content_type="application/x-ndjson", stream=stream)
    if limit is not None:
        response.cut_after_bytes = None
        response.headers.append(("X-Emulator-Cut", "frames"))
    return response


async def send_input(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    body = await json_body(ctx)
    require_running(sandbox)
    raw = body.get("data_base64")
    if not isinstance(raw, str):
        raise bad_request("data_base64", "data_base64 is required")
    try:
        data = binascii.a2b_base64(raw.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise bad_request("data_base64", "data_base64 is not valid base64") from exc
    if len(data) > MAX_INPUT:
        raise ApiError(413, {"data_base64": "at most 256 KiB per request"})
    if process.stdin.closed:
        raise conflict("stdin is closed")
    if process.stdin.queued + len(data) > MAX_QUEUED_INPUT:
        raise conflict("the process is not reading its stdin")
    process.stdin.push(data)
    process.input_seq += 1
    sandbox.touch()
    return ok({"input_seq": process.input_seq})


async def close_stdin(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    require_running(sandbox)
    if process.kind == "pty":
        raise conflict("stdin/close is for pipe processes")
    # Closing the stdin of a process that already ended succeeds (the official Python SDK's
    # managed_process example closes right after its input, racing the exit); only a second
    # close by the client is a conflict.
    if process.stdin.closed_by_client:
        raise conflict("stdin is already closed")
    process.stdin.closed_by_client = True
    process.stdin.close()
    return ok({"ok": True})


async def resize(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    body = await json_body(ctx)
    require_running(sandbox)
    size = _pty_size(body, "size", required=True)
    if process.pty_fd is None or size is None:
        raise conflict("resize needs a running PTY process")
    process.resize(size["rows"], size["cols"])
    return ok({"ok": True})


def _pty_size(raw: object, field: str, *, required: bool = False) -> dict[str, int] | None:
    """A terminal size: integer ``rows`` and ``cols`` from 1 to 1000 (bools and strings are
    refused). At create a missing one defaults to 24 x 80; a resize must name both."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad_request(field, "must be an object with rows and cols")
    if required and not ("rows" in raw and "cols" in raw):
        raise bad_request(field, "rows and cols are required")
    size = {"rows": raw.get("rows", 24), "cols": raw.get("cols", 80)}
    for name, value in size.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
            raise bad_request(field, f"{name} must be an integer from 1 to 1000")
    return size


async def send_signal(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    body = await json_body(ctx)
    require_running(sandbox)
    name = body.get("signal")
    if name not in SIGNALS:
        raise bad_request("signal", f"signal must be one of {', '.join(SIGNALS)}")
    delivered = False
    group = process.foreground_group()
    if group is not None:  # PTY: the foreground job, as a terminal would
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.Signals[name])
            delivered = True
    elif not process.tree_exited:
        with contextlib.suppress(GuestGone):
            reply, _fds = await sandbox.request("signal", pgid=process.pid, signal=name)
            delivered = bool(reply.get("delivered"))
    sandbox.touch()
    return ok({"ok": True, "delivered": delivered})


async def wait(ctx: Ctx) -> Response:
    _sandbox, process = process_of(ctx)
    scope = ctx.req.params.get("scope", "leader") or "leader"
    if scope not in ("leader", "tree"):
        raise bad_request("scope", "scope must be leader or tree")
    timeout = min(_int_param(ctx, "timeout_ms", DEFAULT_WAIT_MS), MAX_WAIT_MS) / 1000
    with anyio.move_on_after(timeout):
        await process.finished.wait()
        if scope == "tree":
            await process.watch.tree_gone.wait()
        return ok(process.view())
    raise ApiError(408, {"timeout": "process is still running"})


async def delete_process(ctx: Ctx) -> Response:
    sandbox, process = process_of(ctx)
    grace = _int_param(ctx, "grace_ms", 1000)
    if sandbox.guest is None:
        raise conflict(f"sandbox is {sandbox.status}")
    if sandbox.status in ("paused", "pausing") and not process.tree_exited:
        raise conflict(f"sandbox is {sandbox.status}")
    await process.kill_tree(sandbox.guest, grace)
    return ok(process.view())


ROUTES: list[Route] = [
    route("POST", "/v1/sandboxes/{sid}/processes", create_process),
    route("GET", "/v1/sandboxes/{sid}/processes", list_processes),
    route("GET", "/v1/sandboxes/{sid}/processes/{pid}", get_process),
    route("DELETE", "/v1/sandboxes/{sid}/processes/{pid}", delete_process),
    route("GET", "/v1/sandboxes/{sid}/processes/{pid}/connect", connect),
    route("POST", "/v1/sandboxes/{sid}/processes/{pid}/input", send_input),
    route("POST", "/v1/sandboxes/{sid}/processes/{pid}/stdin/close", close_stdin),
    route("POST", "/v1/sandboxes/{sid}/processes/{pid}/resize", resize),
    route("POST", "/v1/sandboxes/{sid}/processes/{pid}/signal", send_signal),
    route("GET", "/v1/sandboxes/{sid}/processes/{pid}/wait", wait),
]
