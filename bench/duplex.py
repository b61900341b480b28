"""Duplex channel throughput and round-trip latency, against the execute relay in the same run.

The real worker (``python -m provider`` under the Python stdio host,
devtools/stdio_host.py, which hands it the host's scrubbed environment and passes this
script every ``duplexChannel.*`` notification) against the emulator in its own process, one
lease, **default pacing** (token bucket of 10, one request per 250 ms: what the worker does
unless told otherwise; ``--pace-ms 0`` turns it off, as bench/connections.py does). Modes,
interleaved round by round (the order reversed every other round):

- ``channel``: ``duplexChannelOpen`` of ``cat``, then N MiB (default 32) of random bytes as
  sequential ``duplexChannelWrite`` calls of 256 KiB (base64 on the wire; the host's own cap per
  write is 262,144 raw bytes, and its 393,216 pending write bytes allow one such write in
  flight), until every echoed byte is back in ``duplexChannel.data`` (byte-exact check). The
  open and the close are outside the timed window (a channel is opened once and streams).
- ``execute-256k``: the same number of bytes through ``environmentExecute`` of ``cat``: stdin in
  the result's stdout, 256 KiB per call, calls one after another. Each call is a whole command
  (create, connect, stdin as the start gate: 3 requests), all inside the timed window.
- ``execute-4m``: the same with 4 MiB per call (stdin over 256 KiB is staged with a PUT: 4
  requests), the most whose echo still comes back whole in the answer (its 4 Mi-character tail).

Why these baselines: the channel is a byte pipe through a sandbox process, so the fair execute
path is also a round trip through ``cat`` (host -> worker -> ``/input`` or a staged file ->
process -> ``connect`` -> worker -> host), not output alone (``head -c N /dev/urandom`` would
only measure the relay direction that both share). Execute's stdin and stdout are text (UTF-8,
invalid bytes replaced), so it cannot carry random bytes exactly: its payload is the same number
of bytes of ASCII (base64 of random bytes), also checked exactly. ``execute-256k`` moves the
same 256 KiB per host call as the channel's writes (what a bridge without channels pays per
message: a command each) and is the primary ratio; ``execute-4m`` is execute's best bulk case.

Latency: p50 of 20 one-line echoes (``ping-NN\\n``) through the channel's ``cat`` (write sent
-> echo received), against a one-line ``environmentExecute`` of ``cat``. Under pacing, each
echo waits ``requests x interval`` after the previous one (channel 1 request, execute 3), so each
finds the tokens it needs and the figure is the path's own latency, not the bucket's.

Before every timed run the script sleeps until the bucket is full again (10 x interval). Also
printed: the worker's CPU time per run (utime+stime), the emulator's and its sandbox processes',
the API requests of each run (emulator request log), and the worker's peak RSS (VmHWM).

    .venv/bin/python bench/duplex.py [--mib 32] [--rounds 2] [--echoes 20] [--pace-ms 250]
        [--modes channel,execute-256k,execute-4m] [--no-save]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
from _common import (
    MIB,
    PYTHON,
    cpu_seconds,
    descendants_cpu_seconds,
    emulator_process,
    environment_call,
    peak_rss_mib,
    save_result,
)

from devtools.call_params import lease_ref, route_params, with_lease
from devtools.emulator_process import EmulatorProcess
from devtools.stdio_host import LogCallback, StdioHost
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL, ENV_INTERVAL_MS

KIB = 1024
WRITE_BYTES = 256 * KIB  # one duplexChannelWrite (= one /input request)
EXECUTE_CHUNKS = {"execute-256k": 256 * KIB, "execute-4m": 4 * MIB}
MODES = ("channel", *EXECUTE_CHUNKS)
REQUESTS_PER_ECHO = {"channel": 1, "execute": 3}
WAIT_S = 600.0


# --- the host side of the channels ---------------------------------------------------------


@dataclass
class Channel:
    """What this script received for one ``hostRouteId``."""

    parts: list[bytes] = field(default_factory=list)
    received: int = 0
    chunks: int = 0
    max_chunk: int = 0
    target: int = 0
    reached: anyio.Event = field(default_factory=anyio.Event)
    exit: dict[str, Any] | None = None
    exited: anyio.Event = field(default_factory=anyio.Event)
    stamp: float = 0.0  # when ``target`` was reached

    def expect(self, more: int) -> anyio.Event:
        """An event set once ``more`` bytes beyond those received so far have arrived."""
        self.target = self.received + more
        self.reached = anyio.Event()
        return self.reached

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.received += len(data)
        self.chunks += 1
        self.max_chunk = max(self.max_chunk, len(data))
        if self.received >= self.target and not self.reached.is_set():
            self.stamp = time.perf_counter()
            self.reached.set()

    def data(self) -> bytes:
        return b"".join(self.parts)


class Routes:
    """The ``on_notification`` hook: ``duplexChannel.*`` by ``hostRouteId``."""

    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}
        self.unknown: list[str] = []

    def open(self, route: str) -> Channel:
        channel = self.channels[route] = Channel()
        return channel

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        channel = self.channels.get(str(params.get("hostRouteId")))
        if channel is None:
            self.unknown.append(method)
        elif method == "duplexChannel.data":
            channel.add(base64.b64decode(params["chunk"], validate=True))
        elif method == "duplexChannel.exit":
            channel.exit = params
            channel.exited.set()


# --- runs ----------------------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    size: int
    seconds: float = 0.0
    calls: int = 0
    requests: int = 0  # API requests the emulator logged during the timed window
    chunks: int = 0  # channel: data notifications; execute: execute.log chunks
    max_chunk: int = 0
    worker_cpu_s: float = 0.0
    emulator_cpu_s: float = 0.0
    sandbox_cpu_s: float = 0.0
    open_s: float | None = None  # channel only, outside the window

    @property
    def mib_s(self) -> float:
        return self.size / MIB / self.seconds if self.seconds else 0.0


@dataclass
class Bench:
    host: StdioHost
    emu: EmulatorProcess
    routes: Routes
    common: dict[str, Any]
    lease: dict[str, Any]
    interval: float
    routes_opened: int = 0

    async def refill(self) -> None:
        """Sleep until the worker's bucket is full again (no timed run starts on a debt)."""
        await anyio.sleep(CAPACITY * self.interval + 0.05)

    async def last_seq(self) -> int:
        log = await self.emu.admin.requests()
        return int(log[-1]["seq"]) if log else 0

    async def requests_since(self, seq: int) -> int:
        return len(await self.emu.admin.requests(since=seq))

    async def open_channel(self, command: list[str]) -> tuple[str, str, Channel]:
        self.routes_opened += 1
        route = f"duplex-route-{self.routes_opened}"
        channel = self.routes.open(route)
        answer = await self.host.call(
            "duplexChannelOpen",
            route_params(self.common, self.lease, route, command=command),
        )
        if answer.get("hostRouteId") != route:
            raise RuntimeError(f"duplexChannelOpen answered {answer!r}")
        return route, str(answer["workerSessionId"]), channel

    async def close_channel(self, route: str, session: str, channel: Channel) -> None:
        answer = await self.host.call("duplexChannelClose", {"hostRouteId": route})
        if answer != {"hostRouteId": route, "workerSessionId": session}:
            raise RuntimeError(f"duplexChannelClose answered {answer!r}")
        with anyio.fail_after(30):
            await channel.exited.wait()

    async def write(self, route: str, session: str, data: bytes) -> None:
        await self.host.call(
            "duplexChannelWrite",
            {
                "hostRouteId": route,
                "workerSessionId": session,
                "data": base64.b64encode(data).decode("ascii"),
            },
        )

    async def execute(self, stdin: str, on_log: LogCallback | None = None) -> dict[str, Any]:
        """One ``cat`` with ``stdin``, which must exit 0."""
        params = {**with_lease(self.common, self.lease), "command": "cat", "args": []}
        result: dict[str, Any] = await self.host.call(
            "environmentExecute", {**params, "stdin": stdin}, on_log=on_log
        )
        if result["exitCode"] != 0:
            raise RuntimeError(f"cat failed: {result['exitCode']!r} {result['stderr'][-500:]!r}")
        return result

    # -- throughput ---------------------------------------------------------------------------

    async def run(self, mode: str, size: int) -> Run:
        run = Run(mode, size)
        pid = self.host.pid
        assert self.emu.pid is not None
        if mode == "channel":
            started = time.perf_counter()
            route, session, channel = await self.open_channel(["cat"])
            run.open_s = time.perf_counter() - started
            payload = os.urandom(size)
        else:
            payload = base64.b64encode(os.urandom(size * 3 // 4 + 3))[:size]
        await self.refill()
        seq = await self.last_seq()
        before = (
            cpu_seconds(pid),
            cpu_seconds(self.emu.pid),
            descendants_cpu_seconds(self.emu.pid),
        )
        started = time.perf_counter()
        if mode == "channel":
            done = channel.expect(size)
            for start in range(0, size, WRITE_BYTES):
                await self.write(route, session, payload[start : start + WRITE_BYTES])
                run.calls += 1
            with anyio.fail_after(WAIT_S):
                await done.wait()
            finished = channel.stamp
        else:
            text = payload.decode("ascii")
            step = EXECUTE_CHUNKS[mode]
            live: list[int] = []
            for start in range(0, size, step):
                chunk = text[start : start + step]
                result = await self.execute(chunk, on_log=lambda _s, c: live.append(len(c)))
                run.calls += 1
                if result["stdout"] != chunk:
                    raise RuntimeError(f"{mode}: call {run.calls} echoed other bytes")
            finished = time.perf_counter()
            if sum(live) != size:
                raise RuntimeError(f"{mode}: {sum(live)} live characters for {size}")
            run.chunks, run.max_chunk = len(live), max(live)
        run.seconds = finished - started
        run.worker_cpu_s = cpu_seconds(pid) - before[0]
        run.emulator_cpu_s = cpu_seconds(self.emu.pid) - before[1]
        run.sandbox_cpu_s = descendants_cpu_seconds(self.emu.pid) - before[2]
        run.requests = await self.requests_since(seq)
        if mode == "channel":
            if channel.data() != payload:
                raise RuntimeError("channel: the echoed bytes differ from those written")
            run.chunks, run.max_chunk = channel.chunks, channel.max_chunk
            await self.close_channel(route, session, channel)
        return run

    # -- latency ------------------------------------------------------------------------------

    async def channel_echoes(self, count: int) -> list[float]:
        route, session, channel = await self.open_channel(["cat"])
        await self.refill()
        times: list[float] = []
        for index in range(count):
            line = f"ping-{index:02}\n".encode()
            done = channel.expect(len(line))
            started = time.perf_counter()
            await self.write(route, session, line)
            with anyio.fail_after(60):
                await done.wait()
            times.append((channel.stamp - started) * 1000)
            if not channel.data().endswith(line):
                raise RuntimeError(f"channel echo {index} came back as {channel.data()[-20:]!r}")
            await anyio.sleep(REQUESTS_PER_ECHO["channel"] * self.interval)
        await self.close_channel(route, session, channel)
        return times

    async def execute_echoes(self, count: int) -> list[float]:
        await self.refill()
        times: list[float] = []
        for index in range(count):
            line = f"ping-{index:02}\n"
            started = time.perf_counter()
            result = await self.execute(line)
            times.append((time.perf_counter() - started) * 1000)
            if result["stdout"] != line:
                raise RuntimeError(f"execute echo {index} came back as {result['stdout']!r}")
            await anyio.sleep(REQUESTS_PER_ECHO["execute"] * self.interval)
        return times


# --- orchestration -------------------------------------------------------------------------


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)], 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
    }


def summarize(runs: list[Run], mode: str) -> dict[str, Any]:
    mine = [r for r in runs if r.mode == mode]
    if not mine:
        return {}
    out: dict[str, Any] = {
        "mib_s": round(statistics.median(r.mib_s for r in mine), 2),
        "best_mib_s": round(max(r.mib_s for r in mine), 2),
        "seconds": round(statistics.median(r.seconds for r in mine), 2),
        "calls": mine[-1].calls,
        "requests": mine[-1].requests,
        "worker_cpu_s": round(statistics.median(r.worker_cpu_s for r in mine), 2),
    }
    opens = [r.open_s for r in mine if r.open_s is not None]
    if opens:
        out["open_s"] = round(statistics.median(opens), 2)
    return out


async def measure(
    size: int, rounds: int, modes: list[str], echoes: int, interval: float, env: dict[str, str]
) -> dict[str, Any]:
    runs: list[Run] = []
    routes = Routes()
    async with (
        emulator_process() as emu,
        StdioHost(python=PYTHON, env=env, stderr="inherit", on_notification=routes) as host,
    ):
        common = environment_call(emu.base_url)
        lease = await host.call("environmentAcquireLease", {**common, "runId": "bench-duplex"})
        bench = Bench(host, emu, routes, common, lease, interval)
        try:
            for index in range(rounds):
                for mode in modes if index % 2 == 0 else modes[::-1]:
                    run = await bench.run(mode, size)
                    runs.append(run)
                    _print_run(run)
            latency = {
                "channel": await bench.channel_echoes(echoes),
                "execute": await bench.execute_echoes(echoes),
            }
            peak_rss = peak_rss_mib(host.pid)
        finally:
            await host.call("environmentReleaseLease", lease_ref(common, lease))
    if routes.unknown:
        raise RuntimeError(f"notifications for routes this script never opened: {routes.unknown}")
    result: dict[str, Any] = {
        "payload_mib": size / MIB,
        "rounds": rounds,
        "pace_interval_ms": round(interval * 1000, 1),
        "write_bytes": WRITE_BYTES,
        "modes": {mode: summarize(runs, mode) for mode in modes},
        "latency": {name: _latency(values) for name, values in latency.items()},
        "latency_samples_ms": {k: [round(v, 2) for v in vs] for k, vs in latency.items()},
        "worker_peak_rss_mib": round(peak_rss, 1),
        "runs": [asdict(r) | {"mib_s": round(r.mib_s, 3)} for r in runs],
    }
    ratios: dict[str, float] = {}
    channel = result["modes"].get("channel")
    for mode in EXECUTE_CHUNKS:
        baseline = result["modes"].get(mode)
        if channel and baseline:
            ratios[f"channel/{mode}"] = round(channel["mib_s"] / baseline["mib_s"], 3)
    ratios["latency p50 channel/execute"] = round(
        result["latency"]["channel"]["p50_ms"] / result["latency"]["execute"]["p50_ms"], 3
    )
    result["ratios"] = ratios
    return result


def _print_run(run: Run) -> None:
    opened = f", open {run.open_s:.2f} s (untimed)" if run.open_s is not None else ""
    print(
        f"  {run.mode:12} {run.mib_s:7.2f} MiB/s, {run.seconds:6.2f} s, {run.calls} calls, "
        f"{run.requests} API requests, {run.chunks} chunks (max {run.max_chunk}), "
        f"worker cpu {run.worker_cpu_s:.2f} s, emulator cpu {run.emulator_cpu_s:.2f} s "
        f"+ sandbox {run.sandbox_cpu_s:.2f} s{opened}",
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=32, help="payload per run (default 32)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--echoes", type=int, default=20, help="one-line echoes for the latency")
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=None,
        help="the worker's refill interval (PAPERCLIP_CREATEOS_PACE_MS); default: the worker's "
        f"own ({DEFAULT_INTERVAL * 1000:g} ms); 0 turns pacing off",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    if "channel" not in modes:
        parser.error("the channel mode is what this bench measures")
    size = args.mib * MIB
    if size % max(EXECUTE_CHUNKS.values()):
        parser.error("--mib must be a multiple of 4")
    env: dict[str, str] = {}
    interval = DEFAULT_INTERVAL
    if args.pace_ms is not None:
        env[ENV_INTERVAL_MS] = f"{args.pace_ms:g}"
        interval = max(args.pace_ms, 0.0) / 1000
    result = anyio.run(measure, size, args.rounds, modes, args.echoes, interval, env)
    pacing = f"pacing {result['pace_interval_ms']:g} ms" if interval else "pacing off"
    print(f"duplex: {args.mib} MiB echoed through cat, median of {args.rounds} round(s), {pacing}")
    for mode, figures in result["modes"].items():
        line = (
            f"  {mode:12} {figures['mib_s']:7.2f} MiB/s  ({figures['seconds']} s, "
            f"{figures['calls']} calls, {figures['requests']} API requests, "
            f"worker {figures['worker_cpu_s']} CPU s)"
        )
        if "open_s" in figures:
            line += f"  open {figures['open_s']} s"
        print(line)
    for name, entry in result["latency"].items():
        print(
            f"  {name:7} one-line echo p50 {entry['p50_ms']} ms, p90 {entry['p90_ms']} ms "
            f"(min {entry['min_ms']}, max {entry['max_ms']}), {args.echoes} echoes"
        )
    for name, ratio in result["ratios"].items():
        print(f"ratio {name}: {ratio}")
    print(f"worker peak RSS: {result['worker_peak_rss_mib']} MiB")
    if not args.no_save:
        suffix = "" if args.pace_ms is None else f"-pace-{args.pace_ms:g}"
        print(f"written to {save_result('duplex' + suffix, result)}")


if __name__ == "__main__":
    main()
