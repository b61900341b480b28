"""Split sync: a 2 GiB tree (four 512 MiB files plus a few small ones) synced in and out through
the worker against an emulator whose per-file limit is 500 MiB (so it travels as 256 MiB parts),
against ``tar`` piped into PUTs of the same parts (and GETs piped into ``tar -x``) in the same
run.

The worker runs in its own process (devtools/stdio_host.py ``StdioHost``: the protocol
over pipes, the host's scrubbed environment, so its requests are paced as in production) and the
emulator in another, so the worker's peak RSS (VmHWM) and CPU time are its own.

- sync in, worker: ``environmentSyncIn`` of the directory (the worker archives it to a host temp
  file, PUTs it as byte ranges of at most ``PART_BYTES`` to ``<scratch>.part-NNNN``, then one
  guarded command feeds the parts in order to ``tar -xf -`` in the sandbox).
- sync in, baseline: ``tar -cf - -C src .`` read from its pipe and cut into the same part sizes,
  each part the streamed body of one PUT (httpx, no pacing), then one ``exec`` of
  ``cat parts | tar -xf -`` and the parts' removal, so both end with the tree in the workspace.
- sync out, worker: ``environmentSyncOut`` of that directory (a control command pipes ``tar``
  into ``split``, the worker GETs the parts in order into one host temp file, validates the whole
  archive, then extracts it with tarfile).
- sync out, baseline: ``exec`` of the same ``tar | split`` in the sandbox, then one GET per part
  streamed into one ``tar -xf - -C dst``.

The transfer part of each baseline (the PUTs, the GETs) is also printed on its own. Each timed
step starts after ``sync`` (dirty pages written back), and the order of worker and baseline
alternates from round to round (as in ``sync_transfer.py``). Goals: ratios <= 1.3, worker peak
RSS < 100 MiB. Data lives under a temp folder (2 GiB on the host, up to about 6 GiB more inside
the emulator and in the worker's temp files while a sync runs) and is removed afterwards.

    .venv/bin/python bench/sync_split.py [--rounds 1] [--files 4] [--file-mib 512]
        [--limit-mib 500] [--pace-ms MS]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
from provider.driver.transfer.sync import PART_BYTES

GOAL_RATIO = 1.3
GOAL_RSS_MIB = 100.0
PIPE_READ = 1024 * 1024


# --- the data ---------------------------------------------------------------------------------


def make_tree(root: Path, *, files: int, file_bytes: int) -> tuple[int, int]:
    """``files`` big files (every MiB distinct) plus 20 small ones; returns (files, bytes)."""
    root.mkdir()
    block = os.urandom(MIB)
    total = 0
    for number in range(files):
        with (root / f"big-{number}.bin").open("wb") as out:
            for index in range(file_bytes // MIB):
                out.write((number << 32 | index).to_bytes(8, "little") + block[8:])
            out.write(block[: file_bytes % MIB])
        total += file_bytes
    (root / "small").mkdir()
    for index in range(20):
        data = block[index * 1000 : index * 1000 + 500 + index]
        (root / "small" / f"f{index:02d}").write_bytes(data)
        total += len(data)
    return files + 20, total


# --- baselines ----------------------------------------------------------------------------------


def part_name(prefix: str, index: int) -> str:
    return f"{prefix}{index:04d}"


async def baseline_in(
    emu: EmulatorProcess, sandbox_id: str, src: Path, target: str, part_bytes: int
) -> dict[str, float]:
    """``tar -c`` cut into parts, one streamed PUT each, then one exec unpacking them."""
    prefix = "/tmp/bench-split-in.part-"
    started = time.perf_counter()
    tar = await anyio.open_process(["tar", "-cf", "-", "-C", str(src), "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    stdout = tar.stdout
    parts = 0

    async def receive(limit: int) -> bytes:
        try:
            return await stdout.receive(min(PIPE_READ, limit))
        except anyio.EndOfStream:
            return b""

    async with (
        transfer.raw_http(emu.base_url) as http,
        transfer.plain_api(emu.base_url) as api,
    ):
        first = await receive(part_bytes)
        while first:
            left = part_bytes - len(first)

            async def body(head: bytes = first, room: int = left) -> AsyncIterator[bytes]:
                yield head
                while room > 0:
                    chunk = await receive(room)
                    if not chunk:
                        return
                    room -= len(chunk)
                    yield chunk

            answer = await http.put(
                f"/v1/sandboxes/{sandbox_id}/files",
                params={"path": part_name(prefix, parts)},
                content=body(),
                headers={"Content-Type": "application/octet-stream"},
            )
            answer.raise_for_status()
            parts += 1
            first = await receive(part_bytes)
        if await tar.wait() != 0:
            raise RuntimeError("baseline tar -c failed")
        transferred = time.perf_counter()
        names = " ".join(part_name(prefix, i) for i in range(parts))
        script = (
            f"set -o pipefail; mkdir -p {target} && cat {names} | tar -xf - -C {target} "
            f"&& rm -f {names}"
        )
        result = await api.exec(sandbox_id, "/bin/bash", ["-c", script])
        if result.exit_code != 0:
            raise RuntimeError(f"baseline unpack failed: {result.stderr[-300:]!r}")
    finished = time.perf_counter()
    return {"total_s": finished - started, "transfer_s": transferred - started, "parts": parts}


async def baseline_out(
    emu: EmulatorProcess, sandbox_id: str, source: str, dst: Path, part_bytes: int
) -> dict[str, float]:
    """One exec of ``tar | split``, then one GET per part piped into one ``tar -x``."""
    prefix = "/tmp/bench-split-out.part-"
    dst.mkdir()
    started = time.perf_counter()
    async with (
        transfer.raw_http(emu.base_url) as http,
        transfer.plain_api(emu.base_url) as api,
    ):
        script = (
            f"set -o pipefail; tar -cf - -C {source} . | split -b {part_bytes} -d -a 4 - {prefix}"
            f" && ls {prefix}* | wc -l"
        )
        result = await api.exec(sandbox_id, "/bin/bash", ["-c", script])
        if result.exit_code != 0:
            raise RuntimeError(f"baseline pack failed: {result.stderr[-300:]!r}")
        parts = int(result.stdout.strip())
        packed = time.perf_counter()
        tar = await anyio.open_process(["tar", "-xf", "-", "-C", str(dst)], stdin=subprocess.PIPE)
        assert tar.stdin is not None
        for index in range(parts):
            async with http.stream(
                "GET",
                f"/v1/sandboxes/{sandbox_id}/files",
                params={"path": part_name(prefix, index)},
            ) as answer:
                answer.raise_for_status()
                async for chunk in answer.aiter_raw(PIPE_READ):
                    await tar.stdin.send(chunk)
        await tar.stdin.aclose()
        if await tar.wait() != 0:
            raise RuntimeError("baseline tar -x failed")
        finished = time.perf_counter()
        await api.exec(sandbox_id, "/bin/bash", ["-c", f"rm -f {prefix}*"])
    return {"total_s": finished - started, "transfer_s": finished - packed, "parts": parts}


# --- the worker -----------------------------------------------------------------------------------


@dataclass
class Round(transfer.Round):
    parts_in: int
    parts_out: int


async def sandbox_scratch(emu: EmulatorProcess, sandbox_id: str) -> None:
    """Fail when a sync left scratch files in the sandbox's /tmp."""
    async with transfer.plain_api(emu.base_url) as api:
        result = await api.exec(sandbox_id, "/bin/bash", ["-c", "ls -a /tmp | grep -v '^\\.*$'"])
    if result.stdout.strip():
        raise RuntimeError(f"scratch left in the sandbox's /tmp: {result.stdout!r}")


async def one_round(
    emu: EmulatorProcess,
    worker: StdioHost,
    common: dict[str, Any],
    lease: dict[str, Any],
    src: Path,
    work: Path,
    expected: tuple[int, int],
    index: int,
) -> Round:
    r = await transfer.one_round(
        emu,
        worker,
        common,
        lease,
        src=src,
        work=work,
        expected=expected,
        index=index,
        baseline_in=lambda sandbox, source, target: baseline_in(
            emu, sandbox, source, target, PART_BYTES
        ),
        baseline_out=lambda sandbox, source, target: baseline_out(
            emu, sandbox, source, target, PART_BYTES
        ),
        after_out=lambda sandbox: sandbox_scratch(emu, sandbox),
    )
    return Round(
        **transfer.Round.fields(r),
        parts_in=int(r.baseline_in["parts"]),
        parts_out=int(r.baseline_out["parts"]),
    )


async def measure(
    rounds: int, files: int, file_mib: int, limit_mib: int, pace_ms: int | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        work = Path(tmp)
        src = work / "src"
        (work / "tmp").mkdir()
        print(f"writing the tree under {src} ...", file=sys.stderr)
        expected = await anyio.to_thread.run_sync(
            lambda: make_tree(src, files=files, file_bytes=file_mib * MIB)
        )
        env = {"TMPDIR": str(work / "tmp")}  # the worker's upload archive
        if pace_ms is not None:
            env["PAPERCLIP_CREATEOS_PACE_MS"] = str(pace_ms)
        async with emulator_process() as emu:
            await emu.admin.settings(max_file_bytes=limit_mib * MIB)
            common = environment_call(emu.base_url, timeout_ms=1_800_000)
            async with StdioHost(python=PYTHON, stderr="inherit", env=env) as worker:
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
        {
            "per_file_limit_mib": limit_mib,
            "part_bytes": PART_BYTES,
            "parts": {"in": results[0].parts_in, "out": results[0].parts_out},
            "pace_ms": pace_ms,
            "goal_ratio": GOAL_RATIO,
            "goal_peak_rss_mib": GOAL_RSS_MIB,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--files", type=int, default=4, help="big files in the tree")
    parser.add_argument("--file-mib", type=int, default=512, help="size of each big file")
    parser.add_argument("--limit-mib", type=int, default=500, help="the emulator's per-file limit")
    parser.add_argument(
        "--pace-ms", type=int, default=None, help="worker pacing (default: its own)"
    )
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args()
    if args.limit_mib * MIB < PART_BYTES:
        parser.error(f"the per-file limit must hold a part ({PART_BYTES >> 20} MiB)")
    result = anyio.run(
        measure, args.rounds, args.files, args.file_mib, args.limit_mib, args.pace_ms
    )
    tree = result["tree"]
    print(
        f"sync split: {tree['files']} files, {tree['bytes'] / GIB:.2f} GiB, "
        f"{result['parts']['in']} parts in / {result['parts']['out']} out of "
        f"{PART_BYTES >> 20} MiB (per-file limit {args.limit_mib} MiB), "
        f"median of {args.rounds} round(s)"
    )
    s_in, s_out = result["sync_in_s"], result["sync_out_s"]
    print(
        f"  sync in : worker {s_in['worker']} s, baseline {s_in['baseline']} s "
        f"(its PUTs alone {s_in['baseline_put_only']} s)"
    )
    print(
        f"  sync out: worker {s_out['worker']} s, baseline {s_out['baseline']} s "
        f"(its GETs alone {s_out['baseline_get_only']} s)"
    )
    print(f"ratio in {result['ratio_in']}, ratio out {result['ratio_out']} (goal <= {GOAL_RATIO})")
    per_round = ", ".join(f"{r['in']}/{r['out']}" for r in result["round_ratios"])
    print(f"  per round (in/out): {per_round}")
    print(f"worker CPU: in {result['worker_cpu_s']['in']} s, out {result['worker_cpu_s']['out']} s")
    print(f"worker peak RSS: {result['worker_peak_rss_mib']} MiB (goal < {GOAL_RSS_MIB})")
    if not args.no_save:
        save_result("sync_split", result)


if __name__ == "__main__":
    main()
