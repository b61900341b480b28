"""A heartbeat's four inbound syncs on one lease: one after another vs all at once, same run.

With ``concurrentSyncOperations`` declared the host may send a run's inbound syncs (the
workspace and the ``skills``, ``mcp-config`` and ``config-seed`` assets, docs/protocol.md A3.4)
together instead of one at a time. This bench rebuilds that set: four directory syncs of the
heartbeat's sizes, each with post-upload commands shaped like the host's (``mkdir``, ``tar -xf``
of an uploaded archive, ``rm``), through the real driver against the emulator in its own process,
at **default pacing** (the figure is what an operator sees). Rounds alternate the two modes on
fresh leases. Prints the median wall time of the four syncs per mode and the ratio, and writes
bench/results/concurrent_sync.json.

    .venv/bin/python bench/concurrent_sync.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import API_KEY, emulator_process, environment_call, save_result

from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService

ASSETS = {"workspace": 40, "skills": 12, "mcp-config": 2, "config-seed": 4}  # files each
WS = "/paperclip-workspace"


async def _noop(*_: Any) -> None:
    return None


def make_assets(root: Path) -> dict[str, Path]:
    """One folder per sync; each holds its files and an inner archive the host would extract."""
    root.mkdir()
    folders = {}
    for name, count in ASSETS.items():
        folder = root / name
        folder.mkdir()
        for n in range(count):
            (folder / f"file-{n}.txt").write_text(f"{name} {n}\n" * 40)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            data = b"seed\n" * 100
            info = tarfile.TarInfo("seed.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        (folder / "bundle.tar").write_bytes(buffer.getvalue())
        folders[name] = folder
    return folders


def operation(name: str, folder: Path) -> dict[str, Any]:
    target = f"{WS}/.paperclip-runtime/bench/{name}"
    return {
        "operationId": name,
        "files": [{"sourcePath": str(folder), "targetPath": target, "kind": "directory"}],
        "postUploadCommands": [
            {"command": f"mkdir -p {target}/extracted"},
            {"command": f"tar -xf {target}/bundle.tar -C {target}/extracted"},
            {"command": f"rm -f {target}/bundle.tar"},
        ],
    }


async def four_syncs(
    service: DriverService, params: dict[str, Any], folders: dict[str, Path], concurrent: bool
) -> float:
    calls = [{**params, "operations": [operation(n, f)]} for n, f in folders.items()]
    started = time.perf_counter()
    if concurrent:
        async with anyio.create_task_group() as group:
            for call in calls:
                group.start_soon(service.sync_in, call)
    else:
        for call in calls:
            await service.sync_in(call)
    return time.perf_counter() - started


async def run(rounds: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {"sequential": [], "concurrent": []}
    async with emulator_process() as emu:
        with tempfile.TemporaryDirectory(prefix="bench-concurrent-sync-") as tmp:
            folders = make_assets(Path(tmp) / "assets")
            journal = LeaseJournal(Path(tmp) / "state" / "leases.sqlite3")
            runtime = DriverRuntime(environ={}, journal=journal)
            service = DriverService(runtime, notify=_noop, log=_noop)
            common = environment_call(emu.base_url)
            common["config"]["apiKey"] = API_KEY
            async with runtime.background.running():
                for n in range(rounds):
                    modes = (
                        ("sequential", "concurrent") if n % 2 == 0 else ("concurrent", "sequential")
                    )
                    for mode in modes:
                        lease = await service.acquire({**common, "runId": f"bench-{n}-{mode}"})
                        params = {**common, "lease": {**lease, "expiresAt": None}}
                        await anyio.sleep(3.0)  # a full token bucket for each timed run
                        seconds = await four_syncs(service, params, folders, mode == "concurrent")
                        timings[mode].append(seconds)
                        print(f"round {n} {mode:10} {seconds:.2f} s", flush=True)
                        await service.destroy(
                            {
                                **common,
                                "providerLeaseId": lease["providerLeaseId"],
                                "leaseMetadata": lease["metadata"],
                            }
                        )
                await service.shutdown()
    summary = {mode: round(statistics.median(values), 2) for mode, values in timings.items()}
    return {
        "rounds": rounds,
        "median_s": summary,
        "rounds_s": {mode: [round(v, 2) for v in values] for mode, values in timings.items()},
        "concurrent_over_sequential": round(summary["concurrent"] / summary["sequential"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = anyio.run(run, args.rounds)
    print(f"four inbound syncs, median: {result['median_s']}")
    print(f"concurrent / sequential: {result['concurrent_over_sequential']}")
    print(f"written to {save_result('concurrent_sync', result)}")


if __name__ == "__main__":
    main()
