"""The load run: one real worker, N leases running commands concurrently, rate limit on.

The worker (``python -m provider`` over pipes, its real token-bucket pacing) talks to the
emulator through :class:`RecordingProxy`, a TCP relay that timestamps the first byte of every
HTTP request: the request *starts* as they reach the API. (The emulator's request log stamps a
request when it has been handled, so a slow one would look like a late start; its figure is
reported too.) The emulator runs with its rate limit on (300 requests per minute per client IP);
its log shows whether it ever answered 429.

The pacer grants at most 40 + 4·T starts in any window of T seconds (a bucket of 40 tokens
refilled every 250 ms); the bytes reach the wire a little later than the grant (a busy event
loop), so a window on the wire can look slightly fuller than the grants were.
``max_ahead_of_bound_ms`` measures exactly that: how far the starts on the wire ever ran ahead
of the bucket's bound.

Used by ``bench/load.py`` (20 leases, one minute) and ``test_load.py`` (a short version).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from devtools.call_params import environment_call, lease_ref, with_lease
from devtools.stdio_host import StdioHost, WorkerCallError
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL
from provider.emulator import Emulator

API_KEY = "load-key"
REFILL_S = DEFAULT_INTERVAL  # the pacer's default refill interval
BUCKET = CAPACITY  # and its capacity
HEAD_END = b"\r\n\r\n"


class RecordingProxy:
    """Relays TCP to ``127.0.0.1:upstream_port`` and records request start times."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.starts: list[tuple[float, str]] = []  # (time.monotonic(), request line)
        self.port = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        await listener.serve(self._relay)

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
        async with client, upstream, anyio.create_task_group() as tg:
            tg.start_soon(self._requests, client, upstream, tg.cancel_scope)
            tg.start_soon(_pipe, upstream, client, tg.cancel_scope)

    async def _requests(
        self,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        scope: anyio.CancelScope,
    ) -> None:
        """Forward the client's bytes; note the arrival of each request head (HTTP/1.1 with
        Content-Length bodies, which is all the worker sends)."""
        buffer = b""
        body_left = 0
        started: float | None = None
        try:
            async for chunk in source:
                now = time.monotonic()
                await sink.send(chunk)
                buffer += chunk
                while buffer:
                    if body_left:
                        taken = min(body_left, len(buffer))
                        body_left -= taken
                        buffer = buffer[taken:]
                        continue
                    if started is None:
                        started = now
                    end = buffer.find(HEAD_END)
                    if end < 0:
                        break
                    head, buffer = buffer[:end], buffer[end + len(HEAD_END) :]
                    line = head.split(b"\r\n", 1)[0].decode("latin-1")
                    self.starts.append((started, line))
                    started = None
                    body_left = _content_length(head)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            scope.cancel()


async def _pipe(
    source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, scope: anyio.CancelScope
) -> None:
    try:
        async for chunk in source:
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        scope.cancel()


def _content_length(head: bytes) -> int:
    for raw in head.split(b"\r\n")[1:]:
        name, _, value = raw.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            raise ValueError("the proxy only follows Content-Length bodies")
    return 0


@dataclass
class LoadReport:
    leases: int
    duration_s: float
    commands_started: int = 0
    commands_completed: int = 0
    command_failures: list[str] = field(default_factory=list)
    requests_in_window: int = 0
    request_rate_per_min: float = 0.0
    requests_total: int = 0
    min_start_gap_ms: float = 0.0
    max_ahead_of_bound_ms: float = 0.0
    emulator_log_min_gap_ms: float = 0.0
    emulator_429s: int = 0
    emulator_requests: int = 0
    max_in_60s_window: int = 0
    leaked: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_load(leases: int, duration: float, workdir: Path | None = None) -> LoadReport:
    """Acquire ``leases`` leases, run commands on all of them for ``duration`` seconds (a command
    started in time always runs to its end), destroy them, and report."""
    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        return await _run(leases, duration, Path(folder))


async def _run(leases: int, duration: float, folder: Path) -> LoadReport:
    report = LoadReport(leases, duration)
    env = {
        "XDG_STATE_HOME": str(folder / "state"),
        "PAPERCLIP_CREATEOS_RUNTIME_DIR": str(folder / "runtime"),
    }
    emulator = Emulator(api_keys=[API_KEY], settings={"rate_limit": True})
    async with emulator, anyio.create_task_group() as tg:
        port = int(emulator.base_url.rsplit(":", 1)[1])
        proxy = RecordingProxy(port)
        await tg.start(proxy.serve)
        common = environment_call(f"http://127.0.0.1:{proxy.port}", API_KEY)
        async with StdioHost(env=env, stderr=folder / "worker.log") as host:
            acquired: list[dict[str, Any]] = []

            async def acquire(n: int) -> None:
                acquired.append(
                    await host.call("environmentAcquireLease", {**common, "runId": f"run-{n}"})
                )

            async with anyio.create_task_group() as setup:
                for n in range(leases):
                    setup.start_soon(acquire, n)
            window_start = time.monotonic()
            deadline = window_start + duration
            async with anyio.create_task_group() as work:
                for index, lease in enumerate(acquired):
                    work.start_soon(_lease_loop, host, common, lease, index, deadline, report)
            window_end = time.monotonic()
            async with anyio.create_task_group() as teardown:
                for lease in acquired:
                    teardown.start_soon(
                        host.call, "environmentDestroyLease", lease_ref(common, lease)
                    )
        log = await emulator.admin.requests()
        state = await emulator.admin.state()
        tg.cancel_scope.cancel()
    report.leaked = [s["id"] for s in state["sandboxes"]]
    report.leaked += [p["process_id"] for p in state["processes"] if p["tree_alive"]]
    _measure(report, proxy.starts, log, window_start, window_end)
    return report


async def _lease_loop(
    host: StdioHost,
    common: dict[str, Any],
    lease: dict[str, Any],
    index: int,
    deadline: float,
    report: LoadReport,
) -> None:
    round_ = 0
    while time.monotonic() < deadline:
        round_ += 1
        token = f"lease{index}-cmd{round_}"
        report.commands_started += 1
        try:
            result = await host.call(
                "environmentExecute",
                {
                    **with_lease(common, lease),
                    "command": "bash",
                    "args": ["-c", f"echo {token}; sleep 0.2; echo done >&2"],
                },
            )
        except WorkerCallError as exc:
            report.command_failures.append(f"{token}: {exc}")
            continue
        if result["exitCode"] == 0 and result["stdout"] == f"{token}\n":
            report.commands_completed += 1
        else:
            report.command_failures.append(f"{token}: unexpected result {result!r}")


def ahead_of_bound(times: list[float]) -> float:
    """How far the starts ever ran ahead of the bucket's bound: the largest
    ``(j - i + 1 - BUCKET) * REFILL_S - (t[j] - t[i])`` over ``i <= j`` (0 when never), i.e. how
    much sooner than allowed the (j - i + 1)-th start of a window came."""
    worst = 0.0
    highest = -float("inf")
    for index, when in enumerate(times):
        shifted = when - index * REFILL_S
        highest = max(highest, shifted)
        worst = max(worst, highest - shifted - (BUCKET - 1) * REFILL_S)
    return worst


def _measure(
    report: LoadReport,
    starts: list[tuple[float, str]],
    log: list[dict[str, Any]],
    window_start: float,
    window_end: float,
) -> None:
    times = sorted(t for t, _ in starts)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    report.requests_total = len(times)
    report.min_start_gap_ms = round(min(gaps) * 1000, 1) if gaps else 0.0
    report.max_ahead_of_bound_ms = round(ahead_of_bound(times) * 1000, 1)
    logged = sorted(entry["time"] for entry in log)
    logged_gaps = [b - a for a, b in itertools.pairwise(logged)]
    report.emulator_log_min_gap_ms = round(min(logged_gaps) * 1000, 1) if logged_gaps else 0.0
    in_window = [t for t in times if window_start <= t <= window_end]
    report.requests_in_window = len(in_window)
    span = window_end - window_start
    report.request_rate_per_min = round(len(in_window) / span * 60, 1) if span > 0 else 0.0
    report.max_in_60s_window = max(
        (sum(1 for u in times if t <= u < t + 60) for t in times), default=0
    )
    report.emulator_requests = len(log)
    report.emulator_429s = sum(1 for entry in log if entry["status"] == 429)
