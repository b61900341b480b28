"""Sandbox calls of the CreateOS client: create, read, list, delete, pause, resume, patch,
fork and exec.

docs/protocol.md C3 (``/sandboxes``). Creation, fork and ``exec`` are POSTs, so they are
repeated only on 429 and 503, the server's "not processed" (a fork's bundle-window 409 is retried by
its caller, which owns the deadline); reads, lists, deletes and PATCHes of absolute values are
retried like other idempotent calls (:mod:`provider.createos.core`). Every answer is checked to be
about the sandbox asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from provider.createos.core import ClientCore
from provider.createos.envelope import list_page
from provider.createos.errors import APIProtocolError
from provider.createos.models import (
    SANDBOX_STATES,
    ExecResult,
    SandboxView,
    exec_result,
    is_valid_id,
    require_id,
    sandbox_view,
)
from provider.createos.wire import Wire

LIST_PAGE: Final = 100
_MAX_PAGES: Final = 10_000


class SandboxCalls(ClientCore):
    """``/sandboxes`` and ``/sandboxes/{id}`` (lifecycle and buffered exec)."""

    async def create_sandbox(
        self, *, shape: str, name: str, rootfs: str | None, region: str | None
    ) -> str:
        """``POST /sandboxes``; returns the new id. Retried only on 429 and 503."""
        sandbox_id, _ = await self.create_sandbox_status(
            shape=shape, name=name, rootfs=rootfs, region=region
        )
        return sandbox_id

    async def create_sandbox_status(
        self,
        *,
        shape: str,
        name: str,
        rootfs: str | None,
        region: str | None,
        egress: Sequence[str] | None = None,
        auto_pause_after_seconds: int | None = None,
        wire: Wire | None = None,
    ) -> tuple[str, str | None]:
        """``POST /sandboxes``: the new id and the status the answer reported (None when it
        named none or an unknown one). ``egress``: the outbound allowlist (omitted: allow all);
        ``auto_pause_after_seconds``: CreateOS pauses the sandbox once idle that long.
        Retried only on 429 and 503; ``wire`` tells whether the request was sent
        (:class:`~provider.createos.wire.Wire`)."""
        body: dict[str, Any] = {"shape": shape, "name": name}
        if rootfs is not None:
            body["rootfs"] = rootfs
        if region is not None:
            body["region"] = region
        if egress:
            body["egress"] = list(egress)
        if auto_pause_after_seconds is not None:
            body["auto_pause_after_seconds"] = auto_pause_after_seconds
        body["ingress_enabled"] = False
        operation = "create sandbox"
        data = await self._json_call(
            "POST", "/sandboxes", operation=operation, json=body, wire=wire
        )
        sandbox_id = data.get("id") if isinstance(data, dict) else None
        if not is_valid_id(sandbox_id):
            raise APIProtocolError(f"CreateOS {operation} answered without a valid sandbox id.")
        assert isinstance(sandbox_id, str)
        status = data.get("status")
        return sandbox_id, status if status in SANDBOX_STATES else None

    async def get_sandbox(self, sandbox_id: str) -> SandboxView:
        """``GET /sandboxes/{id}``; the answer must be about that sandbox."""
        operation = "read sandbox"
        require_id(sandbox_id, "sandbox")
        data = await self._json_call("GET", f"/sandboxes/{sandbox_id}", operation=operation)
        view = sandbox_view(data, operation)
        if view.id != sandbox_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another sandbox.")
        return view

    async def list_sandboxes(self, *, status: str | None = None) -> list[SandboxView]:
        """Every sandbox of this key (all pages), optionally filtered by status."""
        operation = "list sandboxes"
        views: list[SandboxView] = []
        offset = 0
        for _ in range(_MAX_PAGES):
            params: dict[str, str | int] = {"limit": LIST_PAGE, "offset": offset}
            if status is not None:
                params["status"] = status
            data = await self._json_call("GET", "/sandboxes", operation=operation, params=params)
            items, total = list_page(data, operation)
            views.extend(sandbox_view(item, operation) for item in items)
            offset += len(items)
            if total is None or not items or offset >= total:
                return views
        raise APIProtocolError(f"CreateOS {operation} did not reach the end of its pages.")

    async def delete_sandbox(self, sandbox_id: str) -> str:
        """``DELETE /sandboxes/{id}``; returns the answered status. 404 raises NotFound."""
        operation = "delete sandbox"
        require_id(sandbox_id, "sandbox")
        data = await self._json_call("DELETE", f"/sandboxes/{sandbox_id}", operation=operation)
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise APIProtocolError(f"CreateOS {operation} answered without a status.")
        if "id" in data and data["id"] != sandbox_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another sandbox.")
        status: str = data["status"]
        return status

    async def pause_sandbox(self, sandbox_id: str) -> None:
        """``POST /sandboxes/{id}/pause`` (202 or 200); 409 raises Conflict."""
        require_id(sandbox_id, "sandbox")
        await self._json_call("POST", f"/sandboxes/{sandbox_id}/pause", operation="pause sandbox")

    async def resume_sandbox(self, sandbox_id: str) -> None:
        """``POST /sandboxes/{id}/resume`` (202 or 200); 409 raises Conflict."""
        require_id(sandbox_id, "sandbox")
        await self._json_call("POST", f"/sandboxes/{sandbox_id}/resume", operation="resume sandbox")

    async def put_egress(self, sandbox_id: str, egress: Sequence[str]) -> None:
        """``PUT /sandboxes/{id}/egress``: replace the outbound allowlist (``[]``: allow all)."""
        require_id(sandbox_id, "sandbox")
        await self._json_call(
            "PUT",
            f"/sandboxes/{sandbox_id}/egress",
            operation="set sandbox egress",
            json={"egress": list(egress)},
        )

    async def patch_sandbox(
        self,
        sandbox_id: str,
        *,
        auto_pause_after_seconds: int | None = None,
        disable_auto_pause: bool = False,
        ingress_enabled: bool | None = None,
    ) -> None:
        """``PATCH /sandboxes/{id}`` with the given settings only (docs/protocol.md C3.7):
        ``auto_pause_after_seconds`` arms the idle pause, ``disable_auto_pause`` disarms it."""
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {}
        if auto_pause_after_seconds is not None:
            body["auto_pause_after_seconds"] = auto_pause_after_seconds
        if disable_auto_pause:
            body["disable_auto_pause"] = True
        if ingress_enabled is not None:
            body["ingress_enabled"] = ingress_enabled
        if not body:
            raise ValueError("patch_sandbox needs at least one setting")
        await self._json_call(
            "PATCH", f"/sandboxes/{sandbox_id}", operation="update sandbox", json=body
        )

    async def fork_sandbox(
        self,
        source_id: str,
        *,
        start_paused: bool,
        egress: Sequence[str],
        ingress_enabled: bool,
        envs: Mapping[str, str] | None = None,
    ) -> tuple[str, str | None]:
        """``POST /sandboxes/{id}/fork`` of a paused sandbox (docs/protocol.md C3.9): the new
        sandbox's id and the status answered (None when unknown). ``egress`` is always sent:
        an empty list would inherit the source's, so callers pass ``["*"]`` for allow-all.
        ``envs`` are added to the source's. 409 raises Conflict (not durable yet, or not
        paused); retried only on 429 and 503."""
        operation = "fork sandbox"
        require_id(source_id, "sandbox")
        body: dict[str, Any] = {
            "start_paused": start_paused,
            "egress": list(egress),
            "ingress_enabled": ingress_enabled,
        }
        if envs:
            body["envs"] = dict(envs)
        data = await self._json_call(
            "POST", f"/sandboxes/{source_id}/fork", operation=operation, json=body
        )
        sandbox_id = data.get("id") if isinstance(data, dict) else None
        if not is_valid_id(sandbox_id) or sandbox_id == source_id:
            raise APIProtocolError(f"CreateOS {operation} answered without a new sandbox id.")
        assert isinstance(sandbox_id, str)
        status = data.get("status")
        return sandbox_id, status if status in SANDBOX_STATES else None

    async def exec(
        self, sandbox_id: str, cmd: str, args: Sequence[str], *, stdin: str | None = None
    ) -> ExecResult:
        """Buffered ``POST /sandboxes/{id}/exec``: runs ``cmd`` + ``args`` (no shell)."""
        operation = "run command"
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {"cmd": cmd, "args": list(args)}
        if stdin is not None:
            body["stdin"] = stdin
        data = await self._json_call(
            "POST", f"/sandboxes/{sandbox_id}/exec", operation=operation, json=body
        )
        return exec_result(data, operation)
