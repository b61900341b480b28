"""Catalog, whoami and sandbox routes: create, get, list, delete, pause, resume, patch,
egress and fork."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio

from ..egress_rules import ACCEPTED_FORMS, RuleError, normalize_rule
from . import catalog
from .http import Response
from .ids import random_name
from .images import ImageError
from .jsend import ApiError, bad_request, conflict, error, fail, not_found, ok
from .router import Ctx, Route, route
from .sandboxes import LIVE, Sandbox, SandboxSpec

log = logging.getLogger("provider.emulator")

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_AUTO_PAUSE = 86_400
MAX_BODY = 1 << 20


async def json_body(ctx: Ctx, *, required: bool = True) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}`` unless ``required``)."""
    raw = await ctx.req.read_body(MAX_BODY)
    if raw is None:
        raise ApiError(413, {"body": "request body too large"})
    if not raw.strip():
        if required:
            raise bad_request("body", "a JSON object is required")
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise bad_request("body", "body is not valid JSON") from exc
    if not isinstance(value, dict):
        raise bad_request("body", "body must be a JSON object")
    return value


def sandbox_of(ctx: Ctx) -> Sandbox:
    sandbox = ctx.core.find(ctx.owner, ctx.match["sid"])
    if sandbox is None:
        raise not_found("sandbox")
    return sandbox


def require_running(sandbox: Sandbox) -> None:
    if sandbox.status != "running":
        raise conflict(f"sandbox is {sandbox.status}, not running")


def validate_envs(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_request("envs", "envs must be an object")
    if len(raw) > 64:
        raise bad_request("envs", "at most 64 entries")
    total = 0
    for key, value in raw.items():
        if not ENV_KEY.match(key):
            raise bad_request("envs", f"invalid key {key!r}")
        if not isinstance(value, str):
            raise bad_request("envs", f"value of {key} must be a string")
        if len(value.encode()) > 4096:
            raise bad_request("envs", f"value of {key} exceeds 4 KiB")
        total += len(value.encode())
    if total > 64 * 1024:
        raise bad_request("envs", "values exceed 64 KiB in total")
    return dict(raw)


def validate_egress(raw: Any, field: str = "egress") -> list[str] | None:
    """The normalized rule list (grammar of provider/egress_rules.py), ``None`` for null. A bad
    rule is a 400 naming its position (``egress[2]``) and the reason, never the entry itself."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request(field, "egress must be a list of rules or null")
    rules = []
    for index, entry in enumerate(raw):
        try:
            rules.append(normalize_rule(entry))
        except RuleError as exc:
            where = f"{field}[{index}]"
            reason = f"{where} is not a valid rule: {exc.reason}; {ACCEPTED_FORMS}"
            raise bad_request(where, reason) from None
    return rules


def validate_auto_pause(ctx: Ctx, raw: Any) -> int:
    floor = ctx.core.settings.min_auto_pause_seconds
    if not isinstance(raw, int) or isinstance(raw, bool) or not floor <= raw <= MAX_AUTO_PAUSE:
        raise bad_request(
            "auto_pause_after_seconds", f"must be an integer from {floor} to {MAX_AUTO_PAUSE}"
        )
    return raw


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(name, "must be a boolean")
    return value


def _no_bandwidth_quota(body: dict[str, Any]) -> None:
    if body.get("bandwidth_quota_bytes") not in (None, 0):
        raise bad_request("bandwidth_quota_bytes", "bandwidth quotas are not supported")


def build_spec(ctx: Ctx, body: dict[str, Any]) -> SandboxSpec:
    settings = ctx.core.settings
    shape_id = body.get("shape")
    if not isinstance(shape_id, str) or not shape_id:
        raise bad_request("shape", "shape is required")
    shape = catalog.shape(shape_id)
    if shape is None:
        if not settings.accept_any_shape:
            raise bad_request("shape", f"unknown shape: {shape_id}")
        shape = {"vcpu": 1, "mem_mib": 1024}
    rootfs = body.get("rootfs", catalog.DEFAULT_ROOTFS)
    if rootfs is None:
        rootfs = catalog.DEFAULT_ROOTFS
    image = ctx.core.images.get(rootfs) if isinstance(rootfs, str) else None
    if image is None:
        raise bad_request("rootfs", f"unknown rootfs: {rootfs}")
    region = body.get("region", settings.region)
    if region != settings.region:
        raise bad_request("region", f"this server serves region {settings.region}")
    name = body.get("name")
    if name is None:
        name = random_name()
    elif not isinstance(name, str) or not NAME.match(name):
        raise bad_request("name", "name must be a lowercase hostname label")
    if any(sb.spec.name == name and sb.live for sb in ctx.core.owned(ctx.owner)):
        raise ApiError(409, {"name": f"a live sandbox is already named {name}"})
    disk = body.get("disk_mib", 0)
    if not isinstance(disk, int) or isinstance(disk, bool) or disk < 0:
        raise bad_request("disk_mib", "must be a non-negative integer")
    _no_bandwidth_quota(body)
    auto = body.get("auto_pause_after_seconds")
    return SandboxSpec(
        shape=shape_id,
        vcpu=int(shape["vcpu"]),
        mem_mib=int(shape["mem_mib"]),
        rootfs=rootfs,
        region=settings.region,
        name=name,
        disk_mib=disk or catalog.DEFAULT_DISK_MIB,
        egress=validate_egress(body.get("egress")),
        envs=validate_envs(body.get("envs")),
        auto_pause_after_seconds=None if auto is None else validate_auto_pause(ctx, auto),
        ingress_enabled=_bool(body, "ingress_enabled"),
        image_root=image.root,
    )


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
        return ok(sandbox.create_view())
    try:
        await core.boot(sandbox)
    except ImageError as exc:
        log.warning("sandbox %s could not be started: %s", sandbox.id, exc)
        sandbox.status = "failed"
        return error(503, f"sandbox could not be started: {exc}")
    except Exception:
        log.exception("sandbox %s could not be started", sandbox.id)
        sandbox.status = "failed"
        return error(503, "sandbox could not be started")
    await anyio.sleep(core.settings.create_delay_ms / 1000)
    if sandbox.status == "creating":
        sandbox.mark_running()
    return ok(sandbox.create_view())


async def _boot_later(ctx: Ctx, sandbox: Sandbox) -> None:
    try:
        await ctx.core.boot(sandbox)
    except Exception:
        log.exception("sandbox %s could not be started", sandbox.id)
        sandbox.status = "failed"
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
    if sandbox.status == "destroyed":
        return ok({"id": sandbox.id, "status": "destroyed"})
    if sandbox.status == "destroying":
        return ok({"id": sandbox.id, "status": "destroying"})
    status = await ctx.core.destroy(sandbox)
    return ok({"id": sandbox.id, "status": status})


async def pause(ctx: Ctx) -> Response:
    sandbox = sandbox_of(ctx)
    if sandbox.status not in ("running", "paused"):
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
    ingress = _bool(body, "ingress_enabled", sandbox.spec.ingress_enabled)
    auto = sandbox.spec.auto_pause_after_seconds
    if "auto_pause_after_seconds" in body:
        auto = validate_auto_pause(ctx, body["auto_pause_after_seconds"])
    if _bool(body, "disable_auto_pause"):
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
    a restricted sandbox stays loopback-only, an allow-all one keeps the host network."""
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
    _no_bandwidth_quota(body)
    if core.settings.no_credit:
        raise ApiError(402, {"credit": "insufficient credit"})
    start_paused = _bool(body, "start_paused")
    egress = validate_egress(body.get("egress"))
    if not egress:  # omitted, null or []: the source's list (and so, often, its network mode)
        egress = None if source.spec.egress is None else list(source.spec.egress)
    envs = dict(source.spec.envs)
    envs.update(validate_envs(body.get("envs")))
    spec = SandboxSpec(  # the source's settings, the body's envs on top
        shape=source.spec.shape,
        vcpu=source.spec.vcpu,
        mem_mib=source.spec.mem_mib,
        rootfs=source.spec.rootfs,
        region=source.spec.region,
        name=random_name(),
        disk_mib=source.spec.disk_mib,
        egress=egress,
        envs=envs,
        auto_pause_after_seconds=source.spec.auto_pause_after_seconds,
        ingress_enabled=_bool(body, "ingress_enabled", source.spec.ingress_enabled),
        image_root=source.spec.image_root,
    )
    child = core.new_sandbox(spec, ctx.owner, forked_from=source.id)
    child.status = "forking"
    # Held from now on: deleting either side, or resuming the source, waits for the copy.
    source.hold_fs()
    child.hold_fs()
    core.start_soon(lambda: _fork_later(ctx, source, child, start_paused))
    return ok(child.create_view())


async def _fork_later(ctx: Ctx, source: Sandbox, child: Sandbox, start_paused: bool) -> None:
    try:
        try:
            await anyio.to_thread.run_sync(source.copy_fs_to, child)
        finally:
            source.release_fs()
            child.release_fs()
        if child.status != "forking" or child.closed:  # deleted or reset meanwhile
            return
        await ctx.core.boot(child)
    except Exception:
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

__all__ = ["LIVE", "ROUTES", "fail", "json_body", "require_running", "sandbox_of"]
