"""RequestPacer's bucket: the full burst, FIFO order, cancellation while queued or sleeping,
refill, and the 429 hold (docs/protocol.md 4, checklist 44-45); virtual time."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from provider.createos.pacer import (
    CAPACITY,
    MAX_HOLD,
    RequestPacer,
)
from tests.createos.pacer.virtual_time import (
    EPS,
    ORIGIN,
    TAU,
    assert_window_bound,
    drain,
    virtual_pacer,
)


@pytest.mark.anyio
async def test_full_bucket_lets_the_capacity_through_at_once(shared: Path | None) -> None:
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
        for index in range(CAPACITY + 15):
            tg.start_soon(waiter, index)
            await anyio.sleep(0.01)

    assert [index for index, _ in order] == list(range(CAPACITY + 15))
    # The capacity from the full bucket as they came, then one per refill.
    assert_window_bound([t for _, t in order])
    assert order[-1][1] >= 15 * TAU - EPS


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

    # With a full bucket too: the cancelled waiter leaves the tokens to the capacity behind it.
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
async def test_tokens_refill_at_four_per_second_up_to_capacity(shared: Path | None) -> None:
    starts: list[float] = []
    pacer = virtual_pacer(shared, starts)
    await drain(pacer)
    await anyio.sleep(1.0)  # four tokens back
    t1 = anyio.current_time()
    for _ in range(5):
        await pacer.wait_turn()
    assert starts[CAPACITY : CAPACITY + 4] == [t1] * 4
    assert starts[-1] >= t1 + TAU - EPS

    await anyio.sleep(3600)  # a long pause refills to capacity, not more
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
    await one.wait_turn()  # one token spent
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
