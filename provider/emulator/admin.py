"""The admin API under ``/_emulator/``: reset, request log, faults, settings, forced states,
the idle-pause hook, journal eviction and the state view (with host-side process scanning for
leak checks). Admin calls are never sandbox activity (they do not restart an idle clock)."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import re
from typing import Any

import anyio

from .core import EmulatorCore, Fault
from .hostscan import scan_host
from .http_messages import Request, Response
from .jsend import ApiError, bad_request, fail, json_object, not_found, ok
from .sandbox_spec import LIVE
from .sandboxes import Sandbox

FORCEABLE = (
    "creating",
    "running",
    "pausing",
    "paused",
    "resuming",
    "forking",
    "error",
    "destroying",
    "destroyed",
    "failed",
)
FAULT_ACTIONS = {
    "status": int,
    "body": dict,
    "retry_after": str,
    "delay_ms": int,
    "drop": bool,
    "lose_response": bool,
    "stream_lines": list,
    "cut_after_frames": int,
    "cut_after_bytes": int,
}


def state_view(core: EmulatorCore) -> dict[str, Any]:
    """Live sandboxes and every managed process with whether any of its tree is alive."""
    scanned = scan_host(core.namespaces())
    sandboxes = []
    processes = []
    live_ns: set[str] = set()
    for sandbox in core.sandboxes.values():
        ns = sandbox.guest.pid_ns if sandbox.guest is not None else None
        members = scanned.get(ns, []) if ns is not None else []
        if sandbox.live:
            if ns is not None:
                live_ns.add(ns)
            sandboxes.append(
                {
                    "id": sandbox.id,
                    "status": sandbox.status,
                    "owner_key_hash": sandbox.owner,
                    "name": sandbox.spec.name,
                    "network": sandbox.network,
                    "network_pid": _network_pid(sandbox),
                    "host_pids": sorted(m.host_pid for m in members),
                }
            )
        for process in sandbox.processes.values():
            tree = [m.host_pid for m in members if m.guest_sid == process.pid]
            # The leader's session, or (in a live sandbox) anything its subreaper still holds:
            # setsid'd and double-forked descendants leave the session but not the tree.
            alive = bool(tree) or (sandbox.live and not process.tree_exited)
            processes.append(
                {
                    "sandbox_id": sandbox.id,
                    "process_id": process.process_id,
                    "state": process.state,
                    "tree_alive": alive,
                    "host_pids": sorted(tree),
                }
            )
    orphans = sorted(
        m.host_pid for ns, members in scanned.items() if ns not in live_ns for m in members
    )
    return {"sandboxes": sandboxes, "processes": processes, "orphan_host_pids": orphans}


def _network_pid(sandbox: Sandbox) -> int | None:
    """Host pid of the sandbox's slirp4netns while it runs (user-mode sandboxes)."""
    usernet = sandbox.guest.usernet if sandbox.guest is not None else None
    return usernet.pid if usernet is not None and usernet.running else None


def _is_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host.split("%", 1)[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))
    return False


def parse_fault(body: dict[str, Any]) -> Fault:
    match = body.get("match")
    if not isinstance(match, dict):
        raise bad_request("match", "match must be an object with method and path_regex")
    method = match.get("method", "*")
    path_regex = match.get("path_regex")
    if not isinstance(method, str) or not isinstance(path_regex, str):
        raise bad_request("match", "method and path_regex must be strings")
    try:
        re.compile(path_regex)
    except re.error as exc:
        raise bad_request("path_regex", "invalid regular expression") from exc
    times = body.get("times", 1)
    if not isinstance(times, int) or isinstance(times, bool) or times < 1:
        raise bad_request("times", "times must be a positive integer")
    action = body.get("action", {})
    if not isinstance(action, dict):
        raise bad_request("action", "action must be an object")
    kwargs: dict[str, Any] = {}
    for name, value in action.items():
        kind = FAULT_ACTIONS.get(name)
        if kind is None:
            raise bad_request("action", f"unknown action {name}")
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise bad_request(name, f"{name} has the wrong type")
        kwargs[name] = value
    if "stream_lines" in kwargs and not all(isinstance(x, str) for x in kwargs["stream_lines"]):
        raise bad_request("stream_lines", "stream_lines must be strings")
    if not kwargs:
        raise bad_request("action", "action needs at least one effect")
    return Fault(method=method.upper(), path_regex=path_regex, times=times, **kwargs)


class Admin:
    """Handles every ``/_emulator/`` request (loopback only, token guarded, not logged)."""

    def __init__(self, core: EmulatorCore, token: str) -> None:
        self.core = core
        self.token = token

    async def __call__(self, req: Request) -> Response:
        if not _is_loopback(req.client):
            return fail(403, {"admin": "admin API is loopback only"})
        given = req.headers.get("x-emulator-token", "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return fail(401, {"admin": "missing or wrong X-Emulator-Token"})
        try:
            return await self._route(req)
        except ApiError as exc:
            return exc.response()

    async def _body(self, req: Request) -> dict[str, Any]:
        raw = await req.read_body(1 << 20)
        if not raw:
            return {}
        return json_object(raw)

    async def _route(self, req: Request) -> Response:
        core = self.core
        path = req.path.removeprefix("/_emulator")
        method = req.method
        if (method, path) == ("POST", "/reset"):
            await core.reset()
            return ok({"ok": True})
        if (method, path) == ("GET", "/requests"):
            since = int(req.params.get("since", "0") or 0)
            return ok({"requests": [e for e in core.log if e["seq"] > since]})
        if (method, path) == ("GET", "/process-history"):
            return ok({"processes": list(core.process_history)})
        if (method, path) == ("GET", "/exec-history"):
            return ok({"execs": list(core.exec_history)})
        if (method, path) == ("GET", "/self-history"):
            return ok({"requests": list(core.self_history)})
        if (method, path) == ("POST", "/faults"):
            core.faults.append(parse_fault(await self._body(req)))
            return ok({"ok": True, "faults": len(core.faults)})
        if (method, path) == ("DELETE", "/faults"):
            core.faults.clear()
            return ok({"ok": True})
        if path == "/settings" and method in ("GET", "PATCH"):
            if method == "PATCH":
                errors = core.settings.update(await self._body(req))
                if errors:
                    raise ApiError(400, errors)
                core.settings_changed()
            return ok(core.settings.as_dict())
        if (method, path) == ("GET", "/state"):
            return ok(await anyio.to_thread.run_sync(state_view, core))
        found = re.fullmatch(r"/sandboxes/([^/]+)/state", path)
        if found and method == "POST":
            return await self._force_state(found.group(1), await self._body(req))
        found = re.fullmatch(r"/sandboxes/([^/]+)/(?:auto|idle)-pause", path)
        if found and method == "POST":
            return await self._idle_pause(found.group(1))
        found = re.fullmatch(r"/processes/([^/]+)/evict", path)
        if found and method == "POST":
            return await self._evict(found.group(1), await self._body(req))
        return fail(404, {"path": "no such admin route"})

    async def _force_state(self, sandbox_id: str, body: dict[str, Any]) -> Response:
        sandbox = self.core.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise not_found("sandbox")
        status = body.get("status")
        if status not in FORCEABLE:
            raise bad_request("status", f"status must be one of {', '.join(FORCEABLE)}")
        if status in ("destroyed", "destroying", "failed"):
            if sandbox.live or sandbox.status == "creating":
                await self.core.destroy(sandbox)
            if status != "destroying":
                sandbox.finish_destroy()
            sandbox.status = status
            sandbox.clear_stale()
        elif sandbox.status in LIVE:
            await sandbox.force_status(status)
        else:
            raise ApiError(409, {"state": f"sandbox is already {sandbox.status}"})
        return ok(sandbox.view())

    async def _idle_pause(self, sandbox_id: str) -> Response:
        """Fire an armed sandbox's idle timer now: the normal pause path, 202 with the view in
        ``pausing`` (409 when the sandbox is not armed or not running)."""
        sandbox = self.core.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise not_found("sandbox")
        if not sandbox.idle.armed:
            raise ApiError(409, {"state": "sandbox has no auto_pause_after_seconds set"})
        if not await sandbox.idle.pause_now():
            raise ApiError(409, {"state": f"sandbox is {sandbox.status}, not running"})
        return ok(sandbox.view(), 202)

    async def _evict(self, process_id: str, body: dict[str, Any]) -> Response:
        entry = self.core.processes.get(process_id)
        if entry is None:
            raise not_found("process")
        up_to = body.get("up_to_seq")
        if not isinstance(up_to, int) or isinstance(up_to, bool):
            raise bad_request("up_to_seq", "up_to_seq must be an integer")
        journal = entry[1].journal
        oldest = journal.evict_through(up_to)
        return ok({"oldest_seq": oldest, "newest_seq": journal.newest_seq})
