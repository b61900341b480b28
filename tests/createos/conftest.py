"""Fixtures for the CreateOS client tests: an unpaced client on pytest-httpserver with no
backoff (``client``), and one on a real emulator with a short backoff (``emu``, ``api``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pytest_httpserver import HTTPServer

from provider.createos import core as core_module
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.emulator.bwrap import BwrapUnavailable
from provider.emulator.server import Emulator

API_KEY = "key-Zx81-not-for-logs"
EMULATOR_KEY = "client-test-key"


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


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    try:
        async with Emulator(api_keys=[EMULATOR_KEY]) as emulator:
            yield emulator
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
async def api(emu: Emulator) -> AsyncIterator[CreateOSClient]:
    base_url = emu.base_url.rstrip("/")
    async with CreateOSClient(
        base_url, EMULATOR_KEY, pacer=RequestPacer(base_url, interval=0), backoff_base=0.01
    ) as client:
        yield client
