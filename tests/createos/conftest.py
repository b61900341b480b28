"""Fixtures for the CreateOS client tests: an unpaced client on pytest-httpserver, no backoff."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pytest_httpserver import HTTPServer

from provider.createos import core as core_module
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer

API_KEY = "key-Zx81-not-for-logs"


class CountingPacer(RequestPacer):
    """An unpaced pacer that counts turns (one per request attempt)."""

    def __init__(self, origin: str) -> None:
        super().__init__(origin, interval=0)
        self.turns = 0

    async def wait_turn(self) -> None:
        self.turns += 1
        await super().wait_turn()


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records the client's waits between attempts instead of sleeping."""
    seen: list[float] = []

    async def record(seconds: float) -> None:
        seen.append(seconds)

    monkeypatch.setattr(core_module, "_sleep", record)
    return seen


@pytest.fixture
def origin(httpserver: HTTPServer) -> str:
    return httpserver.url_for("/").rstrip("/")


@pytest.fixture
def pacer(origin: str) -> CountingPacer:
    return CountingPacer(origin)


@pytest.fixture
async def client(origin: str, pacer: CountingPacer) -> AsyncIterator[CreateOSClient]:
    async with CreateOSClient(origin, API_KEY, pacer=pacer, backoff_base=0.001) as api:
        yield api
