"""One-shot exec (buffered and NDJSON stream) and the files API (PUT / GET by absolute path)."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .guest import ExitInfo, GuestGone, GuestOpError
from .http_messages import FileBody, Response
from .jsend import ApiError, bad_request, conflict, ok
from .processes import run_exec
from .route_inputs import json_body, require_running, sandbox_of
from .router import Ctx, Route, route
from .sandboxes import Sandbox

EXEC_OUTPUT_CAP = 64 << 20
WRITE_BATCH = 4 << 20
HOME = "/root"


def call_env(sandbox: Sandbox, raw: Any) -> dict[str, str]:
    """Per-call env: only keys declared at create time may be set."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise bad_request("env", "env must map names to strings")
    for key in raw:
        if key not in sandbox.spec.envs:
            raise bad_request("env", f"undeclared env key: {key}")
    return dict(raw)


def command_fields(body: dict[str, Any], *, default_cmd: str | None) -> tuple[str, list[str]]:
    cmd = body.get("cmd", default_cmd)
    if not isinstance(cmd, str) or not cmd:
        raise bad_request("cmd", "cmd is required")
    args = body.get("args", [])
    if args is None:
        args = []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad_request("args", "args must be a list of strings")
    return cmd, args


def exit_code_of(info: ExitInfo) -> int:
    if info.signal is not None:
        return 128 + int(signal.Signals[info.signal])
    return info.code if info.code is not None else -1


def _guest_gone() -> ApiError:
    return conflict("sandbox is no longer running")


# -- exec ---------------------------------------------------------------------------------
async def exec_command(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    body = await json_body(ctx)
    require_running(sandbox)
    cmd, args = command_fields(body, default_cmd=None)
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise bad_request("stdin", "stdin must be a string")
    env = call_env(sandbox, body.get("env"))
    streaming = (
        ctx.req.params.get("stream", "").lower() in ("1", "true") or body.get("stream") is True
    )
    sandbox.touch()
    started = anyio.current_time()
    try:
        pid, fds, watch = await sandbox.spawn(cmd, args, env, HOME)
    except GuestOpError as exc:
        if streaming:
            return _ndjson_lines([{"error": exc.message}, {"exit_code": -1}])
        result = {"stdout": "", "stderr": "", "exit_code": -1, "error": exc.message}
        return ok({"result": result, "exec_ms": _ms(started)})
    except GuestGone as exc:
        raise _guest_gone() from exc
    payload = (stdin or "").encode()
    if streaming:
        return _stream_exec(ctx, sandbox, fds, watch, payload)
    buffers: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    async def collect(stream: str, data: bytes) -> None:
        buf = buffers[stream]
        if len(buf) < EXEC_OUTPUT_CAP:
            buf += data[: EXEC_OUTPUT_CAP - len(buf)]

    assert sandbox.guest is not None
    info = await run_exec(sandbox.guest, fds, watch, payload, ctx.core.settings, collect)
    result = {
        "stdout": buffers["stdout"].decode("utf-8", "replace"),
        "stderr": buffers["stderr"].decode("utf-8", "replace"),
        "exit_code": exit_code_of(info),
    }
    _ = pid
    return ok({"result": result, "exec_ms": _ms(started)})


def _ms(started: float) -> float:
    return round((anyio.current_time() - started) * 1000, 1)


def _ndjson_lines(lines: list[dict[str, Any]]) -> Response:
    async def body() -> AsyncIterator[list[bytes]]:
        for line in lines:
            yield [json.dumps(line).encode() + b"\n"]

    return Response(200, content_type="application/x-ndjson", stream=body())


def _stream_exec(
    ctx: Ctx, sandbox: Sandbox, fds: list[int], watch: Any, payload: bytes
) -> Response:
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](64)
    decoders = {
        name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")
    }

    async def produce(out: MemoryObjectSendStream[dict[str, Any]]) -> None:
        async def forward(stream: str, data: bytes) -> None:
            text = decoders[stream].decode(data)
            if text:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await out.send({stream: text})

        async with out:
            assert sandbox.guest is not None
            info = await run_exec(
                sandbox.guest, fds, watch, payload, ctx.core.settings, forward, until_eof=True
            )
            for name, decoder in decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await out.send({name: tail})
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await out.send({"exit_code": exit_code_of(info)})

    sandbox.start_soon(lambda: produce(send))
    heartbeat = ctx.core.settings.heartbeat_ms / 1000
    return Response(200, content_type="application/x-ndjson", stream=_relay(receive, heartbeat))


async def _relay(
    receive: MemoryObjectReceiveStream[dict[str, Any]], heartbeat: float
) -> AsyncIterator[list[bytes]]:
    async with receive:
        while True:
            item: dict[str, Any] | None = None
            ended = False
            with anyio.move_on_after(heartbeat):
                try:
                    item = await receive.receive()
                except anyio.EndOfStream:
                    ended = True
            if ended:
                return
            if item is None:
                yield [b'{"hb":true}\n']
                continue
            yield [json.dumps(item).encode() + b"\n"]


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
    except GuestGone as exc:
        raise _guest_gone() from exc
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
        except GuestGone as exc:
            raise _guest_gone() from exc
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
    except GuestGone as exc:
        raise _guest_gone() from exc
    return Response(
        200, content_type="application/octet-stream", file=FileBody(fds[0], int(reply["size"]))
    )


ROUTES: list[Route] = [
    route("POST", "/v1/sandboxes/{sid}/exec", exec_command),
    route("PUT", "/v1/sandboxes/{sid}/files", put_file),
    route("GET", "/v1/sandboxes/{sid}/files", get_file),
]
