"""BackgroundTasks: jobs outlive the call that submitted them, and shutdown cancels them."""

from __future__ import annotations

from contextvars import ContextVar

import anyio
import pytest

from provider.driver.core.background import BackgroundTasks

pytestmark = pytest.mark.anyio

CALL_ID: ContextVar[str | None] = ContextVar("call_id", default=None)


async def test_jobs_run_beside_the_caller_and_can_be_awaited() -> None:
    tasks = BackgroundTasks()
    gate = anyio.Event()
    done: list[str] = []

    async def job() -> None:
        await gate.wait()
        done.append("job")

    async with tasks.running():
        assert tasks.start_soon(job)  # returns at once, the job waits for the gate
        assert tasks.active == 1 and done == []
        gate.set()
        await tasks.wait_idle()
        assert tasks.active == 0 and done == ["job"]


async def test_a_job_outlives_the_scope_that_submitted_it() -> None:
    tasks = BackgroundTasks()
    done: list[str] = []

    async def job() -> None:
        await anyio.sleep(0.05)
        done.append("job")

    async with tasks.running():
        with anyio.CancelScope() as call:  # the request's own scope ends first
            tasks.start_soon(job)
            call.cancel()
        await tasks.wait_idle()
    assert done == ["job"]


async def test_jobs_do_not_inherit_the_submitting_calls_context() -> None:
    tasks = BackgroundTasks()
    seen: list[str | None] = []

    async def job() -> None:
        seen.append(CALL_ID.get())

    async with tasks.running():
        token = CALL_ID.set("invocation-1")
        try:
            tasks.start_soon(job)
        finally:
            CALL_ID.reset(token)
        await tasks.wait_idle()
    assert seen == [None]


async def test_a_failing_job_never_takes_the_worker_down() -> None:
    tasks = BackgroundTasks()
    done: list[str] = []

    async def broken() -> None:
        raise RuntimeError("bug")

    async def fine() -> None:
        done.append("fine")

    async with tasks.running():
        tasks.start_soon(broken)
        await tasks.wait_idle()
        tasks.start_soon(fine)
        await tasks.wait_idle()
    assert done == ["fine"]


async def test_cancel_stops_running_jobs_and_refuses_new_ones() -> None:
    tasks = BackgroundTasks()
    cancelled: list[bool] = []

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    async with tasks.running():
        tasks.start_soon(forever)
        tasks.start_soon(forever)
        await anyio.wait_all_tasks_blocked()
        tasks.cancel()
        with anyio.fail_after(2):
            await tasks.wait_idle()
        assert not tasks.start_soon(forever)
    assert cancelled == [True, True]


async def test_nothing_runs_when_not_running_and_leaving_cancels_the_rest() -> None:
    tasks = BackgroundTasks()

    async def forever() -> None:
        await anyio.sleep_forever()

    assert not tasks.start_soon(forever)
    with anyio.fail_after(2):
        async with tasks.running():
            tasks.start_soon(forever)
    assert tasks.active == 0
    assert not tasks.start_soon(forever)
