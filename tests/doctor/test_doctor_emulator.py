"""``python -m provider doctor`` as a real subprocess against the bundled emulator: every check
ok (the 429 one skipped with its reason), the table printed, one sandbox created and deleted,
no guest process left, neither key in the output.

The emulator's idle-pause floor is lowered (``min_auto_pause_seconds``, an admin setting) so a
2 s window can be checked for real in about 8 s; its heartbeats come every second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from provider.doctor import cli
from provider.doctor.report import ASSUMPTIONS
from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime
from tests.doctor.conftest import Ran, key_file, run_doctor

pytestmark = pytest.mark.anyio

KEY = "emulator-doctor-key-not-for-output"
OTHER_KEY = "emulator-doctor-other-key"


@pytest.fixture
async def quick_emulator() -> AsyncIterator[Emulator]:
    try:
        await anyio.to_thread.run_sync(probe_runtime)
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    settings = {"min_auto_pause_seconds": 1, "heartbeat_ms": 1000}
    async with Emulator(api_keys=[KEY, OTHER_KEY], settings=settings) as emu:
        yield emu


async def test_doctor_passes_on_the_emulator_and_leaves_nothing(
    quick_emulator: Emulator, tmp_path: Path
) -> None:
    argv = [
        "--api-url",
        quick_emulator.base_url,
        "--api-key-file",
        key_file(tmp_path, "key", KEY),
        "--second-api-key-file",
        key_file(tmp_path, "other", OTHER_KEY),
        "--auto-pause-seconds",
        "2",
        "--stream-seconds",
        "3",
    ]

    ran: Ran = await anyio.to_thread.run_sync(run_doctor, argv)

    assert ran.code == cli.EXIT_OK, ran
    assert ran.stdout.startswith("result  "), ran.stdout
    for key, text in ASSUMPTIONS.items():
        row = ran.row(text)
        expected = "skipped" if key == "retry_after" else "ok"
        assert row.split()[0] == expected, row
    assert "not observed" in ran.row(ASSUMPTIONS["retry_after"])
    assert "sandboxes created: 1, deleted: 1" in ran.stdout
    for key in (KEY, OTHER_KEY):
        assert key not in ran.stdout + ran.stderr
    state = await quick_emulator.admin.state()
    live = [s for s in state["sandboxes"] if s["status"] not in ("destroying", "destroyed")]
    assert live == []
    assert await quick_emulator.admin.live_process_count() == 0
    requests = await quick_emulator.admin.requests()
    creates = [r for r in requests if r["method"] == "POST" and r["path"] == "/v1/sandboxes"]
    deletes = [r for r in requests if r["method"] == "DELETE"]
    assert len(creates) == len(deletes) == 1
