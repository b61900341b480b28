"""Catalog, whoami and sandbox routes: create, get, list, delete, pause, resume, patch,
egress and fork.

Request bodies are read and checked by ``route_inputs.py``; the handlers here apply them to the
core and the sandboxes (create and fork boot the guest, fork copies the trees in the background).
"""

from __future__ import annotations

import dataclasses
import logging

import anyio

from . import catalog
from .http_messages import Response
from .ids import random_name
from .images import ImageError
from .jsend import ApiError, bad_request, conflict, error, ok
from .route_inputs import (
    bool_field,
    build_spec,
    json_body,
    refuse_bandwidth_quota,
    sandbox_of,
    validate_auto_pause,
    validate_egress,
    validate_envs,
)
from .router import Ctx, Route, route
from .sandboxes import Sandbox

log = logging.getLogger("provider.emulator")


# -- catalog ------------------------------------------------------------------------------
async def healthz(ctx: Ctx) -> Response:
    return ok({"up": True})


async def readyz(ctx: Ctx) -> Response:
    return ok({"ready": True})


async def shapes(ctx: Ctx) -> Response:
    return ok(catalog.paginate(catalog.shapes(), ctx.req.params))


async def rootfs(ctx: Ctx) -> Response:
    return ok(ctx.core.images.view())


async def whoami(ctx: Ctx) -> Response:
    stats = {"running": 0, "paused": 0, "other": 0, "total": 0}
    for sandbox in ctx.core.owned(ctx.owner):
        if not sandbox.live:
            continue
        key = sandbox.status if sandbox.status in ("running", "paused") else "other"
        stats[key] += 1
        stats["total"] += 1
    return ok({"user_id": "user_" + ctx.owner, "stats": stats})


# -- sandboxes ----------------------------------------------------------------------------
async def create(ctx: Ctx) -> Response:
    body = await json_body(ctx)
    spec = build_spec(ctx, body)
    core = ctx.core
    if core.settings.no_credit:
        raise ApiError(402, {"credit": "insufficient credit"})
    sandbox = core.new_sandbox(spec, ctx.owner)
    if core.settings.create_mode == "async":
        core.start_soon(lambda: _boot_later(ctx, sandbox))
        return _created(ctx, sandbox)
    try:
        await core.boot(sandbox)
    except ImageError as exc:
        log.warning("sandbox %s could not be started: %s", sandbox.id, exc)
        return error(503, f"sandbox could not be started: {exc}")
    except Exception:
        if not sandbox.closed:  # deleted while it booted: failing is what it should do
            log.exception("sandbox %s could not be started", sandbox.id)
        return error(503, "sandbox could not be started")
    await anyio.sleep(core.settings.create_delay_ms / 1000)
    if sandbox.status == "creating":
        sandbox.mark_running()
    return _created(ctx, sandbox)


# The create answer the TS SDK describes (its CreateSandboxResponse): no ``status`` and none of
# the other view-only fields.
CREATE_RESPONSE_FIELDS = frozenset(
    [
        "id",
        "name",
        "ip",
        "shape",
        "rootfs",
        "vcpu",
        "mem_mib",
        "disk_mib",
        "spawn_ms",
        "egress",
        "bandwidth_quota_bytes",
        "ingress_url_template",
    ]
)


def _created(ctx: Ctx, sandbox: Sandbox) -> Response:
    """The create answer: the full view, or with ``create_omits_status`` the TS SDK's body (a
    client then has to read the status itself)."""
    view = sandbox.create_view()
    if ctx.core.settings.create_omits_status:
        view = {name: value for name, value in view.items() if name in CREATE_RESPONSE_FIELDS}
    return ok(view)


async def _boot_later(ctx: Ctx, sandbox: Sandbox) -> None:
    try:
        await ctx.core.boot(sandbox)
    except Exception:
        if not sandbox.closed:
            log.exception("sandbox %s could not be started", sandbox.id)
        return
    await anyio.sleep(ctx.core.settings.create_delay_ms / 1000)
    if sandbox.status == "creating":
        sandbox.mark_running()


async def list_sandboxes(ctx: Ctx) -> Response:
    wanted = ctx.req.params.get("status")
    rows = [sb.view() for sb in ctx.core.owned(ctx.owner)]
    if wanted:
        rows = [row for row in rows if row["status"] == wanted]
    return ok(catalog.paginate(rows, ctx.req.params))


async def get_sandbox(ctx: Ctx) -> Response:
    return ok(sandbox_of(ctx).view(reader=True))


async def delete_sandbox(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    status = await ctx.core.delete(sandbox)
    return ok({"id": sandbox.id, "status": status})


async def pause(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    if not sandbox.can_pause:
        raise conflict(f"cannot pause a sandbox that is {sandbox.status}")
    status = await sandbox.pause()
    return ok(sandbox.view(), status, [("X-Poll-After", "1")] if status == 202 else None)


async def resume(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    if sandbox.status not in ("running", "paused", "error"):
        raise conflict(f"cannot resume a sandbox that is {sandbox.status}")
    if sandbox.status != "running" and ctx.core.settings.no_credit:
        raise ApiError(402, {"credit": "insufficient credit"})
    status = await sandbox.resume()
    return ok(sandbox.view(), status, [("X-Poll-After", "1")] if status == 202 else None)


async def patch(ctx: Ctx) -> Response:
    """``ingress_enabled``, ``auto_pause_after_seconds`` (arms the idle timer, range checked),
    ``disable_auto_pause: true`` (disarms; wins over a value in the same body). Every field is
    checked before any is applied. The request itself restarts the idle clock (router)."""
    sandbox = sandbox_of(ctx)
    body = await json_body(ctx)
    if not sandbox.live:
        raise conflict(f"sandbox is {sandbox.status}")
    ingress = bool_field(body, "ingress_enabled", sandbox.spec.ingress_enabled)
    auto = sandbox.spec.auto_pause_after_seconds
    if "auto_pause_after_seconds" in body:
        auto = validate_auto_pause(ctx, body["auto_pause_after_seconds"])
    if bool_field(body, "disable_auto_pause"):
        auto = None
    sandbox.spec.ingress_enabled = ingress
    sandbox.spec.auto_pause_after_seconds = auto
    sandbox.touch()
    sandbox.rearm()
    return ok(sandbox.view())


async def get_egress(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    return ok({"id": sandbox.id, "egress": list(sandbox.spec.egress or [])})


async def put_egress(ctx: Ctx) -> Response:
    """Swap the stored list (any live state). The network mode chosen at create or fork stays:
    a restricted sandbox stays loopback-only, an allow-all one keeps its user-mode network."""
    sandbox = sandbox_of(ctx)
    body = await json_body(ctx)
    if "egress" not in body:
        raise bad_request("egress", "egress is required (a list or null)")
    if not sandbox.live:
        raise conflict(f"sandbox is {sandbox.status}")
    sandbox.spec.egress = validate_egress(body["egress"])
    return ok({"id": sandbox.id, "egress": list(sandbox.spec.egress or [])})


async def fork(ctx: Ctx) -> Response:
    source = sandbox_of(ctx)
    body = await json_body(ctx, required=False)
    core = ctx.core
    if source.status not in ("paused", "pausing"):
        raise conflict(f"fork needs a paused sandbox, this one is {source.status}")
    busy = core.settings.fork_busy_ms / 1000
    if source.status == "pausing" or anyio.current_time() - source.paused_mono < busy:
        raise conflict("snapshot bundle is not durable yet, retry shortly")
    refuse_bandwidth_quota(body)
    if core.settings.no_credit:
        raise ApiError(402, {"credit": "insufficient credit"})
    start_paused = bool_field(body, "start_paused")
    egress = validate_egress(body.get("egress"))
    if not egress:  # omitted, null or []: the source's list (and so, often, its network mode)
        egress = None if source.spec.egress is None else list(source.spec.egress)
    envs = dict(source.spec.envs)
    envs.update(validate_envs(body.get("envs")))
    spec = dataclasses.replace(  # the source's settings, the body's envs on top
        source.spec,
        name=random_name(),
        egress=egress,
        envs=envs,
        ingress_enabled=bool_field(body, "ingress_enabled", source.spec.ingress_enabled),
    )
    child = core.new_sandbox(spec, ctx.owner, forked_from=source.id)
    child.status = "forking"
    # Held from now on: deleting either side, or resuming the source, waits for the copy.
    source.files.hold()
    child.files.hold()
    core.start_soon(lambda: _fork_later(ctx, source, child, start_paused))
    return ok(child.create_view())


async def _fork_later(ctx: Ctx, source: Sandbox, child: Sandbox, start_paused: bool) -> None:
    try:
        try:
            await anyio.to_thread.run_sync(source.files.copy_to, child.files)
        finally:
            source.files.release()
            child.files.release()
        if child.status != "forking" or child.closed:  # deleted or reset meanwhile
            return
        await ctx.core.boot(child)
    except Exception:
        if not child.closed:  # a fork deleted while it booted fails as it should: no warning
            log.warning("fork %s -> %s failed", source.id, child.id, exc_info=True)
        if child.status == "forking":
            child.status = "error"
        return
    if child.status != "forking":
        return
    if start_paused:
        await child.freeze(True)
        child.mark_paused()
    else:
        child.mark_running()


ROUTES: list[Route] = [
    route("GET", "/healthz", healthz, public=True),
    route("GET", "/readyz", readyz, public=True),
    route("GET", "/v1/shapes", shapes, public=True),
    route("GET", "/v1/rootfs", rootfs, public=True),
    route("GET", "/v1/whoami", whoami),
    route("POST", "/v1/sandboxes", create),
    route("GET", "/v1/sandboxes", list_sandboxes),
    route("GET", "/v1/sandboxes/{sid}", get_sandbox),
    route("DELETE", "/v1/sandboxes/{sid}", delete_sandbox),
    route("PATCH", "/v1/sandboxes/{sid}", patch),
    route("POST", "/v1/sandboxes/{sid}/pause", pause),
    route("POST", "/v1/sandboxes/{sid}/resume", resume),
    route("POST", "/v1/sandboxes/{sid}/fork", fork),
    route("GET", "/v1/sandboxes/{sid}/egress", get_egress),
    route("PUT", "/v1/sandboxes/{sid}/egress", put_egress),
]
