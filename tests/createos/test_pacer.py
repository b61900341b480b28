"""RequestPacer, the shared token bucket (provider-behavior.md section 4, checklist 43-45).

Most tests run on a virtual-time asyncio loop (:class:`VirtualTimeLoop`): whenever nothing is
ready, time jumps to the next timer, and the pacers read that clock (``anyio.current_time``).
So the window bound, FIFO order, cancellation and 429 holds are checked at exact times, fast
and deterministically. Only the multi-process test uses the real clock (refill interval scaled
down to 20 ms); it asserts upper bounds on counts, never timings.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import random
import selectors
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provider.createos import pacer as pacer_module
from provider.createos.pacer import (
    CAPACITY,
    DEFAULT_INTERVAL,
    ENV_INTERVAL_MS,
    ENV_RUNTIME_DIR,
    MAX_HOLD,
    RequestPacer,
    normalize_origin,
    pacer_for,
)
from provider.devtools.windows import max_in_window

ORIGIN = "http://127.0.0.1:8790"
TAU = DEFAULT_INTERVAL
EPS = 1e-9  # float rounding of virtual times
WINDOWS = (1, 5, 10, 60)
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# --- virtual time ---------------------------------------------------------------------------


class _JumpingSelector(selectors.DefaultSelector):
    """Never sleeps: a select with a timeout and nothing ready moves the loop's clock instead."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> Any:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer at all: only real I/O could wake the loop
            ready = super().select(10.0)
            if not ready:
                raise RuntimeError("virtual-time loop: no timer and no I/O (a deadlock)")
            return ready
        self.loop.virtual_now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.virtual_now = 1000.0
        selector = _JumpingSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self.virtual_now


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": VirtualTimeLoop}


def run_virtual(func: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(func, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})


def virtual_pacer(
    shared_dir: Path | None, starts: list[float] | None = None, interval: float = TAU
) -> RequestPacer:
    on_start = starts.append if starts is not None else None
    return RequestPacer(
        ORIGIN,
        interval=interval,
        shared_dir=shared_dir,
        clock=anyio.current_time,
        on_start=on_start,
    )


@pytest.fixture(params=["in-process", "shared-file"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "in-process" else tmp_path / "run"


# --- the window bound -------------------------------------------------------------------------


def assert_window_bound(starts: Sequence[float], interval: float = TAU) -> None:
    """No window of T seconds (scaled with the interval) holds more than 10 + 4·T starts."""
    for seconds in WINDOWS:
        window = seconds * interval / TAU
        most = max_in_window(starts, window)
        assert most <= CAPACITY + 4 * seconds, (seconds, most, len(starts))


def test_max_in_window_counts_closed_windows() -> None:
    assert max_in_window([], 1) == 0
    assert max_in_window([0, 0, 0, 1, 1.5, 2.6], 1) == 4
    assert max_in_window([0, 0.5, 1.0, 1.5], 1) == 3


Burst = tuple[float, int, bool, float | None, float | None]
"""gap before it, size, wait for it to finish, cancel its waiters after, 429 hold after."""

bursts = st.tuples(
    st.floats(0, 3),
    st.integers(1, 12),
    st.booleans(),
    st.one_of(st.none(), st.none(), st.floats(0, 2)),
    st.one_of(st.none(), st.none(), st.none(), st.floats(0, 2)),
)


def simulate(workers: list[list[Burst]], folder: Path | None) -> tuple[list[float], int]:
    """Each worker runs its bursts on its own pacer (sharing ``folder``'s file, or one
    in-process pacer for all when ``folder`` is None). Returns the grant times and how many
    ``wait_turn`` calls returned."""
    starts: list[float] = []
    returned = 0

    async def request(pacer: RequestPacer, timeout: float | None) -> None:
        nonlocal returned
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await pacer.wait_turn()
            returned += 1

    async def worker(pacer: RequestPacer, plan: list[Burst]) -> None:
        async with anyio.create_task_group() as open_ended:
            for gap, size, wait, timeout, hold in plan:
                await anyio.sleep(gap)
                if wait:
                    async with anyio.create_task_group() as burst:
                        for _ in range(size):
                            burst.start_soon(request, pacer, timeout)
                else:
                    for _ in range(size):
                        open_ended.start_soon(request, pacer, timeout)
                if hold is not None:
                    await pacer.penalize(hold)

    async def main() -> None:
        one = virtual_pacer(None, starts)
        async with anyio.create_task_group() as tg:
            for plan in workers:
                pacer = virtual_pacer(folder, starts) if folder is not None else one
                tg.start_soon(worker, pacer, plan)

    run_virtual(main)
    return starts, returned


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
)
@given(
    workers=st.lists(st.lists(bursts, min_size=1, max_size=25), min_size=1, max_size=3),
    per_worker=st.booleans(),
)
def test_no_window_holds_more_than_10_plus_4t_starts(
    tmp_path_factory: pytest.TempPathFactory, workers: list[list[Burst]], per_worker: bool
) -> None:
    """Checklist 43: random bursts, gaps, cancellations and 429s from up to three workers (own
    pacers on one shared file, or one in-process pacer)."""
    folder = tmp_path_factory.mktemp("bucket") if per_worker else None
    starts, returned = simulate(workers, folder)
    assert returned == len(starts)  # every start was granted through the bucket
    assert_window_bound(starts)


def test_saturated_workers_get_the_whole_budget_and_no_more(tmp_path: Path) -> None:
    """Three heartbeat-like workers (bursts of 5, gaps of 200-600 ms, a poll each cycle) ask
    for far more than 4/s (7.5 minutes of starts): every window holds the bound, yet the busiest
    minute gets about 250."""
    rng = random.Random(43)
    plans: list[list[Burst]] = []
    for _ in range(3):
        plan: list[Burst] = []
        for _ in range(100):
            plan.append((rng.uniform(0.2, 0.6), 5, rng.random() < 0.5, None, None))
            plan.append((0.0, 1, False, None, None))  # the background poll
        plans.append(plan)
    starts, returned = simulate(plans, tmp_path)

    assert returned == len(starts) == 3 * 100 * 6
    assert_window_bound(starts)
    assert max_in_window(starts, 60) >= 245  # the bucket is not stingy either
    gaps = [b - a for a, b in pairwise(starts)]
    assert all(gap >= 0 for gap in gaps)  # granted in clock order


@pytest.mark.anyio
async def test_full_bucket_lets_ten_through_at_once(shared: Path | None) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(shared, starts)
    t0 = anyio.current_time()

    async with anyio.create_task_group() as tg:
        for _ in range(CAPACITY + 2):
            tg.start_soon(pacer.wait_turn)

    assert starts[:CAPACITY] == [t0] * CAPACITY  # no wait at all
    assert starts[CAPACITY] >= t0 + TAU
    assert starts[CAPACITY + 1] >= t0 + 2 * TAU


def test_full_bucket_lets_ten_through_without_sleeping_on_the_real_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []
    real_sleep = anyio.sleep

    async def counting_sleep(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(anyio, "sleep", counting_sleep)
    starts: list[float] = []
    pacer = RequestPacer(ORIGIN, shared_dir=tmp_path, on_start=starts.append)

    async def burst(size: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(size):
                tg.start_soon(pacer.wait_turn)

    anyio.run(burst, CAPACITY)
    assert len(starts) == CAPACITY and sleeps == []
    anyio.run(burst, 1)  # the bucket is empty now: the eleventh waits for a token
    assert len(starts) == CAPACITY + 1 and sleeps


@pytest.mark.anyio
async def test_waiters_are_served_in_call_order(shared: Path | None) -> None:
    pacer = virtual_pacer(shared)
    t0 = anyio.current_time()
    order: list[tuple[int, float]] = []

    async def waiter(index: int) -> None:
        await pacer.wait_turn()
        order.append((index, anyio.current_time() - t0))

    async with anyio.create_task_group() as tg:
        for index in range(25):
            tg.start_soon(waiter, index)
            await anyio.sleep(0.01)

    assert [index for index, _ in order] == list(range(25))
    # Ten from the full bucket as they came, then one per refill.
    assert_window_bound([t for _, t in order])
    assert order[-1][1] >= (25 - CAPACITY) * TAU - EPS


async def drain(pacer: RequestPacer) -> None:
    for _ in range(CAPACITY):
        await pacer.wait_turn()


@pytest.mark.anyio
async def test_already_cancelled_waiter_fails_at_once_and_the_next_still_runs(
    shared: Path | None,
) -> None:
    """Checklist 44, behind a pending waiter and with a full bucket."""
    pacer = virtual_pacer(shared)
    events: list[tuple[str, float]] = []

    async def waiter(name: str) -> None:
        await pacer.wait_turn()
        events.append((name, anyio.current_time()))

    await drain(pacer)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "pending")  # first in line: a token comes at t0 + 250 ms
        await anyio.sleep(0.01)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await pacer.wait_turn()
            events.append(("cancelled waiter ran", anyio.current_time()))
        assert scope.cancelled_caught
        events.append(("cancelled", anyio.current_time()))
        tg.start_soon(waiter, "next")

    assert [name for name, _ in events] == ["cancelled", "pending", "next"]
    times = dict(events)
    assert times["cancelled"] == pytest.approx(t0 + 0.01)  # at once
    assert t0 + TAU - EPS <= times["pending"] < t0 + TAU + 0.01
    assert t0 + 2 * TAU - EPS <= times["next"] < t0 + 2 * TAU + 0.01  # it took no token

    # With a full bucket too: the cancelled waiter leaves the tokens to the ten behind it.
    await anyio.sleep(CAPACITY * TAU)
    starts: list[float] = []
    fresh = virtual_pacer(shared, starts)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await fresh.wait_turn()
    assert scope.cancelled_caught and starts == []
    now = anyio.current_time()
    await drain(fresh)
    assert starts == [now] * CAPACITY


@pytest.mark.anyio
async def test_waiter_cancelled_while_queued_leaves_before_the_pending_one_starts(
    shared: Path | None,
) -> None:
    """Checklist 45: the queued waiter leaves at once; the later one keeps the spacing and
    gets the token the cancelled one did not take."""
    pacer = virtual_pacer(shared)
    events: list[tuple[str, float]] = []
    queued = anyio.CancelScope()

    async def waiter(name: str, scope: anyio.CancelScope | None = None) -> None:
        with scope or anyio.CancelScope():
            await pacer.wait_turn()
            events.append((name, anyio.current_time()))
            return
        events.append((f"{name} cancelled", anyio.current_time()))

    await drain(pacer)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "pending")
        await anyio.sleep(0.01)
        tg.start_soon(waiter, "queued", queued)  # behind "pending"
        await anyio.sleep(0.01)
        tg.start_soon(waiter, "later")  # behind "queued"
        await anyio.sleep(0.05)
        queued.cancel()

    assert [name for name, _ in events] == ["queued cancelled", "pending", "later"]
    times = dict(events)
    assert times["queued cancelled"] == pytest.approx(t0 + 0.07)
    assert t0 + TAU - EPS <= times["pending"] < t0 + TAU + 0.01
    assert t0 + 2 * TAU - EPS <= times["later"] < t0 + 2 * TAU + 0.01


@pytest.mark.anyio
async def test_first_waiter_cancelled_while_sleeping_hands_the_line_on(
    shared: Path | None,
) -> None:
    pacer = virtual_pacer(shared)
    events: list[tuple[str, float]] = []

    async def waiter(name: str, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await pacer.wait_turn()
            events.append((name, anyio.current_time()))
            return
        events.append((f"{name} cancelled", anyio.current_time()))

    await drain(pacer)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "first", 0.1)
        await anyio.sleep(0.01)
        tg.start_soon(waiter, "second", 10)

    assert [name for name, _ in events] == ["first cancelled", "second"]
    assert t0 + TAU - EPS <= dict(events)["second"] < t0 + TAU + 0.01


@pytest.mark.anyio
async def test_a_failing_waiter_does_not_break_the_line(shared: Path | None) -> None:
    """The first waiter's clock read fails when its token is due: it fails with that error,
    and the waiters behind it still start, one per refill."""
    armed = False

    def clock() -> float:
        nonlocal armed
        if armed:
            armed = False
            raise RuntimeError("clock failure")
        return anyio.current_time()

    pacer = RequestPacer(ORIGIN, shared_dir=shared, clock=clock)
    events: list[str] = []

    async def waiter(name: str) -> None:
        try:
            await pacer.wait_turn()
        except RuntimeError:
            events.append(f"{name} failed")
        else:
            events.append(name)

    async def arm() -> None:
        nonlocal armed
        await anyio.sleep(0.2)  # the first waiter sleeps until 0.25 with no clock reads
        armed = True

    await drain(pacer)
    async with anyio.create_task_group() as tg:
        for name in ("first", "second", "third"):
            tg.start_soon(waiter, name)
        tg.start_soon(arm)

    assert events == ["first failed", "second", "third"]


@pytest.mark.anyio
async def test_tokens_refill_at_four_per_second_up_to_ten(shared: Path | None) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(shared, starts)
    await drain(pacer)
    await anyio.sleep(1.0)  # four tokens back
    t1 = anyio.current_time()
    for _ in range(5):
        await pacer.wait_turn()
    assert starts[CAPACITY : CAPACITY + 4] == [t1] * 4
    assert starts[-1] >= t1 + TAU - EPS

    await anyio.sleep(3600)  # a long pause refills to ten, not more
    t2 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(CAPACITY + 1):
            tg.start_soon(pacer.wait_turn)
    assert starts[-(CAPACITY + 1) : -1] == [t2] * CAPACITY
    assert starts[-1] >= t2 + TAU - EPS


# --- 429 ------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("retry_after", "hold"),
    [(2.0, 2.0), (None, 0.0), (0.0, 0.0), (float("nan"), 0.0), (3600.0, MAX_HOLD)],
)
async def test_429_empties_the_bucket_and_holds_every_worker_until_retry_after(
    tmp_path: Path, retry_after: float | None, hold: float
) -> None:
    starts: list[float] = []
    one = virtual_pacer(tmp_path, starts)
    two = virtual_pacer(tmp_path, starts)  # another worker on the same host
    await one.wait_turn()  # nine tokens left
    t0 = anyio.current_time()

    await one.penalize(retry_after)
    async with anyio.create_task_group() as tg:
        for pacer in (two, one, two):
            tg.start_soon(pacer.wait_turn)

    later = sorted(starts[1:])
    assert len(later) == 3
    # No start before the hold ends, then an empty bucket refilling at 4/s: no burst.
    assert later[0] >= t0 + hold + TAU - EPS
    assert later[1] >= later[0] + TAU - EPS and later[2] >= later[1] + TAU - EPS
    assert later[2] < t0 + hold + 3 * TAU + 0.01


@pytest.mark.anyio
async def test_429_delays_a_waiter_already_sleeping_for_its_token(shared: Path | None) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(shared, starts)
    await drain(pacer)
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(pacer.wait_turn)  # due at t0 + 250 ms
        await anyio.sleep(0.1)
        await pacer.penalize(1.0)
    assert starts[-1] >= t0 + 0.1 + 1.0 + TAU - EPS


@pytest.mark.anyio
async def test_unpaced_pacer_ignores_429_and_keeps_cancellation() -> None:
    pacer = RequestPacer(ORIGIN, interval=0, clock=anyio.current_time)
    t0 = anyio.current_time()
    await pacer.penalize(30)
    for _ in range(50):
        await pacer.wait_turn()
    assert anyio.current_time() == t0
    assert pacer.shared_path is None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await pacer.wait_turn()
    assert scope.cancelled_caught


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
    assert pacer.interval == 0.25 and pacer.capacity == 10
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
