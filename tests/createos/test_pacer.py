"""RequestPacer with the real 300 ms interval: spacing, cancellation, cross-process sharing.

Only lower bounds on spacing are asserted (a slow machine can only widen gaps); "at once" is
shown by ordering against a waiter that is known to start 300 ms later.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import anyio
import pytest

from provider.createos import pacer as pacer_module
from provider.createos.pacer import (
    ENV_INTERVAL_MS,
    ENV_RUNTIME_DIR,
    RequestPacer,
    normalize_origin,
    pacer_for,
)

ORIGIN = "http://127.0.0.1:8790"
MIN_GAP = 0.28
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["in-process", "shared-file"])
def make_pacer(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], RequestPacer]:
    shared = None if request.param == "in-process" else tmp_path / "run"
    return lambda: RequestPacer(ORIGIN, shared_dir=shared)


def assert_spaced(starts: list[float]) -> None:
    gaps = [b - a for a, b in pairwise(sorted(starts))]
    assert all(gap >= MIN_GAP for gap in gaps), gaps


@pytest.mark.anyio
async def test_three_concurrent_requests_start_at_least_280_ms_apart(
    make_pacer: Callable[[], RequestPacer],
) -> None:
    pacer = make_pacer()
    starts: list[float] = []

    async def request() -> None:
        await pacer.wait_turn()
        starts.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(request)

    assert len(starts) == 3
    assert_spaced(starts)


@pytest.mark.anyio
async def test_already_cancelled_waiter_fails_at_once_and_the_next_still_runs(
    make_pacer: Callable[[], RequestPacer],
) -> None:
    pacer = make_pacer()
    events: list[tuple[str, float]] = []

    async def waiter(name: str) -> None:
        await pacer.wait_turn()
        events.append((name, time.monotonic()))

    async with anyio.create_task_group() as tg:
        await waiter("first")
        tg.start_soon(waiter, "pending")  # queued: starts 300 ms after "first"
        await anyio.sleep(0.01)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await pacer.wait_turn()
            events.append(("cancelled waiter ran", time.monotonic()))
        assert scope.cancelled_caught
        events.append(("cancelled", time.monotonic()))
        tg.start_soon(waiter, "next")

    assert [name for name, _ in events] == ["first", "cancelled", "pending", "next"]
    assert_spaced([t for name, t in events if name != "cancelled"])


@pytest.mark.anyio
async def test_waiter_cancelled_while_queued_leaves_before_the_pending_one_starts(
    make_pacer: Callable[[], RequestPacer],
) -> None:
    pacer = make_pacer()
    events: list[tuple[str, float]] = []
    queued = anyio.CancelScope()

    async def waiter(name: str, scope: anyio.CancelScope | None = None) -> None:
        with scope or anyio.CancelScope():
            await pacer.wait_turn()
            events.append((name, time.monotonic()))
            return
        events.append((f"{name} cancelled", time.monotonic()))

    async with anyio.create_task_group() as tg:
        await waiter("first")
        tg.start_soon(waiter, "pending")
        await anyio.sleep(0.01)
        tg.start_soon(waiter, "queued", queued)  # behind "pending"
        await anyio.sleep(0.01)
        tg.start_soon(waiter, "later")  # behind "queued"
        await anyio.sleep(0.05)
        queued.cancel()

    names = [name for name, _ in events]
    assert names == ["first", "queued cancelled", "pending", "later"]
    assert_spaced([t for name, t in events if name != "queued cancelled"])


@pytest.mark.anyio
async def test_zero_interval_disables_pacing_but_not_cancellation() -> None:
    pacer = RequestPacer(ORIGIN, interval=0)
    for _ in range(50):
        await pacer.wait_turn()
    assert pacer.shared_path is None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await pacer.wait_turn()
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_shared_file_is_private_and_named_by_the_origin_hash(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    pacer = RequestPacer("HTTP://127.0.0.1:8790/", shared_dir=folder)

    await pacer.wait_turn()

    path = pacer.shared_path
    assert path is not None and path.parent == folder
    assert len(path.stem) == 64 and path.suffix == ".pace"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fields = path.read_bytes().split()
    assert len(fields) == 3
    assert RequestPacer(ORIGIN, shared_dir=folder).shared_path == path


@pytest.mark.anyio
async def test_two_pacers_on_one_file_share_the_spacing(tmp_path: Path) -> None:
    one = RequestPacer(ORIGIN, shared_dir=tmp_path)
    two = RequestPacer(ORIGIN, shared_dir=tmp_path)
    starts: list[float] = []

    async def request(pacer: RequestPacer) -> None:
        await pacer.wait_turn()
        starts.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        for pacer in (one, two, one, two):
            tg.start_soon(request, pacer)

    assert_spaced(starts)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "record",
    [
        b"another-boot 1e12 1e12\n",
        b"{boot} 1e12 1e12\n",  # same boot, impossibly far ahead
        b"{boot} nan nan\n",
        b"garbage",
    ],
)
async def test_stale_or_corrupt_shared_records_are_ignored(tmp_path: Path, record: bytes) -> None:
    pacer = RequestPacer(ORIGIN, shared_dir=tmp_path)
    path = pacer.shared_path
    assert path is not None
    boot = Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()
    path.write_bytes(record.replace(b"{boot}", boot))

    with anyio.fail_after(5):  # honouring the record would wait for hours
        await pacer.wait_turn()
        await pacer.wait_turn()


@pytest.mark.anyio
async def test_unsafe_shared_folder_falls_back_to_in_process_pacing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    pacer = RequestPacer(ORIGIN, shared_dir=folder)
    starts: list[float] = []

    with caplog.at_level(logging.WARNING, logger=pacer_module.__name__):
        for _ in range(2):
            await pacer.wait_turn()
            starts.append(time.monotonic())

    assert pacer.shared_path is None
    assert list(folder.iterdir()) == []
    assert "falls back to this process only" in caplog.text
    assert_spaced(starts)


def test_pacer_for_is_one_pacer_per_normalized_origin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(pacer_module, "_registry", {})
    monkeypatch.setenv(ENV_RUNTIME_DIR, str(tmp_path))
    monkeypatch.delenv(ENV_INTERVAL_MS, raising=False)

    pacer = pacer_for("https://API.sb.createos.sh:443/")

    assert pacer is pacer_for("https://api.sb.createos.sh")
    assert pacer is not pacer_for("https://api.sb.createos.sh:8443")
    assert pacer.interval == 0.3
    assert pacer.shared_path is not None and pacer.shared_path.parent == tmp_path


def test_pacer_for_interval_can_be_lowered_for_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacer_module, "_registry", {})
    monkeypatch.setenv(ENV_INTERVAL_MS, "0")

    assert pacer_for(ORIGIN).interval == 0
    assert pacer_for(ORIGIN).shared_path is None


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("https://API.sb.createos.sh:443/v1/", "https://api.sb.createos.sh"),
        ("http://127.0.0.1:8790", "http://127.0.0.1:8790"),
        ("http://localhost:80", "http://localhost"),
        ("http://[::1]:8790/", "http://[::1]:8790"),
    ],
)
def test_normalize_origin(raw: str, normalized: str) -> None:
    assert normalize_origin(raw) == normalized


CHILD = """
import json, sys, time
import anyio
from provider.createos.pacer import pacer_for

origin, start_at, turns = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])

async def main() -> None:
    pacer = pacer_for(origin)
    ready = time.monotonic()
    while time.monotonic() < start_at:
        await anyio.sleep(0.002)
    starts = []
    for _ in range(turns):
        await pacer.wait_turn()
        starts.append(time.monotonic())
    print(json.dumps({"ready": ready, "starts": starts}))

anyio.run(main)
"""


@pytest.mark.slow
def test_two_worker_processes_on_one_host_share_the_spacing(tmp_path: Path) -> None:
    """Two processes share a runtime folder; a control pair with separate folders does not."""
    start_at = time.monotonic() + 4.0
    env = {k: v for k, v in os.environ.items() if k != ENV_INTERVAL_MS}
    folders = ["shared", "shared", "alone-1", "alone-2"]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, ORIGIN, repr(start_at), "4"],
            env={**env, ENV_RUNTIME_DIR: str(tmp_path / folder)},
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        for folder in folders
    ]
    results = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        results.append(json.loads(out))
    assert all(r["ready"] < start_at for r in results), "a child started too late"

    shared_a, shared_b = results[0]["starts"], results[1]["starts"]
    assert_spaced(shared_a + shared_b)
    # The two processes really ran side by side (their turns interleave).
    assert min(shared_a) < max(shared_b) and min(shared_b) < max(shared_a)

    # Control: without a common folder the two processes start together.
    alone = sorted(results[2]["starts"] + results[3]["starts"])
    assert min(b - a for a, b in pairwise(alone)) < MIN_GAP
