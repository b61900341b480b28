"""The login-terminal and duplex-channel half of :class:`~devtools.host_peer.HostPeer`.

Each session goes through the real manager's own routes (the ones the host's login flow and
gateway use) and is a handle id the Node driver keeps; these methods are the driver commands
that open, write, read, wait on, kill and close it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class PeerCallError(Exception):
    """A peer command failed; ``code`` is the JSON-RPC code when the worker manager gave one."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(f"[{code}] {message}" if code is not None else message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SessionTarget:
    """The lease a login terminal or duplex channel opens on (the worker must hold it)."""

    company_id: str
    environment_id: str
    provider_lease_id: str
    driver_key: str = "createos"

    def payload(self) -> dict[str, str]:
        return {
            "driverKey": self.driver_key,
            "companyId": self.company_id,
            "environmentId": self.environment_id,
            "providerLeaseId": self.provider_lease_id,
        }


@dataclass(frozen=True)
class SessionExit:
    """What a session's ``wait()`` settled with (``exitCode`` null for a stop, close or loss)."""

    exit_code: int | None
    transport_closed: bool = False

    @classmethod
    def parse(cls, raw: Any) -> SessionExit | None:
        if not isinstance(raw, dict):
            return None
        code = raw.get("exitCode")
        return cls(code if isinstance(code, int) else None, raw.get("transportClosed") is True)


@dataclass(frozen=True)
class SessionRead:
    """What a session's ``onData`` listener received so far (``data`` for a channel, from the
    read's offset; ``text`` for a login terminal), and whether the awaited condition held."""

    received: int  # bytes (channel) or UTF-16 units (login terminal) delivered in total
    deliveries: int  # listener calls
    exit: SessionExit | None
    timed_out: bool
    data: bytes = b""
    text: str = ""


class PeerSessions:
    """Session commands on top of :meth:`command` (provided by ``HostPeer``)."""

    plugin_id: str

    async def command(
        self,
        op: str,
        payload: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 120.0,
        on_log: Callable[[str, str], None] | None = None,
    ) -> Any:
        raise NotImplementedError

    async def open_login_pty(
        self,
        target: SessionTarget,
        *,
        login_command_key: str,
        session_home: str,
        plugin_id: str | None = None,
        timeout_s: float = 60.0,
    ) -> str:
        """``manager.openLoginPtySession``: a handle id once the route is bound."""
        payload = {
            **target.payload(),
            "pluginId": plugin_id or self.plugin_id,
            "loginCommandKey": login_command_key,
            "sessionHome": session_home,
        }
        result = await self.command("loginOpen", payload, timeout_s=timeout_s)
        return str(result["session"])

    async def write_login_pty(self, session: str, text: str) -> None:
        """``session.write(text)``: a fire-and-forget ``loginPtyInput``, as the host sends it."""
        await self.command("loginWrite", {"session": session, "data": text})

    async def read_login_pty(
        self,
        session: str,
        *,
        contains: str | None = None,
        until_exit: bool = False,
        timeout_s: float = 30.0,
    ) -> SessionRead:
        """All text the login listener got, once it contains ``contains`` (or the wait settled,
        with ``until_exit`` only then), else after ``timeout_s`` with ``timed_out`` set."""
        payload: dict[str, Any] = {"session": session, "untilExit": until_exit}
        if contains is not None:
            payload["contains"] = contains
        return await self._read(payload, timeout_s)

    async def open_duplex_channel(
        self,
        target: SessionTarget,
        command: Sequence[str],
        *,
        keep_data: bool = True,
        plugin_id: str | None = None,
        timeout_s: float = 60.0,
    ) -> str:
        """``getWorker(id).openDuplexChannel``: a handle id once the pair is bound. With
        ``keep_data`` False the driver only counts the bytes it receives."""
        payload = {
            **target.payload(),
            "pluginId": plugin_id or self.plugin_id,
            "command": list(command),
            "keepData": keep_data,
        }
        result = await self.command("duplexOpen", payload, timeout_s=timeout_s)
        return str(result["session"])

    async def write_duplex_channel(
        self,
        session: str,
        data: bytes,
        *,
        chunk_bytes: int = 262_144,
        drain: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        """One ``session.write`` per ``chunk_bytes`` of ``data``; with ``drain``, returns once
        the worker has answered every pending request (the host ends a route whose pending
        writes pass 393,216 bytes, so large payloads go in drained steps)."""
        payload = {
            "session": session,
            "data": base64.b64encode(data).decode("ascii"),
            "chunkBytes": chunk_bytes,
            "drain": drain,
            "timeoutMs": int(timeout_s * 1000),
        }
        result = await self.command("duplexWrite", payload, timeout_s=timeout_s + 30)
        if drain and result.get("drained") is not True:
            raise PeerCallError(None, f"{session}: writes still pending after {timeout_s} s")

    async def read_duplex_channel(
        self,
        session: str,
        *,
        offset: int = 0,
        min_bytes: int | None = None,
        until_exit: bool = False,
        timeout_s: float = 30.0,
    ) -> SessionRead:
        """The bytes the channel listener got from ``offset`` on, once ``min_bytes`` arrived in
        total (or the wait settled), else after ``timeout_s`` with ``timed_out`` set."""
        payload: dict[str, Any] = {"session": session, "offset": offset, "untilExit": until_exit}
        if min_bytes is not None:
            payload["minBytes"] = min_bytes
        return await self._read(payload, timeout_s)

    async def _read(self, payload: dict[str, Any], timeout_s: float) -> SessionRead:
        payload["timeoutMs"] = int(timeout_s * 1000)
        raw = await self.command("sessionRead", payload, timeout_s=timeout_s + 30)
        return SessionRead(
            received=int(raw["received"]),
            deliveries=int(raw["deliveries"]),
            exit=SessionExit.parse(raw.get("exit")),
            timed_out=bool(raw["timedOut"]),
            data=base64.b64decode(raw["data"]) if "data" in raw else b"",
            text=str(raw.get("text", "")),
        )

    async def wait_session(self, session: str, *, timeout_s: float = 30.0) -> SessionExit:
        """What the session's ``wait()`` settled with; ``PeerCallError`` if it did not."""
        raw = await self.command(
            "sessionWait",
            {"session": session, "timeoutMs": int(timeout_s * 1000)},
            timeout_s=timeout_s + 30,
        )
        parsed = SessionExit.parse(raw)
        if parsed is None:
            raise PeerCallError(None, f"{session}: wait() settled with {raw!r}")
        return parsed

    async def kill_session(self, session: str) -> None:
        """``session.kill()``: a fire-and-forget ``loginPtyStop`` / ``duplexChannelStop``."""
        await self.command("sessionKill", {"session": session})

    async def close_session(self, session: str, *, timeout_s: float = 30.0) -> float:
        """``session.close()`` (the host's close and its ack check); returns its milliseconds.
        The host resolves it even when it retires the worker over the ack: check the worker."""
        result = await self.command("sessionClose", {"session": session}, timeout_s=timeout_s)
        return float(result["closeMs"])

    async def gateway_argv(
        self,
        *,
        shell_command: str,
        remote_entrypoint: str,
        env: Mapping[str, str],
        node_command: str | None = None,
    ) -> list[str]:
        """The argv the host's gateway launcher builds (``buildDuplexGatewayLaunchArgv``)."""
        payload: dict[str, Any] = {
            "shellCommand": shell_command,
            "remoteEntrypoint": remote_entrypoint,
            "env": dict(env),
        }
        if node_command is not None:
            payload["nodeCommand"] = node_command
        result = await self.command("gatewayArgv", payload)
        return [str(part) for part in result]
