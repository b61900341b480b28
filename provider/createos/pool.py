"""One keep-alive connection pool per (API base URL, key), shared by every call of the worker.

A heartbeat is a burst of small requests; a pool per call paid a TCP (and TLS) handshake for
each of them. :class:`ConnectionPool` hands out :class:`CreateOSClient` objects that share one
``httpx.AsyncClient`` per API base URL (origin and path prefix) and key hash (the key itself is
only in that client's headers), so connections are reused across calls and leases.
:meth:`ConnectionPool.aclose` closes them all at shutdown; a client's own ``aclose`` leaves the
shared pool open.
"""

from __future__ import annotations

import hashlib

import httpx

from provider.createos.client import CreateOSClient, new_http_client
from provider.createos.pacer import pacer_for


class ConnectionPool:
    """Shared HTTP pools, keyed by API base URL and the SHA-256 of the key."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._transport = transport
        self._pools: dict[tuple[str, str], httpx.AsyncClient] = {}
        self._closed = False

    def client(self, base_url: str, api_key: str) -> CreateOSClient:
        """A client for one call; its requests reuse the shared connections."""
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        base_url = base_url.rstrip("/")
        key = (base_url, hashlib.sha256(api_key.encode()).hexdigest())
        http = self._pools.get(key)
        if http is None or http.is_closed:
            http = new_http_client(base_url, api_key, self._transport)
            self._pools[key] = http
        return CreateOSClient(base_url, api_key, pacer=pacer_for(base_url), http=http)

    @property
    def size(self) -> int:
        return len(self._pools)

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for http in pools:
            await http.aclose()
