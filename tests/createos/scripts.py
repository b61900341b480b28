"""Shared pieces of the client tests: JSend answers and views for pytest-httpserver scripts."""

from __future__ import annotations

import json
from typing import Any

from werkzeug import Response

SB = "sb_01J8ZABCDEFGHJKMNPQRSTVWXY"
PROC = "proc_01J9A"


def ok(data: Any, status: int = 200) -> Response:
    return Response(
        json.dumps({"status": "success", "data": data}),
        status=status,
        content_type="application/json",
    )


def fail(status: int, data: Any = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"status": "fail", "data": data}),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def running(sandbox_id: str = SB) -> dict[str, Any]:
    return {"id": sandbox_id, "status": "running", "name": "pc-1", "shape": "s-1vcpu-1gb"}


def process(state: str = "running", **extra: Any) -> dict[str, Any]:
    return {"process_id": PROC, "state": state, "pid": 42, **extra}
