"""Request dispatch: admin split, faults, rate limit, auth, routing, request log, request ids.

A handler answers by returning a response or raising :class:`~.jsend.ApiError`; a
:class:`~.guest.GuestGone` (the sandbox's supervisor is gone) from any handler is answered here,
once, as ``409 {"state": "sandbox is no longer running"}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from .core import EmulatorCore, Fault
from .guest import GuestGone
from .http_messages import Request, Response
from .ids import request_id
from .jsend import ApiError, conflict, default_for, error, fail, json_response, no_such_route

log = logging.getLogger("provider.emulator")

ADMIN_PREFIX = "/_emulator/"
SANDBOX_PATH = re.compile(r"^/v1/sandboxes/([^/]+)(?:/|$)")


@dataclass
class Ctx:
    """What a route handler gets."""

    core: EmulatorCore
    req: Request
    owner: str
    match: dict[str, str]
    fault: Fault | None = None
    extra_headers: list[tuple[str, str]] = field(default_factory=list)


RouteHandler = Callable[[Ctx], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: RouteHandler
    public: bool = False


def route(method: str, path: str, handler: RouteHandler, *, public: bool = False) -> Route:
    """``path`` uses ``{name}`` placeholders for one segment each."""
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path)
    return Route(method, re.compile(f"^{regex}$"), handler, public)


class Router:
    """Turns every HTTP request into a response; the admin API is handed to ``admin``."""

    def __init__(
        self,
        core: EmulatorCore,
        routes: list[Route],
        admin: Callable[[Request], Awaitable[Response]],
        access_log: bool = False,
    ) -> None:
        self.core = core
        self.routes = routes
        self.admin = admin
        self.access_log = access_log

    async def __call__(self, req: Request) -> Response:
        rid = request_id()
        if req.path.startswith(ADMIN_PREFIX) or req.path == ADMIN_PREFIX.rstrip("/"):
            response = await self.admin(req)
        else:
            response = await self._dispatch(req)
        response.headers.append(("X-Request-ID", rid))
        return response

    def _auth(self, req: Request, public: bool) -> tuple[str, str | None]:
        key = req.headers.get("x-api-key")
        if key is None:
            return ("public" if public else "missing"), None
        owner = self.core.keys.get(key)
        if owner is None:
            return ("public" if public else "invalid"), None
        return "ok", owner

    def _find(self, req: Request) -> tuple[Route | None, dict[str, str], bool]:
        path_matched = False
        for candidate in self.routes:
            found = candidate.pattern.match(req.path)
            if found is None:
                continue
            path_matched = True
            if candidate.method == req.method:
                return candidate, found.groupdict(), True
        return None, {}, path_matched

    def _activity(self, req: Request, owner: str | None) -> None:
        """A request naming one of the caller's sandboxes (``/v1/sandboxes/{id}`` and below,
        any method, whatever its outcome) restarts that sandbox's idle clock as it starts."""
        named = SANDBOX_PATH.match(req.path)
        if named is None or owner is None:
            return
        sandbox = self.core.find(owner, named.group(1))
        if sandbox is not None:
            sandbox.touch()

    async def _dispatch(self, req: Request) -> Response:
        core = self.core
        found, match, path_known = self._find(req)
        auth, owner = self._auth(req, found.public if found is not None else False)
        self._activity(req, owner)
        fault = core.take_fault(req.method, req.path)
        response: Response | None = None
        performed = False
        if fault is not None:
            if fault.delay_ms:
                await anyio.sleep(fault.delay_ms / 1000)
            if fault.drop:
                response = Response(0, drop=True)
            elif fault.status is not None:
                response = _fault_status(fault)
            elif fault.stream_lines is not None:
                response = _fault_stream(fault.stream_lines)
        if response is None:
            performed = True
            response = await self._perform(req, found, match, path_known, auth, owner, fault)
        if fault is not None:
            if fault.cut_after_bytes is not None:
                response.cut_after_bytes = fault.cut_after_bytes
            if fault.lose_response and performed:
                status = response.status
                await _discard(response)
                response = Response(status, drop=True)
        status = 0 if response.drop and not (fault and fault.lose_response) else response.status
        core.record(req.method, req.path, req.query, auth, status)
        if self.access_log:
            query = "?" + req.query if req.query else ""
            log.info("%s %s%s -> %s", req.method, req.path, query, status)
        return Response(0, drop=True) if response.drop else response

    async def _perform(
        self,
        req: Request,
        found: Route | None,
        match: dict[str, str],
        path_known: bool,
        auth: str,
        owner: str | None,
        fault: Fault | None,
    ) -> Response:
        limited = self.core.rate_limited(req.client)
        if limited is not None:
            return fail(429, {"rate": "rate limit exceeded"}, [("Retry-After", str(limited))])
        if found is None:
            if path_known:
                return fail(405, {"method": f"{req.method} not allowed on this path"})
            return no_such_route().response()
        if not found.public and owner is None:
            return fail(401, {"auth": "missing or invalid API key"})
        ctx = Ctx(self.core, req, owner or "", match, fault)
        try:
            return await found.handler(ctx)
        except ApiError as exc:
            return exc.response()
        except GuestGone:  # the one translation: any handler's guest loss is a 409
            return conflict("sandbox is no longer running").response()


def _fault_status(fault: Fault) -> Response:
    status = fault.status or 500
    response = json_response(status, fault.body) if fault.body is not None else default_for(status)
    if fault.retry_after is not None:
        response.headers.append(("Retry-After", fault.retry_after))
    return response


def _fault_stream(lines: list[str]) -> Response:
    async def body() -> AsyncIterator[list[bytes]]:
        for line in lines:
            yield [line.encode() + b"\n"]

    return Response(200, content_type="application/x-ndjson", stream=body())


async def _discard(response: Response) -> None:
    """Release what a response holds when it is deliberately not sent."""
    import os

    if response.file is not None:
        os.close(response.file.fd)
    stream: Any = response.stream
    if stream is not None and hasattr(stream, "aclose"):
        await stream.aclose()


def internal_error(_req: Request) -> Response:
    return error(500, "internal emulator error")
