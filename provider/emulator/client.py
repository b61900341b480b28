"""EmulatorAdmin: an async httpx client for the ``/_emulator/`` admin API (one HTTP call each)."""

from __future__ import annotations

from typing import Any

import httpx


class EmulatorAdminError(RuntimeError):
    """An admin call answered a non-2xx status."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"emulator admin call failed with HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class EmulatorAdmin:
    """Bound to one emulator: ``EmulatorAdmin(base_url, token)``."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        async with httpx.AsyncClient(
            base_url=self.base_url,
            headers={"X-Emulator-Token": self.token},
            timeout=60.0,
            follow_redirects=False,
        ) as client:
            response = await client.request(method, "/_emulator" + path, json=body, params=params)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not response.is_success:
            detail = payload.get("data") if isinstance(payload, dict) else None
            raise EmulatorAdminError(response.status_code, detail)
        return payload["data"]

    async def reset(self) -> None:
        await self._call("POST", "/reset")

    async def requests(self, since: int = 0) -> list[dict[str, Any]]:
        data = await self._call("GET", "/requests", params={"since": since})
        return list(data["requests"])

    async def process_history(self) -> list[dict[str, Any]]:
        """Every managed process started so far (kept after its sandbox is deleted)."""
        data = await self._call("GET", "/process-history")
        return list(data["processes"])

    async def exec_history(self) -> list[dict[str, Any]]:
        """Every exec spawned so far, streamed or not, with its start and leader-exit times."""
        data = await self._call("GET", "/exec-history")
        return list(data["execs"])

    async def self_history(self) -> list[dict[str, Any]]:
        """Every request a sandbox's guest agent forwarded (``sandbox_id``, ``action``,
        ``reason``, ``time``), kept after the sandbox is gone."""
        data = await self._call("GET", "/self-history")
        return list(data["requests"])

    async def add_fault(
        self,
        method: str,
        path_regex: str,
        *,
        times: int = 1,
        status: int | None = None,
        body: dict[str, Any] | None = None,
        retry_after: str | None = None,
        delay_ms: int | None = None,
        drop: bool = False,
        lose_response: bool = False,
        stream_lines: list[str] | None = None,
        cut_after_frames: int | None = None,
        cut_after_bytes: int | None = None,
    ) -> None:
        action: dict[str, Any] = {
            "status": status,
            "body": body,
            "retry_after": retry_after,
            "delay_ms": delay_ms,
            "stream_lines": stream_lines,
            "cut_after_frames": cut_after_frames,
            "cut_after_bytes": cut_after_bytes,
        }
        if drop:
            action["drop"] = True
        if lose_response:
            action["lose_response"] = True
        action = {k: v for k, v in action.items() if v is not None}
        fault = {"match": {"method": method, "path_regex": path_regex}, "times": times}
        await self._call("POST", "/faults", body={**fault, "action": action})

    async def clear_faults(self) -> None:
        await self._call("DELETE", "/faults")

    async def settings(self, **changes: Any) -> dict[str, Any]:
        """PATCH the given settings (none: just read them); answers every setting."""
        return dict(await self._call("PATCH", "/settings", body=changes))

    async def force_state(self, sandbox_id: str, status: str) -> None:
        await self._call("POST", f"/sandboxes/{sandbox_id}/state", body={"status": status})

    async def idle_pause(self, sandbox_id: str) -> dict[str, Any]:
        """Fire an armed sandbox's idle timer now (``POST /sandboxes/{id}/auto-pause``): it is
        paused through the normal pause path; answers the view (``pausing``). HTTP 409
        (:class:`EmulatorAdminError`) when the sandbox is not armed or not ``running``."""
        return dict(await self._call("POST", f"/sandboxes/{sandbox_id}/auto-pause"))

    async def evict(self, process_id: str, up_to_seq: int) -> None:
        await self._call("POST", f"/processes/{process_id}/evict", body={"up_to_seq": up_to_seq})

    async def state(self) -> dict[str, Any]:
        return dict(await self._call("GET", "/state"))

    async def live_process_count(self) -> int:
        state = await self.state()
        return sum(1 for p in state["processes"] if p["tree_alive"])
