"""The reaper: bounds what kept (reused) sandboxes cost (docs/protocol.md 2.13).

The host resumes a released lease only for the same execution workspace, so with ``reuseLease``
every kept sandbox of a finished workspace would stay paused, and billed, forever. After a
successful acquire of a reusable lease and after a release that kept its sandbox, the reaper
sweeps that environment: it lists the paused sandboxes (all pages), keeps to this environment's
own (named ``pc-<scope tag>-<uuid>``, :mod:`provider.driver.leases.reuse`, or a reusable lease
forked from a template, which takes no name and is known from the journal's ``kept_forks``) and
deletes those idle longer than ``reuseMaxIdleSeconds``, then the oldest beyond
``reuseMaxKeptSandboxes``.

- **Off the critical path**: the sweep runs in
:class:`~provider.driver.core.background.BackgroundTasks`;
  the call that triggered it has already answered. Shutdown cancels it.
- **At most once a minute per environment** (scope tag and key); the first event sweeps at once,
  later events inside the interval are skipped (the next one after it sweeps).
- **Never fails anything**: each delete runs the confirmed delete routine under its own deadline;
  a failed list or delete is logged (sanitized messages only, never the key) and the sweep goes on.
- **A refused filter never stops it**: the list asks for ``status=paused``, which CreateOS
  does not document (the TypeScript SDK's types allow only running, creating, destroyed and
  failed). When the server refuses it (400 or 422), the sweep lists without the filter and keeps
  the paused sandboxes itself, for the rest of the process's life with that API, and says so
  once per API in the log.
- **Never a lease in use**: the lease that triggered the sweep is spared, and so is any lease
  resumed on this worker while the sweep runs (:meth:`Reaper.in_use`): a sweep that listed it
  paused just before the resume turned it ``running`` must not delete it afterwards.

``wall_clock`` (sandbox ages) and ``monotonic`` (the once-a-minute rule) are injectable, and
:meth:`Reaper.sweep` can be awaited directly, so tests run without sleeps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Final

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIStatusError
from provider.createos.models import SandboxView
from provider.driver.commands.sandbox_ops import delete_sandbox_confirmed
from provider.driver.core.runtime import BoundCall, DriverRuntime, deadline
from provider.driver.leases.reuse import ReapChoice, select_for_reaping
from provider.errors import ProviderError

Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]

SWEEP_INTERVAL: Final = 60.0
LIST_DEADLINE_CAP: Final = 60.0
DELETE_DEADLINE_CAP: Final = 60.0


class Reaper:
    def __init__(
        self,
        runtime: DriverRuntime,
        log: Log,
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        interval: float = SWEEP_INTERVAL,
    ) -> None:
        self.runtime = runtime
        self.log = log
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.interval = interval
        self._last_sweep: dict[tuple[str, str], float] = {}
        self._spared: list[set[str]] = []  # one set per running sweep
        self._busy: Counter[str] = Counter()  # leases with a resume in flight
        self._unfiltered: set[str] = set()  # APIs that refused the status filter

    # -- triggers (never wait) ---------------------------------------------------------------

    def after_acquire(self, call: BoundCall, lease_id: str) -> None:
        """A reusable lease was acquired."""
        self._schedule(call, lease_id, current_kept=False)

    def after_keep(self, call: BoundCall, lease_id: str) -> None:
        """A release kept (paused) its sandbox; it counts toward the cap."""
        self._schedule(call, lease_id, current_kept=True)

    @contextmanager
    def in_use(self, lease_id: str | None) -> Iterator[None]:
        """Around a resume: no sweep that overlaps it in any way deletes the lease."""
        if not lease_id:
            yield
            return
        self._spare(lease_id)
        self._busy[lease_id] += 1
        try:
            yield
        finally:
            self._busy[lease_id] -= 1
            if not self._busy[lease_id]:
                del self._busy[lease_id]
            self._spare(lease_id)  # sweeps that started (and listed) during the resume

    def _spare(self, lease_id: str) -> None:
        for spared in self._spared:
            spared.add(lease_id)

    def _schedule(self, call: BoundCall, lease_id: str, *, current_kept: bool) -> None:
        if not call.config.reuse_lease:
            return
        key = (call.scope_tag, call.scope("").key_hash)
        now = self.monotonic()
        last = self._last_sweep.get(key)
        if last is not None and now - last < self.interval:
            return
        job = partial(self._sweep_logged, call, lease_id, current_kept)
        if self.runtime.background.start_soon(job):
            self._last_sweep[key] = now

    # -- the sweep ---------------------------------------------------------------------------

    async def _sweep_logged(self, call: BoundCall, current: str, current_kept: bool) -> None:
        try:
            await self.sweep(call, current, current_kept=current_kept)
        except Exception as exc:  # a bug must not pass silently, nor fail anything
            await self.log(
                "warn", f"The sweep of kept CreateOS sandboxes failed ({type(exc).__name__}).", None
            )

    async def sweep(self, call: BoundCall, current: str, *, current_kept: bool) -> list[str]:
        """One sweep of the call's environment; answers the ids it deleted."""
        spared = {current}
        self._spared.append(spared)
        deleted: list[str] = []
        try:
            async with self.runtime.client_factory(call.config, call.api_key) as client:
                try:
                    with deadline(min(call.timeout, LIST_DEADLINE_CAP), "Listing sandboxes"):
                        views = await self._list_paused(client, call.config.api_url)
                except ProviderError as exc:
                    await self._warn(f"Could not list the kept CreateOS sandboxes: {exc}")
                    return deleted
                config, tag = call.config, call.scope_tag
                forks = await anyio.to_thread.run_sync(self.runtime.journal.kept_forks, tag)
                choices = select_for_reaping(
                    views,
                    tag=tag,
                    now=self.wall_clock(),
                    max_idle_seconds=config.reuse_max_idle_seconds,
                    max_kept=config.reuse_max_kept_sandboxes,
                    current=current,
                    current_kept=current_kept,
                    forks=forks,
                )
                for choice in choices:
                    if choice.sandbox_id in spared or choice.sandbox_id in self._busy:
                        continue
                    if await self._delete(client, call, choice):
                        deleted.append(choice.sandbox_id)
        finally:
            self._spared.remove(spared)
        return deleted

    async def _list_paused(self, client: CreateOSClient, api_url: str) -> list[SandboxView]:
        """The paused sandboxes of the key: by the server's ``status`` filter, or, once that
        API has refused it, every sandbox filtered here."""
        if api_url not in self._unfiltered:
            try:
                return await client.list_sandboxes(status="paused")
            except APIStatusError as exc:
                if exc.status not in (400, 422):
                    raise
            self._unfiltered.add(api_url)
            await self.log(
                "info",
                "CreateOS refused the status=paused filter of the sandbox list; the reaper now "
                "lists every sandbox of the key and keeps the paused ones itself.",
                None,
            )
        return [view for view in await client.list_sandboxes() if view.status == "paused"]

    async def _delete(self, client: CreateOSClient, call: BoundCall, choice: ReapChoice) -> bool:
        sandbox_id = choice.sandbox_id
        try:
            with deadline(min(call.timeout, DELETE_DEADLINE_CAP), "Deleting the sandbox"):
                await delete_sandbox_confirmed(client, sandbox_id)
        except ProviderError as exc:
            await self._warn(
                f"Could not delete kept sandbox {sandbox_id} ({choice.reason}): {exc}. The next "
                "sweep tries again."
            )
            return False
        await anyio.to_thread.run_sync(self.runtime.journal.remove_kept_fork, sandbox_id)
        await self.log(
            "info",
            f"Deleted kept CreateOS sandbox {sandbox_id} of this environment ({choice.reason}).",
            None,
        )
        return True

    async def _warn(self, message: str) -> None:
        await self.log("warn", message, None)
