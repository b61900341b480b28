"""The minute's budget: capacity 40 at 4 per second is 280 starts in any 60 s, tight, and stays
so right after a 429's hold and across a worker restart on the shared file; virtual time."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from devtools.windows import max_in_window
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL, RequestPacer
from tests.createos.pacer.virtual_time import (
    EPS,
    MINUTE_BUDGET,
    TAU,
    assert_window_bound,
    drain,
    virtual_pacer,
)


async def greedy(pacer: RequestPacer, count: int) -> None:
    """``count`` requests asking at once, as a worker with a long queue does."""
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(pacer.wait_turn)


def test_capacity_and_a_minute_of_refill_fit_the_budget() -> None:
    assert CAPACITY + 60 / DEFAULT_INTERVAL <= MINUTE_BUDGET
    assert CAPACITY == 40  # all the burst the budget allows at 4 per second


@pytest.mark.anyio
async def test_greedy_workers_on_one_file_get_exactly_the_budget_in_a_minute(
    tmp_path: Path,
) -> None:
    starts: list[float] = []
    workers = [virtual_pacer(tmp_path, starts) for _ in range(3)]
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for pacer in workers:
            tg.start_soon(greedy, pacer, 150)

    assert starts.count(t0) == CAPACITY
    assert_window_bound(starts)
    assert max_in_window(starts, 60) == MINUTE_BUDGET  # the bound is tight: not stingy, not over


@pytest.mark.anyio
async def test_after_a_429_hold_the_bucket_refills_from_zero(tmp_path: Path) -> None:
    starts: list[float] = []
    one, two = virtual_pacer(tmp_path, starts), virtual_pacer(tmp_path, starts)
    await drain(one)  # a full burst, then the 429
    t0 = anyio.current_time()
    await one.penalize(5.0)

    await anyio.sleep(5.0 + 3.0)  # three seconds after the hold: 12 tokens, not 40
    t1 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(greedy, two, 150)
        tg.start_soon(greedy, one, 150)

    assert starts.count(t1) == 12
    assert not [t for t in starts if t0 < t < t0 + 5.0 + TAU - EPS]
    assert_window_bound(starts)
    assert max_in_window(starts, 60) <= MINUTE_BUDGET


@pytest.mark.anyio
async def test_greedy_demand_right_as_the_hold_ends_gets_no_burst(tmp_path: Path) -> None:
    starts: list[float] = []
    one, two = virtual_pacer(tmp_path, starts), virtual_pacer(tmp_path, starts)
    await drain(one)
    t0 = anyio.current_time()
    await one.penalize(5.0)
    async with anyio.create_task_group() as tg:  # queued through the hold
        tg.start_soon(greedy, two, 150)
        tg.start_soon(greedy, one, 150)

    later = sorted(starts[CAPACITY:])
    assert later[0] >= t0 + 5.0 + TAU - EPS
    assert len([t for t in later if t <= t0 + 5.0 + 10.0]) == 40  # 4/s from empty, no burst
    assert_window_bound(starts)


@pytest.mark.anyio
async def test_a_restarted_worker_reads_what_its_predecessor_and_others_spent(
    tmp_path: Path,
) -> None:
    """A fresh process (a new pacer, no floor of its own) on the same file starts at the level
    the file holds, so a restart right after another worker's burst adds no burst."""
    starts: list[float] = []
    other, first = virtual_pacer(tmp_path, starts), virtual_pacer(tmp_path, starts)
    t0 = anyio.current_time()
    await drain(other)  # another worker's burst
    with anyio.move_on_after(20.1):
        await greedy(first, 500)  # the worker runs greedily, then dies mid-queue
    await anyio.sleep(1.0)  # the restart: four tokens back meanwhile
    restarted = virtual_pacer(tmp_path, starts)
    t1 = anyio.current_time()
    await greedy(restarted, 300)

    assert starts.count(t0) == CAPACITY
    assert starts.count(t1) == 4
    assert_window_bound(starts)
    assert max_in_window(starts, 60) == MINUTE_BUDGET
