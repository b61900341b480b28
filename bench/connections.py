"""Pooled keep-alive connections vs a connection pool per call: execute latency, same run.

The driver runs in this process against the emulator in its own process (loopback), pacing
off, so the figure is the client's own cost. ``pooled``: the runtime's shared pool (one
keep-alive ``httpx.AsyncClient`` per origin and key, what the worker uses); ``per-call``: a fresh
client (new TCP connections) for every call, as before. Trivial commands (``true``),
interleaved in rounds; prints p50/p90 per mode and the ratio, writes bench/results/connections.json.

    .venv/bin/python bench/connections.py [--commands 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import API_KEY, emulator_process, environment_call, save_result

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import ENV_INTERVAL_MS
from provider.createos.pool import ConnectionPool
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService


def per_call_client(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
    return CreateOSClient(config.api_url, api_key)


def pooled_factory(pool: ConnectionPool) -> Any:
    def factory(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        return pool.client(config.api_url, api_key)

    return factory


async def _noop(*_: Any) -> None:
    return None


async def run(commands: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {"pooled": [], "per-call": []}
    async with emulator_process() as emu:
        with tempfile.TemporaryDirectory(prefix="bench-connections-") as tmp:
            pool = ConnectionPool()
            services = {}
            for mode, factory in (("pooled", pooled_factory(pool)), ("per-call", per_call_client)):
                journal = LeaseJournal(Path(tmp) / mode / "leases.sqlite3")
                runtime = DriverRuntime(client_factory=factory, environ={}, journal=journal)
                services[mode] = DriverService(runtime, notify=_noop, log=_noop)
            common = environment_call(emu.base_url)
            common["config"]["apiKey"] = API_KEY
            leases = {
                mode: await svc.acquire({**common, "runId": f"bench-{mode}"})
                for mode, svc in services.items()
            }
            try:
                for _ in range(commands):
                    for mode, svc in services.items():
                        params = {**common, "lease": {**leases[mode], "expiresAt": None}}
                        started = time.perf_counter()
                        await svc.execute({**params, "command": "true", "args": []})
                        timings[mode].append((time.perf_counter() - started) * 1000)
            finally:
                for mode, svc in services.items():
                    lease = leases[mode]
                    await svc.destroy(
                        {
                            **common,
                            "providerLeaseId": lease["providerLeaseId"],
                            "leaseMetadata": lease["metadata"],
                        }
                    )
                await pool.aclose()
    summary = {
        mode: {
            "p50_ms": round(statistics.median(values), 1),
            "p90_ms": round(sorted(values)[int(len(values) * 0.9) - 1], 1),
        }
        for mode, values in timings.items()
    }
    ratio = summary["pooled"]["p50_ms"] / summary["per-call"]["p50_ms"]
    return {"commands": commands, "summary": summary, "pooled_over_per_call_p50": round(ratio, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=40)
    args = parser.parse_args()
    os.environ[ENV_INTERVAL_MS] = "0"  # both modes unpaced: the bench measures connections
    result = anyio.run(run, args.commands)
    for mode, entry in result["summary"].items():
        print(f"{mode:9} p50 {entry['p50_ms']} ms, p90 {entry['p90_ms']} ms")
    print(f"pooled / per-call p50: {result['pooled_over_per_call_p50']}")
    print(f"written to {save_result('connections', result)}")


if __name__ == "__main__":
    main()
