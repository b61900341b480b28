"""Static catalogs: shapes and the built-in rootfs names (each the plain host view; folder
images and the ``GET /v1/rootfs`` body are in ``images.py``)."""

from __future__ import annotations

from typing import Any

DEFAULT_DISK_MIB = 10_240
DEFAULT_ROOTFS = "devbox:1"
BANDWIDTH_QUOTA_BYTES = 5 * 1024**3

# id, vcpu, mem_mib, cpu_quota_pct (None = uncapped)
_SHAPES: tuple[tuple[str, int, int, int | None], ...] = (
    ("s-1vcpu-256mb", 1, 256, None),
    ("s-0.25vcpu-512mb", 1, 512, 25),
    ("s-0.5vcpu-1gb", 1, 1024, 50),
    ("s-1vcpu-1gb", 1, 1024, None),
    ("s-1vcpu-2gb", 1, 2048, None),
    ("s-2vcpu-2gb", 2, 2048, None),
    ("s-2vcpu-4gb", 2, 4096, None),
    ("s-4vcpu-4gb", 4, 4096, None),
    ("s-4vcpu-8gb", 4, 8192, None),
    ("s-8vcpu-8gb", 8, 8192, None),
    ("s-8vcpu-16gb", 8, 16384, None),
)

ROOTFS: tuple[dict[str, Any], ...] = (
    {"name": "devbox:1", "description": "Ubuntu 24.04 with developer tooling"},
    {"name": "ubuntu:26.04", "description": "Ubuntu 26.04"},
    {"name": "debian:13", "description": "Debian 13"},
    {"name": "alpine:3.20", "description": "Alpine Linux 3.20"},
    {"name": "desktop:1", "description": "XFCE desktop with Chrome"},
)


def shapes() -> list[dict[str, Any]]:
    out = []
    for shape_id, vcpu, mem, quota in _SHAPES:
        entry: dict[str, Any] = {
            "id": shape_id,
            "vcpu": vcpu,
            "mem_mib": mem,
            "default_disk_mib": DEFAULT_DISK_MIB,
        }
        if quota is not None:
            entry["cpu_quota_pct"] = quota
        out.append(entry)
    return out


def shape(shape_id: str) -> dict[str, Any] | None:
    for entry in shapes():
        if entry["id"] == shape_id:
            return entry
    return None


def paginate(items: list[Any], query: dict[str, str]) -> dict[str, Any]:
    """``{"data": [...], "pagination": {...}}`` with limit (default 50, max 500) and offset."""
    limit = _int(query.get("limit"), 50)
    offset = _int(query.get("offset"), 0)
    limit = max(1, min(limit, 500))
    offset = max(0, offset)
    page = items[offset : offset + limit]
    return {
        "data": page,
        "pagination": {"total": len(items), "limit": limit, "offset": offset, "count": len(page)},
    }


def _int(raw: str | None, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        return default
