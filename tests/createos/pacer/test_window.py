"""RequestPacer: no window of T seconds holds more than 40 + 4·T starts (at most 280 in a minute,
20 of CreateOS's 300 left to other clients), however the bursts of several workers, their
restarts and 429s fall (docs/protocol.md 4, checklist 43)."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.windows import max_in_window
from provider.createos.pacer import (
    RequestPacer,
)
from tests.createos.pacer.virtual_time import (
    assert_window_bound,
    run_virtual,
    virtual_pacer,
)


def test_max_in_window_counts_closed_windows() -> None:
    assert max_in_window([], 1) == 0
    assert max_in_window([0, 0, 0, 1, 1.5, 2.6], 1) == 4
    assert max_in_window([0, 0.5, 1.0, 1.5], 1) == 3


Burst = tuple[float, int, bool, float | None, float | None]
"""gap before it, size, wait for it to finish, cancel its waiters after, 429 hold after."""

bursts = st.tuples(
    st.floats(0, 3),
    st.integers(1, 60),  # up to beyond the capacity, so bursts drain the bucket
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
def test_no_window_holds_more_than_40_plus_4t_starts(
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
    minute gets about 280."""
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
    assert max_in_window(starts, 60) >= 275  # the bucket is not stingy either
    gaps = [b - a for a, b in pairwise(starts)]
    assert all(gap >= 0 for gap in gaps)  # granted in clock order
