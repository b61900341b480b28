"""What the /v1 handlers read from a request: its JSON body, the sandbox it names, checked fields.

Every helper the /v1 route modules (sandboxes, exec and files, processes) share lives here, so
no route module imports another. :func:`json_body`, :func:`sandbox_of` and
:func:`require_running` serve all of them; :func:`command_fields`, :func:`call_env` and
:data:`HOME` read a command (exec and processes). The ``validate_*`` checks and
:func:`build_spec` turn the fields of create, fork and PATCH bodies into stored values or a 400
``fail`` keyed by the field: envs, egress rules (the worker's grammar,
``provider/egress_rules.py``: a bad rule is named by its position, never quoted), the
auto-pause range and booleans.
"""

from __future__ import annotations

import re
from typing import Any

from ..egress_rules import ACCEPTED_FORMS, RuleError, normalize_rule
from . import catalog
from .ids import random_name
from .jsend import ApiError, bad_request, conflict, json_object, not_found
from .router import Ctx
from .sandbox_spec import SandboxSpec
from .sandboxes import Sandbox

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_AUTO_PAUSE = 86_400
MAX_BODY = 1 << 20
HOME = "/root"  # the cwd of an exec, and of a process that names none


async def json_body(ctx: Ctx, *, required: bool = True, limit: int = MAX_BODY) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}`` unless ``required``); a body over
    ``limit`` bytes is a 413."""
    too_large = ApiError(413, {"body": f"request body exceeds {limit} bytes"})
    if ctx.req.content_length is not None and ctx.req.content_length > limit:
        raise too_large
    raw = await ctx.req.read_body(limit)
    if raw is None:
        raise too_large
    if not raw.strip():
        if required:
            raise bad_request("body", "a JSON object is required")
        return {}
    return json_object(raw)


def sandbox_of(ctx: Ctx) -> Sandbox:
    sandbox = ctx.core.find(ctx.owner, ctx.match["sid"])
    if sandbox is None:
        raise not_found("sandbox")
    return sandbox


def require_running(sandbox: Sandbox) -> None:
    if sandbox.status != "running":
        raise conflict(f"sandbox is {sandbox.status}, not running")


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


def bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(name, "must be a boolean")
    return value


def refuse_bandwidth_quota(body: dict[str, Any]) -> None:
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
    refuse_bandwidth_quota(body)
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
        ingress_enabled=bool_field(body, "ingress_enabled"),
        image_root=image.root,
    )
