"""Running one fault-matrix cell against the emulator and classifying what happened.

:func:`run_cell` sets the scenario up, injects the fault through the emulator's admin API, makes
the host call, waits out any delayed request, then classifies the outcome *from observations*:

- ``poisoned``: the call raised CleanupUnconfirmed (a release mid-command: the command did, and
  the release refused to keep the lease), and then execute, sync and a reuse release are refused
  with zero HTTP requests while destroy still deletes and clears the mark;
- ``expired``: resume answered exactly "gone" and the sandbox was not deleted;
- ``retried`` / ``ok``: the call gave its fault-free result, with one more matching request
  than the fault-free run (``ok``: exactly as many); a 429 retry waited for ``Retry-After``;
- ``surfaced``: the call failed with an ordinary error (probe: ``ok: false``), a ``POST`` was
  repeated only after a 429 or 503, and the same call then worked without the fault (lease
  intact); a refused exec stream was followed by no kill;
- ``lost``: the call failed with CommandLost after exactly one kill exec (two when a 429 or 503
  to it was retried), the exec stream was not repeated, and the lease still serves the call.

A scenario that counts its command's runs (a line appended to a file in the sandbox) must show
exactly one run for ``ok`` and ``retried``, none for ``surfaced``, at most one otherwise: a command
that may have run is never run again (3.9 (c)).

Anything else is reported as a descriptive mismatch. Afterwards the scenario destroys its lease
and the emulator's state view must show no live sandbox, no live process tree, no orphan pid.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.driver.commands.streamed import CommandLost
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService
from provider.emulator import Emulator
from provider.errors import RequestRefused
from tests.driver.conftest import Harness
from tests.reliability.fault_cells import KILL_EXEC, Cell, Site
from tests.reliability.fault_scenarios import SCENARIOS, Scenario
from tests.waiting import wait_until

API_KEY = "test-key"
EMULATOR_SETTINGS = {"heartbeat_ms": 200}
REFUSALS = (429, 503)
LEAK_SETTLE = 5.0


class TimeoutPlan:
    """Which requests get a short read timeout (those a ``timeout`` fault delays)."""

    def __init__(self) -> None:
        self.target: tuple[str, str, str | None] | None = None  # method, path regex, query
        self.read = 0.0
        self.sent: list[tuple[float, str, str, str]] = []  # attempts: (time, method, path, query)

    def set(self, method: str, path_regex: str, read: float, query: str | None = None) -> None:
        self.target, self.read = (method, path_regex, query), read

    def clear(self) -> None:
        self.target = None

    def applies(self, request: httpx.Request) -> bool:
        url = request.url
        return self.target is not None and matches(
            *self.target, request.method, url.path, url.query.decode()
        )


def matches(
    method: str, path_regex: str, query: str | None, r_method: str, r_path: str, r_query: str
) -> bool:
    """Whether a request (``r_*``) has ``method``, a path ``path_regex`` finds, and ``query``
    as its query string (None: any)."""
    return (
        r_method == method
        and re.search(path_regex, r_path) is not None
        and (query is None or r_query == query)
    )


def site_matches(site: Site, method: str, path: str, query: str) -> bool:
    """Whether a request (method, path, query string) is one of ``site``'s."""
    return matches(site.method, site.path_regex, site.query, method, path, query)


class PlannedTimeouts(httpx.AsyncBaseTransport):
    """An httpx transport that shrinks the read timeout of the planned requests."""

    def __init__(self, plan: TimeoutPlan) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._plan = plan

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        self._plan.sent.append((time.time(), request.method, url.path, url.query.decode()))
        if self._plan.applies(request):
            timeouts = dict(request.extensions.get("timeout", {}))
            timeouts["read"] = self._plan.read
            request.extensions["timeout"] = timeouts
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def matrix_harness(emulator: Emulator, state_dir: Path) -> AsyncIterator[MatrixHarness]:
    """The driver wired to ``emulator`` with unpaced clients and a fresh journal."""
    plan = TimeoutPlan()

    def client_factory(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        pacer = RequestPacer(config.api_url, interval=0.0, shared_dir=None)
        return CreateOSClient(
            config.api_url,
            api_key,
            pacer=pacer,
            backoff_base=0.01,
            transport=PlannedTimeouts(plan),
        )

    journal = LeaseJournal(state_dir / "leases.sqlite3")
    runtime = DriverRuntime(client_factory=client_factory, environ={}, journal=journal)

    notifications: list[tuple[str, dict[str, Any]]] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        notifications.append((method, params))

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        return None

    await emulator.admin.settings(**EMULATOR_SETTINGS)
    methods = DriverService(runtime, notify=notify, log=log)
    yield MatrixHarness(emulator, methods, notifications, plan=plan, journal=journal)


@dataclass
class MatrixHarness(Harness):
    plan: TimeoutPlan = field(default_factory=TimeoutPlan)
    journal: LeaseJournal | None = None

    async def last_seq(self) -> int:
        log = await self.emulator.admin.requests()
        return max((entry["seq"] for entry in log), default=0)


@dataclass
class CellResult:
    cell: Cell
    observed: str
    leaks: list[str]
    detail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.observed == self.cell.expected and not self.leaks


async def run_cell(h: MatrixHarness, cell: Cell, workdir: Path) -> CellResult:
    started = time.monotonic()
    site, fault = cell.site, cell.fault
    scenario = SCENARIOS[site.scenario](h, workdir)
    await scenario.setup()
    seq0 = await h.last_seq()
    if fault.name != "none":
        if fault.read_timeout is not None:
            h.plan.set(site.method, site.path_regex, fault.read_timeout, site.query)
        await h.emulator.admin.add_fault(
            site.method, site.path_regex, times=fault.times, **fault.action
        )
    sent_before = len(h.plan.sent)
    value: Any = None
    error: Exception | None = None
    try:
        value = await scenario.call()
    except Exception as exc:
        error = exc
    delay = fault.action.get("delay_ms", 0) / 1000
    delayed = [
        when
        for when, method, path, query in h.plan.sent[sent_before:]
        if site_matches(site, method, path, query)
    ]
    if delay and delayed:  # let the held requests land before counting requests or leaks

        async def landed() -> bool:
            rows = await h.emulator.admin.requests(since=seq0)
            served = [r for r in rows if site_matches(site, r["method"], r["path"], r["query"])]
            return len(served) >= len(delayed)

        await wait_until(landed, timeout=delay + 20)
    await h.emulator.admin.clear_faults()
    h.plan.clear()
    seq1 = await h.last_seq()
    observed, detail = await classify(h, cell, scenario, value, error, seq0, seq1)
    try:
        await scenario.cleanup()
    except Exception as exc:
        detail += f"; cleanup failed: {exc}"
    leaks = await find_leaks(h)
    return CellResult(cell, observed, leaks, detail, time.monotonic() - started)


async def matching(h: MatrixHarness, site: Site, seq0: int, seq1: int) -> list[dict[str, Any]]:
    return [
        e
        for e in await h.emulator.admin.requests(since=seq0)
        if e["seq"] <= seq1 and site_matches(site, e["method"], e["path"], e["query"])
    ]


async def classify(
    h: MatrixHarness,
    cell: Cell,
    scenario: Scenario,
    value: Any,
    error: Exception | None,
    seq0: int,
    seq1: int,
) -> tuple[str, str]:
    site, fault = cell.site, cell.fault
    hits = await matching(h, site, seq0, seq1)
    execs = await matching(h, KILL_EXEC, seq0, seq1)
    kills = sum(e["status"] not in REFUSALS for e in execs)  # buffered execs, retries not counted
    count, normal = len(hits), site.normal_count
    runs = await scenario.runs()
    detail = f"{count} matching request(s), {kills} kill exec(s), {runs} run(s)" + (
        f"; error: {error}" if error else ""
    )
    if error is not None and API_KEY in str(error):
        return "key-in-error", detail
    if runs is not None and runs > 1:
        return f"the command ran {runs} times", detail
    if scenario.unconfirmed(error) and scenario.lease is not None:
        problem = await poisoned_problem(h, scenario)
        return ("poisoned", detail) if problem is None else (f"poisoned, but {problem}", detail)
    if error is None and scenario.gone(value):
        live = {s["id"] for s in (await h.emulator.admin.state())["sandboxes"]}
        assert scenario.lease is not None
        if scenario.lease["providerLeaseId"] not in live:
            return "expired, but the sandbox was deleted", detail
        return "expired", detail
    if isinstance(error, CommandLost):
        return await classify_lost(cell, scenario, hits, kills), detail
    if scenario.succeeded(value, error):
        if runs is not None and runs != 1:
            return f"succeeded, but the command ran {runs} times", detail
        if site.kind == "exec-stream" and kills:
            return f"succeeded, but with {kills} kill exec(s)", detail
        if fault.name == "none":
            return ("ok", detail) if count == normal else (f"ok with {count} requests", detail)
        if count < normal + 1:
            return "succeeded without a retry", detail
        return late_429_retry(cell, hits) or "retried", detail
    if isinstance(error, RequestRefused):
        return "refused", detail
    if site.method == "POST" and any(hit["status"] not in REFUSALS for hit in hits[:-1]):
        return "surfaced, but the POST was repeated", detail
    if site.kind == "exec-stream" and (kills != site.cleanup_execs or runs):
        return f"surfaced, but after {kills} kill(s) and {runs} run(s)", detail
    if not await scenario.intact():
        return "surfaced, lease broken", detail
    return "surfaced", detail


async def classify_lost(
    cell: Cell, scenario: Scenario, hits: list[dict[str, Any]], kills: int
) -> str:
    """A CommandLost: one kill exec (two when the first was refused), the exec stream not
    repeated, the lease still serving the call."""
    site = cell.site
    if site.kind == "kill-exec":
        late = late_429_retry(cell, hits)
        if late is not None:
            return late
        want, got = 1 + (cell.fault.name in ("429", "503")), len(hits)
    elif len(hits) != site.normal_count:
        return f"lost, but the exec stream was sent {len(hits)} times"
    else:
        want, got = 1 + site.cleanup_execs, kills
    if got != want:
        return f"lost, after {got} kill exec(s) instead of {want}"
    if not await scenario.intact():
        return "lost, lease broken"
    return "lost"


def late_429_retry(cell: Cell, hits: list[dict[str, Any]]) -> str | None:
    """A mismatch when a request answered 429 was repeated before its ``Retry-After``."""
    if cell.fault.name != "429" or len(hits) < 2:
        return None
    gap = hits[1]["time"] - hits[0]["time"]
    if hits[0]["status"] != 429 or gap < 0.9:
        return f"retried after {gap:.2f} s, before Retry-After"
    return None


async def poisoned_problem(h: MatrixHarness, scenario: Scenario) -> str | None:
    """None when the lease behaves as poisoned (3.4); else what is wrong."""
    lease = scenario.lease
    assert lease is not None
    before = await h.request_count()
    attempts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("execute", lambda: h.methods.execute({**scenario.with_lease(), "command": "true"})),
        ("syncIn", lambda: h.methods.sync_in({**scenario.with_lease(), "operations": []})),
    ]
    if lease["metadata"].get("reuseLease") is True:  # a disposable lease is deleted, not kept
        attempts.append(
            ("reuse release", lambda: h.methods.release(h.lease_ref(lease, reuseLease=True)))
        )
    for what, attempt in attempts:
        try:
            await attempt()
        except RequestRefused:
            continue
        except Exception as exc:
            return f"{what} failed with {type(exc).__name__} instead of a refusal"
        return f"{what} was not refused"
    if await h.request_count() != before:
        return "a refused call made HTTP requests"
    receipt = await h.methods.destroy(scenario.ref())
    scenario.lease = None
    if receipt is None or receipt["state"] != "destroyed":
        return "destroy did not delete"
    if h.methods.runtime.tracker.unconfirmed_scopes():
        return "destroy did not clear the poison mark"
    return None


async def find_leaks(h: Harness, *, settle: float = LEAK_SETTLE) -> list[str]:
    """Live sandboxes, live process trees and orphan host pids in the emulator's state view.

    A process killed a moment ago may take a few milliseconds to leave ``/proc``: only what is
    still there after ``settle`` seconds counts.
    """
    deadline = time.monotonic() + settle
    while True:
        state = await h.emulator.admin.state()
        leaks = [f"sandbox {s['id']} ({s['status']})" for s in state["sandboxes"]]
        leaks += [f"process {p['process_id']}" for p in state["processes"] if p["tree_alive"]]
        leaks += [f"orphan host pid {pid} ({_cmdline(pid)})" for pid in state["orphan_host_pids"]]
        if not leaks or time.monotonic() > deadline:
            return leaks
        await anyio.sleep(0.1)


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "gone"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80]
