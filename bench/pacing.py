"""Pacing: request starts per minute under heartbeat-like bursts, token bucket vs even spacing.

Simulated request starts, no HTTP: a request is ``wait_turn()`` then a 30 ms sleep standing in
for the call. Two pacers run side by side in one event loop, on the same seeded workload:

- ``bucket``: the product's :class:`~provider.createos.pacer.RequestPacer` (capacity 40, one
  token per 250 ms) on its shared file in a temp runtime folder;
- ``even``: the earlier design, every start at least 300 ms after the previous one (a tiny
  in-process baseline kept in this script, not in the product).

Workload per pacer (``--leases`` copies of a lease loop plus one poller): a burst of 5
concurrent requests, wait for them, a gap of 200-500 ms (``--gap-ms``), repeat; and a steady
background poll, one request a second. Prints per pacer the requests per minute achieved, the
most starts in any 60 s window (any window of the run when it is shorter) and in 1/5/10 s
windows against the bucket's bound ``40 + 4*T``, and the time from a burst's issue to its last
start; then the ratio bucket/even of requests per minute. Writes bench/results/pacing.json.

    .venv/bin/python bench/pacing.py [--seconds 60] [--leases 1] [--gap-ms 200,500] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from _common import save_result

from devtools.windows import max_in_window
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL, RequestPacer

EVEN_INTERVAL = 0.3
SERVICE_S = 0.03
BURST = 5
POLL_S = 1.0
WINDOWS = (1, 5, 10, 60)


class Pacer(Protocol):
    async def wait_turn(self) -> None: ...


class EvenSpacing:
    """Baseline: starts at least ``interval`` apart, FIFO (anyio.Lock is fair), in-process."""

    def __init__(self, interval: float, on_start: Callable[[float], object]) -> None:
        self._interval = interval
        self._on_start = on_start
        self._lock = anyio.Lock()
        self._last = -float("inf")

    async def wait_turn(self) -> None:
        async with self._lock:
            delay = self._last + self._interval - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            self._last = time.monotonic()
            self._on_start(self._last)


@dataclass
class Run:
    name: str
    starts: list[float] = field(default_factory=list)
    bursts: list[float] = field(default_factory=list)  # issue to last start, seconds


async def workload(
    pacer: Pacer, run: Run, leases: int, gap: tuple[float, float], seed: int, stop_at: float
) -> None:
    async def request() -> None:
        await pacer.wait_turn()
        await anyio.sleep(SERVICE_S)

    async def one(started: list[float]) -> None:
        await pacer.wait_turn()
        started.append(time.monotonic())
        await anyio.sleep(SERVICE_S)

    async def lease(rng: random.Random) -> None:
        while time.monotonic() < stop_at:
            issued = time.monotonic()
            started: list[float] = []
            async with anyio.create_task_group() as tg:
                for _ in range(BURST):
                    tg.start_soon(one, started)
            run.bursts.append(max(started) - issued)
            await anyio.sleep(rng.uniform(*gap))

    async def poller() -> None:
        async with anyio.create_task_group() as tg:
            while time.monotonic() < stop_at:
                tg.start_soon(request)  # a poll does not wait for the previous one
                await anyio.sleep(POLL_S)

    async with anyio.create_task_group() as tg:
        for index in range(leases):
            tg.start_soon(lease, random.Random(seed * 1000 + index))
        tg.start_soon(poller)


def summary(run: Run, seconds: float, began: float) -> dict[str, Any]:
    inside = [t for t in run.starts if t < began + seconds]
    windows = {f"{w}s": max_in_window(inside, min(w, seconds)) for w in WINDOWS}
    bursts = sorted(run.bursts)
    return {
        "starts": len(inside),
        "per_minute": round(len(inside) * 60 / seconds, 1),
        "max_in_window": windows,
        "bucket_bound": {
            f"{w}s": CAPACITY + round(min(w, seconds) / DEFAULT_INTERVAL) for w in WINDOWS
        },
        "burst_to_last_start_s": {
            "p50": round(statistics.median(bursts), 3) if bursts else None,
            "p95": round(bursts[int(0.95 * (len(bursts) - 1))], 3) if bursts else None,
            "count": len(bursts),
        },
    }


async def measure(
    seconds: float, leases: int, gap: tuple[float, float], seed: int
) -> dict[str, Any]:
    bucket_run, even_run = Run("bucket"), Run("even")
    with tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp:
        bucket = RequestPacer(
            "http://127.0.0.1:9", shared_dir=Path(tmp) / "run", on_start=bucket_run.starts.append
        )
        even = EvenSpacing(EVEN_INTERVAL, even_run.starts.append)
        began = time.monotonic()
        stop_at = began + seconds
        async with anyio.create_task_group() as tg:
            tg.start_soon(workload, bucket, bucket_run, leases, gap, seed, stop_at)
            tg.start_soon(workload, even, even_run, leases, gap, seed, stop_at)
    wall = time.monotonic() - began
    result = {r.name: summary(r, seconds, began) for r in (bucket_run, even_run)}
    ratio = result["bucket"]["per_minute"] / result["even"]["per_minute"]
    return {
        "seconds": seconds,
        "leases": leases,
        "seed": seed,
        "wall_s": round(wall, 1),
        "workload": {
            "burst": BURST,
            "gap_s": list(gap),
            "poll_s": POLL_S,
            "service_s": SERVICE_S,
        },
        **result,
        "ratio_per_minute": round(ratio, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--leases", type=int, default=1)
    parser.add_argument("--gap-ms", default="200,500", help="gap between bursts: LOW,HIGH")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="15 s instead of 60 s")
    args = parser.parse_args()
    seconds = 15.0 if args.quick else args.seconds
    low, high = (float(part) / 1000 for part in args.gap_ms.split(","))
    report = anyio.run(measure, seconds, args.leases, (low, high), args.seed)

    print(f"{seconds:.0f} s, {args.leases} lease loop(s) of {BURST}-request bursts "
          f"{low * 1000:.0f}-{high * 1000:.0f} ms apart + a poll every {POLL_S:.0f} s, "
          f"wall {report['wall_s']} s")  # fmt: skip
    for name, label in (("bucket", f"token bucket {CAPACITY} + 4/s"), ("even", "even 300 ms")):
        r = report[name]
        w = r["max_in_window"]
        b = r["burst_to_last_start_s"]
        print(f"{label:22} {r['per_minute']:6.1f} requests/min ({r['starts']} starts); "
              f"most in 60 s window {w['60s']}, in 1/5/10 s {w['1s']}/{w['5s']}/{w['10s']} "
              f"(bucket bound {r['bucket_bound']['60s']}, "
              f"{'/'.join(str(r['bucket_bound'][k]) for k in ('1s', '5s', '10s'))}); "
              f"burst to last start p50 {b['p50']} s, p95 {b['p95']} s")  # fmt: skip
    print(f"ratio bucket/even (requests per minute): {report['ratio_per_minute']:.2f}")
    path = save_result("pacing", report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
