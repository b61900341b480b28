"""Shared pytest configuration: every async test runs on anyio's asyncio backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from provider.createos import exec_stream as exec_stream_module
from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime


@pytest.fixture(autouse=True)
def _fresh_exec_stream_memory() -> Iterator[None]:
    """A worker remembers, per API URL, a server without the exec stream for its whole life;
    tests reuse ports, so one test's older-server emulator must not shape the next test's."""
    yield
    exec_stream_module._STREAMLESS.clear()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    """A started CreateOS emulator (keys ``test-key`` and ``other-key``), stopped afterwards.

    Skips when bubblewrap cannot sandbox on this machine. Teardown asserts that no sandbox
    process outlived the emulator.
    """
    try:
        await anyio.to_thread.run_sync(probe_runtime)
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    emu = Emulator(api_keys=["test-key", "other-key"])
    async with emu:
        yield emu
    leaked = emu.leaked_host_pids()
    assert leaked == [], f"sandbox processes left alive after emulator stop: {_describe(leaked)}"


def _describe(pids: list[int]) -> dict[int, str]:
    details = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                details[pid] = fh.read()[:120]
        except OSError:
            details[pid] = "gone"
    return details
