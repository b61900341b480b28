"""The round runner shared by the transfer benchmarks (``sync_transfer.py``, ``sync_split.py``).

A round syncs one host tree into the sandbox and back out through the worker and through a
baseline, in an order that alternates from round to round, with dirty pages written back before
every timed step, and checks that every copy holds the expected (files, bytes). What a baseline
does is the script's own; this module knows only how to pair and check the two.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import httpx
from _common import API_KEY, cpu_seconds, peak_rss_mib

from devtools.call_params import lease_ref, with_lease
from devtools.emulator_process import EmulatorProcess
from devtools.stdio_host import StdioHost
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer

WORKSPACE: Final = "/paperclip-workspace"

B = TypeVar("B")
R = TypeVar("R", bound="Round")


async def settle() -> None:
    """Write back dirty pages first, so a step does not pay for the writes of the one before."""
    await anyio.to_thread.run_sync(os.sync)


def tree_figures(root: Path) -> tuple[int, int]:
    """(files, bytes) of a host tree."""
    count = total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            count += 1
            total += os.lstat(os.path.join(folder, name)).st_size
    return count, total


def plain_api(base_url: str) -> CreateOSClient:
    """An unpaced client for the baselines and the checks."""
    return CreateOSClient(
        base_url, API_KEY, pacer=RequestPacer(base_url, interval=0.0, shared_dir=None)
    )


def raw_http(base_url: str) -> httpx.AsyncClient:
    """Plain httpx (no pacing, no retries) for the baselines' streamed PUTs and GETs."""
    return httpx.AsyncClient(base_url=base_url, headers={"X-Api-Key": API_KEY}, timeout=600)


async def sandbox_tree(emu: EmulatorProcess, sandbox_id: str, path: str) -> tuple[int, int]:
    """(files, bytes) of a tree in the sandbox."""
    async with plain_api(emu.base_url) as api:
        script = (
            f"find {path} -type f | wc -l; "
            f"find {path} -type f -printf '%s\\n' | awk '{{s+=$1}} END {{printf \"%.0f\\n\", s}}'"
        )
        result = await api.exec(sandbox_id, "/bin/bash", ["-c", script])
    files, total = result.stdout.split()
    return int(files), int(total)


async def sandbox_rm(emu: EmulatorProcess, sandbox_id: str, *paths: str) -> None:
    async with plain_api(emu.base_url) as api:
        await api.exec(sandbox_id, "/bin/rm", ["-rf", "--", *paths])


@dataclass(frozen=True)
class WorkerStep:
    """One timed worker sync: wall seconds, the worker's CPU seconds, bytes it reported."""

    seconds: float
    cpu_seconds: float
    bytes: int


@dataclass(frozen=True)
class RoundResult:
    """The four timed steps of one round; ``*_in``/``*_out`` baselines are the script's own."""

    worker_in: WorkerStep
    worker_out: WorkerStep
    baseline_in: dict[str, Any]
    baseline_out: dict[str, Any]


BaselineIn = Callable[[str, Path, str], Awaitable[dict[str, Any]]]
"""(sandbox id, host source, sandbox target) -> the baseline's figures."""
BaselineOut = Callable[[str, str, Path], Awaitable[dict[str, Any]]]
"""(sandbox id, sandbox source, host target) -> the baseline's figures."""


async def worker_sync(
    worker: StdioHost,
    common: dict[str, Any],
    lease: dict[str, Any],
    verb: str,
    source: str,
    target: str,
) -> WorkerStep:
    """One ``environmentSyncIn``/``environmentSyncOut`` of a directory, timed."""
    operation = {
        "operationId": "in" if verb == "environmentSyncIn" else "out",
        "files": [{"sourcePath": source, "targetPath": target, "kind": "directory"}],
    }
    cpu = cpu_seconds(worker.pid)
    started = time.perf_counter()
    result = await worker.call(verb, {**with_lease(common, lease), "operations": [operation]})
    elapsed = time.perf_counter() - started
    transferred = int(result["operations"][0]["bytesTransferred"])
    return WorkerStep(elapsed, cpu_seconds(worker.pid) - cpu, transferred)


async def paired(
    index: int, worker: Callable[[], Awaitable[WorkerStep]], baseline: Callable[[], Awaitable[B]]
) -> tuple[WorkerStep, B]:
    """The worker's step and the baseline's, worker first in even rounds, each after settle."""
    if index % 2 == 0:
        await settle()
        ours = await worker()
        await settle()
        theirs = await baseline()
    else:
        await settle()
        theirs = await baseline()
        await settle()
        ours = await worker()
    return ours, theirs


async def one_round(
    emu: EmulatorProcess,
    worker: StdioHost,
    common: dict[str, Any],
    lease: dict[str, Any],
    *,
    src: Path,
    work: Path,
    expected: tuple[int, int],
    index: int,
    baseline_in: BaselineIn,
    baseline_out: BaselineOut,
    after_out: Callable[[str], Awaitable[None]] | None = None,
) -> RoundResult:
    """Sync ``src`` in (worker to ``ours``, baseline to ``theirs``), check both trees, then out
    of ``ours`` (to two host folders), check both; ``after_out(sandbox_id)`` may check more
    before everything the round made is removed."""
    sandbox_id = lease["providerLeaseId"]
    ours, theirs = f"{WORKSPACE}/ours", f"{WORKSPACE}/theirs"
    w_in, b_in = await paired(
        index,
        lambda: worker_sync(worker, common, lease, "environmentSyncIn", str(src), ours),
        lambda: baseline_in(sandbox_id, src, theirs),
    )
    for path in (ours, theirs):
        got = await sandbox_tree(emu, sandbox_id, path)
        if got != expected:
            raise RuntimeError(f"sync in to {path}: {got} files/bytes, expected {expected}")
    await sandbox_rm(emu, sandbox_id, theirs)

    ours_dst, theirs_dst = work / f"out-ours-{index}", work / f"out-theirs-{index}"
    w_out, b_out = await paired(
        index,
        lambda: worker_sync(worker, common, lease, "environmentSyncOut", ours, str(ours_dst)),
        lambda: baseline_out(sandbox_id, ours, theirs_dst),
    )
    for folder in (ours_dst, theirs_dst):
        got = await anyio.to_thread.run_sync(tree_figures, folder)
        if got != expected:
            raise RuntimeError(f"sync out to {folder}: {got} files/bytes, expected {expected}")
    if after_out is not None:
        await after_out(sandbox_id)
    await anyio.to_thread.run_sync(shutil.rmtree, ours_dst)
    await anyio.to_thread.run_sync(shutil.rmtree, theirs_dst)
    await sandbox_rm(emu, sandbox_id, ours)
    return RoundResult(w_in, w_out, b_in, b_out)


@dataclass
class Round:
    """One round's figures as the results file holds them."""

    worker_in_s: float
    worker_out_s: float
    worker_in_cpu_s: float
    worker_out_cpu_s: float
    baseline_in_s: float
    baseline_out_s: float
    baseline_put_s: float
    baseline_get_s: float
    bytes_in: int
    bytes_out: int

    @staticmethod
    def fields(r: RoundResult) -> dict[str, Any]:
        """The common fields from a round's steps (baselines report total_s and transfer_s)."""
        return {
            "worker_in_s": r.worker_in.seconds,
            "worker_out_s": r.worker_out.seconds,
            "worker_in_cpu_s": r.worker_in.cpu_seconds,
            "worker_out_cpu_s": r.worker_out.cpu_seconds,
            "baseline_in_s": r.baseline_in["total_s"],
            "baseline_out_s": r.baseline_out["total_s"],
            "baseline_put_s": r.baseline_in["transfer_s"],
            "baseline_get_s": r.baseline_out["transfer_s"],
            "bytes_in": r.worker_in.bytes,
            "bytes_out": r.worker_out.bytes,
        }


async def run_rounds(
    worker: StdioHost,
    common: dict[str, Any],
    rounds: int,
    one: Callable[[dict[str, Any], int], Awaitable[R]],
) -> tuple[list[R], float]:
    """``rounds`` rounds on one lease (released afterwards); the results and the worker's peak
    RSS in MiB."""
    results: list[R] = []
    lease = await worker.call("environmentAcquireLease", {**common, "runId": "bench"})
    try:
        for index in range(rounds):
            result = await one(lease, index)
            results.append(result)
            print(f"  round {index + 1}: {asdict(result)}", file=sys.stderr)
        peak = peak_rss_mib(worker.pid)
    finally:
        await worker.call("environmentReleaseLease", lease_ref(common, lease))
    return results, peak


def summary(
    results: list[R], expected: tuple[int, int], peak: float, extra: dict[str, Any]
) -> dict[str, Any]:
    """The results file: medians, ratios worker/baseline, per-round ratios, CPU, peak RSS;
    ``extra`` (the script's settings and goals) comes after ``tree`` and ``rounds``."""

    def median(name: str) -> float:
        return round(float(statistics.median(getattr(r, name) for r in results)), 2)

    return {
        "tree": {"files": expected[0], "bytes": expected[1]},
        "rounds": len(results),
        **extra,
        "sync_in_s": {
            "worker": median("worker_in_s"),
            "baseline": median("baseline_in_s"),
            "baseline_put_only": median("baseline_put_s"),
        },
        "sync_out_s": {
            "worker": median("worker_out_s"),
            "baseline": median("baseline_out_s"),
            "baseline_get_only": median("baseline_get_s"),
        },
        "ratio_in": round(median("worker_in_s") / median("baseline_in_s"), 3),
        "ratio_out": round(median("worker_out_s") / median("baseline_out_s"), 3),
        "round_ratios": [
            {
                "in": round(r.worker_in_s / r.baseline_in_s, 3),
                "out": round(r.worker_out_s / r.baseline_out_s, 3),
            }
            for r in results
        ],
        "worker_cpu_s": {"in": median("worker_in_cpu_s"), "out": median("worker_out_cpu_s")},
        "worker_peak_rss_mib": round(peak, 1),
        "runs": [asdict(r) for r in results],
    }
