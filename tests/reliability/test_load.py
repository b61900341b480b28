"""Load, short version (issue 8, item 6): one real worker, 5 leases, commands for 10 s, rate
limit on. ``bench/load.py`` runs the full 20 leases for a minute and prints the figures.

Asserted: every command started completes with its own output; the emulator never answered 429
(so none could reach a caller); request starts on the wire never run ahead of the pacer's
bound (40 + 4·T in any T seconds) by more than the send jitter (``MAX_AHEAD_MS``); nothing is
left in the emulator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from provider.emulator import BwrapUnavailable
from provider.emulator.bwrap import probe_runtime
from tests.reliability.load_run import run_load

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MAX_AHEAD_MS = 150.0


async def test_five_leases_for_ten_seconds_under_the_rate_limit(tmp_path: Path) -> None:
    try:
        probe_runtime()
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    report = await run_load(5, 10.0, tmp_path)

    assert report.command_failures == []
    assert report.commands_completed == report.commands_started >= 5
    assert report.emulator_429s == 0
    assert report.requests_total == report.emulator_requests  # the proxy saw every request
    assert report.max_ahead_of_bound_ms <= MAX_AHEAD_MS, report
    assert report.leaked == []
