"""Sync transfer: a 1 GiB tree (one 512 MiB file plus 20,000 small files) synced in and out
through the worker, against ``tar`` piped into a plain HTTP PUT (and a GET piped into ``tar -x``)
against the same emulator in the same run.

The worker runs in its own process (devtools/stdio_host.py ``StdioHost``: the protocol
over pipes, the host's scrubbed environment, so its requests are paced at the real 300 ms) and the
emulator
in another, so the worker's peak RSS (VmHWM) and CPU time are its own.

- sync in, worker: ``environmentSyncIn`` of the directory (the worker archives it to a temp file,
  PUTs it, and one guarded control command unpacks it in the sandbox).
- sync in, baseline: ``tar -cf - -C src .`` streamed as the body of one PUT (httpx, no pacing),
  then the same unpacking in the sandbox with one ``exec`` (``tar -xf``), so both end with the
  tree in the workspace.
- sync out, worker: ``environmentSyncOut`` of that directory (a control command packs it, the
  worker downloads to a temp file, validates the whole archive, then extracts it with tarfile).
- sync out, baseline: ``exec`` of ``tar -cf`` in the sandbox, then one GET streamed into
  ``tar -xf - -C dst``.

The transfer part of each baseline (the PUT, the GET) is also printed on its own. Each timed
step starts after ``sync`` (dirty pages written back): on this kind of VM, creating 20,000 files
costs far more while gigabytes written by the previous step are still being flushed, which
otherwise lands on whichever side runs second. The order of worker and baseline alternates
from round to round. The emulator's
per-file limit is raised to 2 GiB for the run (its default, like CreateOS, is about 512 MiB:
see the report). Goals: ratios <= 1.3, worker peak RSS < 100 MiB. Data lives under a temp
folder (about 1 GiB on the host, more inside the emulator) and is removed afterwards.

    .venv/bin/python bench/sync_transfer.py [--rounds 2] [--small-files 20000] [--big-mib 512]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _transfer as transfer
import anyio
from _common import (
    GIB,
    MIB,
    PYTHON,
    emulator_process,
    environment_call,
    save_result,
)

from devtools.emulator_process import EmulatorProcess
from devtools.stdio_host import StdioHost

GOAL_RATIO = 1.3
GOAL_RSS_MIB = 100.0
PIPE_READ = 1024 * 1024


# --- the data ---------------------------------------------------------------------------------


def make_tree(root: Path, *, big_bytes: int, small_files: int, small_total: int) -> tuple[int, int]:
    """One big file plus ``small_files`` files in 100 folders; returns (files, bytes)."""
    root.mkdir()
    block = os.urandom(MIB)
    with (root / "big.bin").open("wb") as out:
        for index in range(big_bytes // MIB):
            out.write(index.to_bytes(8, "little") + block[8:])
        out.write(block[: big_bytes % MIB])
    size = small_total // small_files
    pool = os.urandom(size + 4096)
    for index in range(small_files):
        folder = root / f"d{index % 100:02d}"
        if index < 100:
            folder.mkdir()
        offset = index % 4096
        (folder / f"f{index:05d}.dat").write_bytes(pool[offset : offset + size])
    return small_files + 1, big_bytes + size * small_files


# --- baselines ----------------------------------------------------------------------------------


async def baseline_in(
    emu: EmulatorProcess, sandbox_id: str, src: Path, target: str
) -> dict[str, float]:
    """``tar -c`` piped into one PUT, then one exec unpacking it into the workspace."""
    scratch = "/tmp/bench-baseline-in.tar"
    started = time.perf_counter()
    tar = await anyio.open_process(["tar", "-cf", "-", "-C", str(src), "."], stdout=subprocess.PIPE)

    async def body() -> AsyncIterator[bytes]:
        assert tar.stdout is not None
        while True:
            try:
                yield await tar.stdout.receive(PIPE_READ)
            except anyio.EndOfStream:
                return

    async with (
        transfer.raw_http(emu.base_url) as http,
        transfer.plain_api(emu.base_url) as api,
    ):
        answer = await http.put(
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": scratch},
            content=body(),
            headers={"Content-Type": "application/octet-stream"},
        )
        answer.raise_for_status()
        if await tar.wait() != 0:
            raise RuntimeError("baseline tar -c failed")
        transferred = time.perf_counter()
        script = f"mkdir -p {target} && tar -xf {scratch} -C {target} && rm -f {scratch}"
        result = await api.exec(sandbox_id, "/bin/bash", ["-c", script])
        if result.exit_code != 0:
            raise RuntimeError(f"baseline unpack failed: {result.stderr[-300:]!r}")
    finished = time.perf_counter()
    return {"total_s": finished - started, "transfer_s": transferred - started}


async def baseline_out(
    emu: EmulatorProcess, sandbox_id: str, source: str, dst: Path
) -> dict[str, float]:
    """One exec packing the tree, then one GET piped into ``tar -x``."""
    scratch = "/tmp/bench-baseline-out.tar"
    dst.mkdir()
    started = time.perf_counter()
    async with (
        transfer.raw_http(emu.base_url) as http,
        transfer.plain_api(emu.base_url) as api,
    ):
        result = await api.exec(sandbox_id, "/bin/tar", ["-cf", scratch, "-C", source, "."])
        if result.exit_code != 0:
            raise RuntimeError(f"baseline pack failed: {result.stderr[-300:]!r}")
        packed = time.perf_counter()
        tar = await anyio.open_process(["tar", "-xf", "-", "-C", str(dst)], stdin=subprocess.PIPE)
        assert tar.stdin is not None
        async with http.stream(
            "GET", f"/v1/sandboxes/{sandbox_id}/files", params={"path": scratch}
        ) as answer:
            answer.raise_for_status()
            async for chunk in answer.aiter_raw(PIPE_READ):
                await tar.stdin.send(chunk)
        await tar.stdin.aclose()
        if await tar.wait() != 0:
            raise RuntimeError("baseline tar -x failed")
        finished = time.perf_counter()
        await api.exec(sandbox_id, "/bin/rm", ["-f", scratch])
    return {"total_s": finished - started, "transfer_s": finished - packed}


# --- the worker -----------------------------------------------------------------------------------


async def one_round(
    emu: EmulatorProcess,
    worker: StdioHost,
    common: dict[str, Any],
    lease: dict[str, Any],
    src: Path,
    work: Path,
    expected: tuple[int, int],
    index: int,
) -> transfer.Round:
    r = await transfer.one_round(
        emu,
        worker,
        common,
        lease,
        src=src,
        work=work,
        expected=expected,
        index=index,
        baseline_in=lambda sandbox, source, target: baseline_in(emu, sandbox, source, target),
        baseline_out=lambda sandbox, source, target: baseline_out(emu, sandbox, source, target),
    )
    return transfer.Round(**transfer.Round.fields(r))


async def measure(rounds: int, small_files: int, big_mib: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        work = Path(tmp)
        src = work / "src"
        print(f"writing the tree under {src} ...", file=sys.stderr)
        expected = await anyio.to_thread.run_sync(
            lambda: make_tree(
                src, big_bytes=big_mib * MIB, small_files=small_files, small_total=512 * MIB
            )
        )
        async with emulator_process() as emu:
            await emu.admin.settings(max_file_bytes=2 * GIB)
            common = environment_call(emu.base_url)
            async with StdioHost(python=PYTHON, stderr="inherit") as worker:
                results, peak = await transfer.run_rounds(
                    worker,
                    common,
                    rounds,
                    lambda lease, index: one_round(
                        emu, worker, common, lease, src, work, expected, index
                    ),
                )
    return transfer.summary(
        results,
        expected,
        peak,
        {"goal_ratio": GOAL_RATIO, "goal_peak_rss_mib": GOAL_RSS_MIB},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small-files", type=int, default=20_000)
    parser.add_argument("--big-mib", type=int, default=512)
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args()
    result = anyio.run(measure, args.rounds, args.small_files, args.big_mib)
    tree = result["tree"]
    print(
        f"sync transfer: {tree['files']} files, {tree['bytes'] / GIB:.2f} GiB, "
        f"median of {args.rounds} round(s)"
    )
    s_in, s_out = result["sync_in_s"], result["sync_out_s"]
    print(
        f"  sync in : worker {s_in['worker']} s, baseline {s_in['baseline']} s "
        f"(its PUT alone {s_in['baseline_put_only']} s)"
    )
    print(
        f"  sync out: worker {s_out['worker']} s, baseline {s_out['baseline']} s "
        f"(its GET alone {s_out['baseline_get_only']} s)"
    )
    print(f"ratio in {result['ratio_in']}, ratio out {result['ratio_out']} (goal <= {GOAL_RATIO})")
    per_round = ", ".join(f"{r['in']}/{r['out']}" for r in result["round_ratios"])
    print(f"  per round (in/out): {per_round}")
    print(f"worker CPU: in {result['worker_cpu_s']['in']} s, out {result['worker_cpu_s']['out']} s")
    print(f"worker peak RSS: {result['worker_peak_rss_mib']} MiB (goal < {GOAL_RSS_MIB})")
    if not args.no_save:
        save_result("sync_transfer", result)


if __name__ == "__main__":
    main()
