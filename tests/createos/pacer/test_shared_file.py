"""RequestPacer across processes: the shared file (private, named by the origin hash, robust to
stale records and busy locks), the fallback, ``pacer_for`` and the environment, and three real
worker processes on one bucket (real clock, counts only)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from provider.createos import pacer as pacer_module
from provider.createos.pacer import (
    CAPACITY,
    ENV_INTERVAL_MS,
    ENV_RUNTIME_DIR,
    RequestPacer,
    normalize_origin,
    pacer_for,
)
from tests.createos.pacer.virtual_time import (
    EPS,
    ORIGIN,
    REPO,
    TAU,
    assert_window_bound,
    drain,
    virtual_pacer,
)

# --- the shared file ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_shared_file_is_private_and_named_by_the_origin_hash(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    pacer = RequestPacer("HTTP://127.0.0.1:8790/", shared_dir=folder, clock=anyio.current_time)

    await pacer.wait_turn()

    path = pacer.shared_path
    assert path is not None and path.parent == folder
    assert len(path.stem) == 64 and path.suffix == ".pace"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    tag, boot, full_at = path.read_bytes().split()
    assert tag == b"tb1" and boot == Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()
    assert float(full_at) == anyio.current_time() + TAU  # full again one refill later
    assert RequestPacer(ORIGIN, shared_dir=folder).shared_path == path


@pytest.mark.anyio
@pytest.mark.parametrize(
    "record",
    [
        b"tb1 another-boot 1e12\n",
        b"tb1 {boot} 1e12\n",  # same boot, impossibly far ahead
        b"tb1 {boot} nan\n",
        b"{boot} 1e12 1e12\n",  # the even-spacing record of earlier versions
        b"garbage",
    ],
)
async def test_stale_or_corrupt_shared_records_are_ignored(tmp_path: Path, record: bytes) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(tmp_path, starts)
    path = pacer.shared_path
    assert path is not None
    boot = Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()
    path.write_bytes(record.replace(b"{boot}", boot))
    t0 = anyio.current_time()

    await drain(pacer)  # a full bucket, as if there were no record

    assert starts == [t0] * CAPACITY


@pytest.mark.anyio
async def test_removed_file_does_not_refill_this_process(tmp_path: Path) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(tmp_path, starts)
    await drain(pacer)
    path = pacer.shared_path
    assert path is not None
    path.write_bytes(b"")
    t0 = anyio.current_time()
    await pacer.wait_turn()
    assert starts[-1] >= t0 + TAU - EPS


@pytest.mark.anyio
async def test_busy_lock_is_polled_without_blocking_the_loop_and_keeps_fifo(
    tmp_path: Path,
) -> None:
    """Another process holds the lock for 50 ms: the waiters poll (the loop keeps running),
    then start in call order, even one that arrives after the release but before the first
    waiter's next poll."""
    pacer = virtual_pacer(tmp_path)
    path = pacer.shared_path
    assert path is not None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    t0 = anyio.current_time()
    order: list[tuple[str, float]] = []

    async def hold_lock() -> None:  # another process mid-update
        fcntl.flock(fd, fcntl.LOCK_EX)
        await anyio.sleep(0.0502)  # released between two 1 ms polls
        fcntl.flock(fd, fcntl.LOCK_UN)

    async def waiter(name: str, delay: float) -> None:
        await anyio.sleep(delay)
        await pacer.wait_turn()
        order.append((name, anyio.current_time() - t0))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_lock)
            tg.start_soon(waiter, "a", 0.0001)
            tg.start_soon(waiter, "b", 0.01)
            tg.start_soon(waiter, "c", 0.0504)  # the lock is free and the bucket full
    finally:
        os.close(fd)

    assert [name for name, _ in order] == ["a", "b", "c"]
    assert all(0.0502 <= t < 0.06 for _, t in order)  # after the release, in one burst


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["world-writable folder", "folder is a file"])
async def test_unusable_folder_falls_back_to_an_in_process_bucket_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    folder = tmp_path / "run"
    if kind == "world-writable folder":
        folder.mkdir()
        folder.chmod(0o777)
    else:
        folder.write_text("not a folder")
    starts: list[float] = []
    pacer = virtual_pacer(folder, starts)

    with caplog.at_level(logging.WARNING, logger=pacer_module.__name__):
        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(pacer.wait_turn)
        await pacer.penalize(1.0)
        await pacer.wait_turn()

    assert pacer.shared_path is None
    if folder.is_dir():
        assert list(folder.iterdir()) == []
    warnings = [r for r in caplog.records if "falls back to this process only" in r.message]
    assert len(warnings) == 1
    assert len(starts) == 31
    assert_window_bound(starts)
    assert starts[-1] >= starts[-2] + 1.0 + TAU - EPS  # the 429 hold works in-process too


# --- pacer_for and the environment ----------------------------------------------------------


def test_pacer_for_is_one_pacer_per_normalized_origin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(pacer_module, "_registry", {})
    monkeypatch.setenv(ENV_RUNTIME_DIR, str(tmp_path))
    monkeypatch.delenv(ENV_INTERVAL_MS, raising=False)

    pacer = pacer_for("https://API.sb.createos.sh:443/")

    assert pacer is pacer_for("https://api.sb.createos.sh")
    assert pacer is not pacer_for("https://api.sb.createos.sh:8443")
    assert pacer.interval == 0.25 and pacer.capacity == 40
    assert pacer.shared_path is not None and pacer.shared_path.parent == tmp_path


@pytest.mark.parametrize(
    ("raw", "interval"),
    [("0", 0.0), ("20", 0.02), ("1000", 1.0), ("", 0.25), ("fast", 0.25), ("-5", 0.25)],
)
def test_pace_ms_sets_the_refill_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: str, interval: float
) -> None:
    monkeypatch.setattr(pacer_module, "_registry", {})
    monkeypatch.setenv(ENV_RUNTIME_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_INTERVAL_MS, raw)

    pacer = pacer_for(ORIGIN)

    assert pacer.interval == interval and pacer.capacity == CAPACITY
    assert (pacer.shared_path is None) == (interval == 0)


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


# --- real processes -------------------------------------------------------------------------

CHILD = """
import json, random, sys
from pathlib import Path
import anyio
from provider.createos.pacer import RequestPacer

origin, folder, interval, count, seed = sys.argv[1:6]
grants = []
pacer = RequestPacer(origin, interval=float(interval), shared_dir=Path(folder),
                     on_start=grants.append)
print("ready", flush=True)
sys.stdin.readline()

async def main() -> None:
    rng = random.Random(int(seed))
    left = int(count)
    async with anyio.create_task_group() as tg:
        while left:
            size = min(left, rng.randint(1, 8))
            left -= size
            for _ in range(size):
                tg.start_soon(pacer.wait_turn)
            await anyio.sleep(rng.uniform(0, 0.06))

anyio.run(main)
print(json.dumps(grants))
"""


@pytest.mark.slow
def test_three_worker_processes_share_one_bucket(tmp_path: Path) -> None:
    """Checklist 43 across OS processes: three children on one runtime folder, real clock,
    random bursts, the refill interval scaled down to 20 ms (windows scaled alike)."""
    interval, per_child = 0.02, 40
    env = {k: v for k, v in os.environ.items() if k not in (ENV_INTERVAL_MS, ENV_RUNTIME_DIR)}
    argv = [sys.executable, "-c", CHILD, ORIGIN, str(tmp_path), str(interval), str(per_child)]
    children = [
        subprocess.Popen(
            [*argv, str(seed)],
            env=env,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2, 3)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:  # all at once: they contend from the first burst
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        grants: list[list[float]] = []
        for child in children:
            out, _ = child.communicate(timeout=60)
            assert child.returncode == 0
            grants.append(json.loads(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()

    assert [len(g) for g in grants] == [per_child] * 3
    merged = [t for g in grants for t in g]
    assert_window_bound(merged, interval)
    # The children really overlapped (their grants interleave pairwise).
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert min(grants[a]) < max(grants[b]) and min(grants[b]) < max(grants[a])
