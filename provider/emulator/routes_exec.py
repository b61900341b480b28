"""One-shot exec (buffered, or streamed by ``exec_stream.py``) and the files API (PUT / GET by
absolute path)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import anyio

from .exec_stream import exit_code_of, ndjson_lines, stream_exec
from .guest import ChildWatch, GuestGone, GuestOpError
from .http_messages import FileBody, Response
from .jsend import ApiError, bad_request, no_such_route, ok
from .processes import run_exec
from .route_inputs import HOME, call_env, command_fields, json_body, require_running, sandbox_of
from .router import Ctx, Route, route

EXEC_OUTPUT_CAP = 64 << 20
WRITE_BATCH = 4 << 20


# -- exec ---------------------------------------------------------------------------------
async def exec_command(ctx: Ctx) -> Response:
    settings = ctx.core.settings
    streaming = ctx.req.params.get("stream", "").lower() in ("1", "true")
    if streaming and not settings.exec_stream:
        raise no_such_route()  # an older server: the streamed exec is an unknown route
    sandbox = sandbox_of(ctx)
    body = await json_body(ctx, limit=settings.max_exec_body_bytes)
    streaming = streaming or body.get("stream") is True
    if streaming and not settings.exec_stream:
        raise no_such_route()
    require_running(sandbox)
    cmd, args = command_fields(body, default_cmd=None)
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise bad_request("stdin", "stdin must be a string")
    env = call_env(sandbox, body.get("env"))
    sandbox.touch()
    started = anyio.current_time()
    try:
        _pid, fds, watch = await sandbox.spawn(cmd, args, env, HOME)
    except GuestOpError as exc:
        if streaming:
            return ndjson_lines([{"error": exc.message}, {"exit_code": -1}])
        result = {"stdout": "", "stderr": "", "exit_code": -1, "error": exc.message}
        return ok({"result": result, "exec_ms": _ms(started)})
    entry = ctx.core.record_exec(sandbox, cmd, args, streamed=streaming)
    sandbox.start_soon(lambda: _note_exit(watch, entry))
    payload = (stdin or "").encode()
    if streaming:
        cut = ctx.fault.cut_after_frames if ctx.fault is not None else None
        return stream_exec(sandbox, fds, watch, payload, settings, cut)
    buffers: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    async def collect(stream: str, data: bytes) -> None:
        buf = buffers[stream]
        if len(buf) < EXEC_OUTPUT_CAP:
            buf += data[: EXEC_OUTPUT_CAP - len(buf)]

    assert sandbox.guest is not None
    info = await run_exec(sandbox.guest, fds, watch, payload, settings, collect)
    result = {
        "stdout": buffers["stdout"].decode("utf-8", "replace"),
        "stderr": buffers["stderr"].decode("utf-8", "replace"),
        "exit_code": exit_code_of(info),
    }
    return ok({"result": result, "exec_ms": _ms(started)})


async def _note_exit(watch: ChildWatch, entry: dict[str, Any]) -> None:
    await watch.exited.wait()
    entry["exited"] = time.time()


def _ms(started: float) -> float:
    return round((anyio.current_time() - started) * 1000, 1)


# -- files --------------------------------------------------------------------------------
_PATH_STATUS = {"not_found": 404, "os": 500}


def _file_error(exc: GuestOpError) -> ApiError:
    status = _PATH_STATUS.get(exc.code, 400)
    return ApiError(status, {"path": exc.message})


def _path_param(ctx: Ctx) -> str:
    path = ctx.req.params.get("path")
    if not path:
        raise bad_request("path", "path query parameter is required")
    if not path.startswith("/"):
        raise bad_request("path", "path must be absolute")
    return path


def _write_all(fd: int, chunks: list[bytes]) -> None:
    views = [memoryview(c) for c in chunks]
    while views:
        written = os.writev(fd, views[:512])
        while written:
            if written >= len(views[0]):
                written -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][written:]
                written = 0


async def put_file(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    require_running(sandbox)
    path = _path_param(ctx)
    limit = ctx.core.settings.max_file_bytes
    if ctx.req.content_length is not None and ctx.req.content_length > limit:
        raise ApiError(413, {"file": f"file exceeds {limit} bytes"})
    sandbox.touch()
    try:
        reply, fds = await sandbox.request("open_write", path=path)
    except GuestOpError as exc:
        raise _file_error(exc) from exc
    fd, tmp, target = fds[0], str(reply["tmp"]), str(reply["target"])
    committed = False
    size = 0
    try:
        pending: list[bytes] = []
        pending_size = 0
        async for chunk in ctx.req.body_chunks():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, {"file": f"file exceeds {limit} bytes"})
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= WRITE_BATCH:
                await anyio.to_thread.run_sync(_write_all, fd, pending)
                pending, pending_size = [], 0
        if pending:
            await anyio.to_thread.run_sync(_write_all, fd, pending)
        try:
            await sandbox.request("commit", tmp=tmp, target=target)
        except GuestOpError as exc:
            raise _file_error(exc) from exc
        committed = True
    finally:
        os.close(fd)
        if not committed:
            with anyio.CancelScope(shield=True), contextlib.suppress(GuestGone, GuestOpError):
                await sandbox.request("abort", tmp=tmp)
    sandbox.touch()
    return ok({"bytes": size, "path": path})


async def get_file(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    require_running(sandbox)
    path = _path_param(ctx)
    sandbox.touch()
    try:
        reply, fds = await sandbox.request("open_read", path=path)
    except GuestOpError as exc:
        raise _file_error(exc) from exc
    return Response(
        200, content_type="application/octet-stream", file=FileBody(fds[0], int(reply["size"]))
    )


ROUTES: list[Route] = [
    route("POST", "/v1/sandboxes/{sid}/exec", exec_command),
    route("PUT", "/v1/sandboxes/{sid}/files", put_file),
    route("GET", "/v1/sandboxes/{sid}/files", get_file),
]
