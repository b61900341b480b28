"""Execute relay: a command printing 256 MiB of text, followed through the worker, against a
plain client that only reads the same ``connect`` stream.

Readers of the same kind of process in the same emulator (its own process), interleaved:

- ``plain``: httpx straight to ``GET .../connect?after=0``; each frame decoded with msgspec
  (type + strict base64) and its bytes counted. No pacing, no UTF-8 decoding, no tail.
  ``plain-256k`` is the same reader with the 256 KiB response reads the worker's own client
  uses (``plain`` keeps httpx's default, 64 KiB): the stricter baseline.
- ``manager``: ``environmentExecute`` through the REAL Paperclip worker manager (Node) into its
  ``onLog`` sink; the peer relays every chunk as an NDJSON line and this script parses it.
- ``stand-in``: the same call from a Python host stand-in that speaks the worker protocol over
  pipes and parses every line (devtools/stdio_host.py ``StdioHost``), without Node in
  the path.

The worker sends at most 128 Mi characters live per call (the host's own cap, docs/protocol.md
H5); the rest of the output is still read, decoded and tail-buffered. So two rates are reported
per reader:

- live relay: the first 128 MiB, first byte -> 128 Mi characters delivered (plain: first frame
  -> 128 MiB read), which is the relay into the log sink proper;
- whole command: 256 MiB, first byte -> answer (plain: first frame -> exit frame). The worker's
  answer waits for its cleanup request (paced at 300 ms), which this includes.

Also printed: the worker's CPU seconds per GiB of output (utime+stime from /proc/<pid>/stat
around the call) and its peak RSS (VmHWM); per run, the CPU time of this script, the emulator,
its sandbox processes and (manager runs) the Node peer, to see where a 2-core machine's time
goes. Readers are interleaved round by round; medians and best runs are both reported, since
other work on a shared machine disturbs single runs. Goals: ratio >= 0.7, peak RSS < 100 MiB.

    .venv/bin/python bench/execute_relay.py [--mib 256] [--rounds 5]
        [--readers plain,plain-256k,manager,stand-in]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpcore
import httpx
import msgspec
from _common import (
    API_KEY,
    GIB,
    MIB,
    PYTHON,
    cpu_seconds,
    descendants_cpu_seconds,
    emulator_process,
    environment_call,
    parent_pid,
    peak_rss_mib,
    save_result,
)

from devtools.call_params import bash, lease_ref, with_lease
from devtools.emulator_process import EmulatorProcess
from devtools.host_peer import HostPeer
from devtools.stdio_host import StdioHost
from provider.createos.client import HTTP11_READ_BYTES, CreateOSClient
from provider.createos.pacer import RequestPacer

GOAL_RATIO = 0.7
HTTPX_DEFAULT_READ = 64 * 1024
GOAL_RSS_MIB = 100.0
LIVE_CAP = 128 * MIB  # characters the worker relays live per call (= the host's cap)
TAIL = 4 * MIB  # characters the result keeps per stream
LINE = "x" * 99  # 100-character lines of text


def producer(size: int) -> str:
    return f"yes {LINE} | head -c {size}"


def expected_tail(size: int) -> str:
    """The last 4 Mi characters the producer prints (the worker's tail buffer)."""
    offset = (size - TAIL) % 100
    return ((LINE + "\n") * (TAIL // 100 + 2))[offset : offset + TAIL]


@dataclass
class Run:
    reader: str
    total_bytes: int = 0
    live_chars: int = 0
    chunks: int = 0
    max_chunk: int = 0  # the longest live chunk (plain: frame), characters
    call_s: float = 0.0  # request sent (plain: process create) -> answer (plain: exit frame)
    live_s: float = 0.0  # first byte -> LIVE_CAP characters delivered
    whole_s: float = 0.0  # first byte -> answer
    cpu_s: float | None = None  # the worker's CPU time during the call
    reader_cpu_s: float = 0.0  # this script's CPU time (the plain client, or parsing relayed lines)
    emulator_cpu_s: float = 0.0
    sandbox_cpu_s: float = 0.0  # the sandbox processes (guest supervisor, the command)
    node_cpu_s: float | None = None  # the Node peer (worker manager + relay), manager runs only

    @property
    def live_mib_s(self) -> float:
        return min(self.live_chars, LIVE_CAP) / MIB / self.live_s if self.live_s else 0.0

    @property
    def whole_mib_s(self) -> float:
        return self.total_bytes / MIB / self.whole_s if self.whole_s else 0.0


@dataclass
class Meter:
    """Counts live output as it arrives and stamps the first byte and the live-cap crossing."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    cap_reached: float | None = None
    chars: int = 0
    chunks: int = 0
    max_chunk: int = 0

    def add(self, size: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.chars += size
        self.chunks += 1
        self.max_chunk = max(self.max_chunk, size)
        if self.cap_reached is None and self.chars >= LIVE_CAP:
            self.cap_reached = now

    def sink(self, stream: str, chunk: str) -> None:
        self.add(len(chunk))


# --- plain client -----------------------------------------------------------------------------


class _Frame(msgspec.Struct):
    type: str
    data_base64: bytes | None = None


_decode_frame = msgspec.json.Decoder(_Frame).decode


async def plain_run(base_url: str, sandbox_id: str, size: int, reader: str) -> Run:
    """Create the process behind a gate, attach to ``connect``, open the gate, read to exit.

    ``plain`` reads with httpx's defaults (httpcore reads 64 KiB at a time); ``plain-256k``
    with the 256 KiB reads the worker's client uses (provider.createos.client).
    """
    read_bytes = HTTP11_READ_BYTES if reader == "plain-256k" else HTTPX_DEFAULT_READ
    with _http11_reads(read_bytes):
        return await _plain_run(base_url, sandbox_id, size, reader)


@contextmanager
def _http11_reads(read_bytes: int) -> Iterator[None]:
    before = httpcore.AsyncHTTP11Connection.READ_NUM_BYTES
    httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = read_bytes
    try:
        yield
    finally:
        httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = before


async def _plain_run(base_url: str, sandbox_id: str, size: int, reader: str) -> Run:
    gate = f"/tmp/bench-gate-{uuid.uuid4().hex}"
    script = f"while [ ! -e {gate} ]; do sleep 0.01; done; {producer(size)}"
    pacer = RequestPacer(base_url, interval=0.0, shared_dir=None)
    run = Run(reader)
    async with (
        CreateOSClient(base_url, API_KEY, pacer=pacer) as api,
        httpx.AsyncClient(base_url=base_url, headers={"X-Api-Key": API_KEY}) as http,
    ):
        meter = Meter()
        view = await api.create_process(sandbox_id, cmd="/bin/bash", args=["-c", script])
        url = f"/v1/sandboxes/{sandbox_id}/processes/{view.process_id}/connect"
        async with http.stream("GET", url, params={"after": 0}, timeout=60) as response:
            response.raise_for_status()
            await api.put_file(sandbox_id, gate, b"")
            parts: list[bytes] = []  # the unterminated line, joined once its newline comes
            done = False
            async for chunk in response.aiter_raw():
                start = 0
                end = chunk.find(b"\n")
                while end >= 0:
                    if parts:
                        parts.append(chunk[start:end])
                        line = b"".join(parts)
                        parts.clear()
                    else:
                        line = chunk[start:end]
                    if line:
                        frame = _decode_frame(line)
                        if frame.type == "data" and frame.data_base64 is not None:
                            meter.add(len(frame.data_base64))
                        elif frame.type == "exit":
                            done = True
                    start = end + 1
                    end = chunk.find(b"\n", start)
                if start < len(chunk):
                    parts.append(chunk[start:])
                if done:
                    break
        finished = time.perf_counter()
        await api.exec(sandbox_id, "/bin/rm", ["-f", gate])
    assert meter.first is not None and meter.cap_reached is not None
    run.total_bytes = run.live_chars = meter.chars
    run.chunks = meter.chunks
    run.max_chunk = meter.max_chunk
    run.call_s = finished - meter.started
    run.live_s = meter.cap_reached - meter.first
    run.whole_s = finished - meter.first
    return run


# --- the worker, behind the real manager or the stand-in --------------------------------------

CallWithSink = Callable[[dict[str, Any], Callable[[str, str], None]], Awaitable[Any]]


async def worker_run(
    reader: str,
    call: CallWithSink,
    worker_pid: int,
    common: dict[str, Any],
    lease: dict[str, Any],
    size: int,
) -> Run:
    params = bash(with_lease(common, lease), producer(size))
    meter = Meter()
    cpu_before = cpu_seconds(worker_pid)
    result = await call(params, meter.sink)
    end = time.perf_counter()
    cpu_after = cpu_seconds(worker_pid)
    if result["exitCode"] != 0 or meter.first is None:
        raise RuntimeError(f"{reader}: the command failed: {result['exitCode']!r}")
    run = Run(
        reader,
        total_bytes=size,
        live_chars=meter.chars,
        chunks=meter.chunks,
        max_chunk=meter.max_chunk,
    )
    run.call_s = end - meter.started
    run.whole_s = end - meter.first
    run.live_s = (meter.cap_reached or end) - meter.first
    run.cpu_s = cpu_after - cpu_before
    if not result["metadata"]["outputTruncated"] or result["stdout"] != expected_tail(size):
        raise RuntimeError(f"{reader}: the result's tail or metadata is wrong")
    return run


# --- orchestration ----------------------------------------------------------------------------


def summarize(runs: list[Run], reader: str) -> dict[str, Any]:
    mine = [r for r in runs if r.reader == reader]
    if not mine:
        return {}
    out: dict[str, Any] = {
        "live_mib_s": round(statistics.median(r.live_mib_s for r in mine), 1),
        "whole_mib_s": round(statistics.median(r.whole_mib_s for r in mine), 1),
        "call_s": round(statistics.median(r.call_s for r in mine), 2),
        "best_live_mib_s": round(max(r.live_mib_s for r in mine), 1),
        "best_whole_mib_s": round(max(r.whole_mib_s for r in mine), 1),
        "live_chars": mine[-1].live_chars,
        "chunks": mine[-1].chunks,
        "max_chunk": max(r.max_chunk for r in mine),
    }
    cpus = [r.cpu_s / (r.total_bytes / GIB) for r in mine if r.cpu_s is not None]
    if cpus:
        out["cpu_s_per_gib"] = round(statistics.median(cpus), 2)
    return out


async def measure(size: int, rounds: int, readers: list[str]) -> dict[str, Any]:
    runs: list[Run] = []
    rss: dict[str, float] = {}
    async with emulator_process() as emu:
        common = environment_call(emu.base_url)
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                HostPeer(log_file=Path(tmp) / "peer.log", cwd=Path(tmp)) as peer,
                StdioHost(python=PYTHON, stderr="inherit") as stand_in,
            ):
                await peer.start_worker(auto_restart=False)
                manager_pid = peer.worker_pid()
                assert manager_pid is not None

                async def via_manager(params: dict[str, Any], sink: Any) -> Any:
                    return await peer.call(
                        "environmentExecute", params, timeout_ms=600_000, on_log=sink
                    )

                async def via_stand_in(params: dict[str, Any], sink: Any) -> Any:
                    return await stand_in.call("environmentExecute", params, on_log=sink)

                lease = await stand_in.call("environmentAcquireLease", {**common, "runId": "bench"})
                try:
                    for index in range(rounds):
                        order = readers if index % 2 == 0 else readers[::-1]
                        for reader in order:
                            run = await _one(
                                reader,
                                emu,
                                lease,
                                common,
                                size,
                                via_manager,
                                via_stand_in,
                                manager_pid,
                                stand_in.pid,
                            )
                            runs.append(run)
                            _print_run(run)
                    rss["manager"] = peak_rss_mib(manager_pid)
                    rss["stand-in"] = peak_rss_mib(stand_in.pid)
                finally:
                    await stand_in.call("environmentReleaseLease", lease_ref(common, lease))
                await peer.stop_worker()
    result: dict[str, Any] = {
        "output_mib": size // MIB,
        "rounds": rounds,
        "goal_ratio": GOAL_RATIO,
        "goal_peak_rss_mib": GOAL_RSS_MIB,
        "readers": {reader: summarize(runs, reader) for reader in readers},
        "worker_peak_rss_mib": {k: round(v, 1) for k, v in rss.items() if _wanted(k, readers)},
        "runs": [asdict(r) for r in runs],
    }
    ratios: dict[str, Any] = {}
    for baseline in ("plain", "plain-256k"):
        plain = result["readers"].get(baseline)
        for reader in ("manager", "stand-in"):
            mine = result["readers"].get(reader)
            if not (plain and mine):
                continue
            entry: dict[str, float] = {}
            for key in ("live", "whole"):
                entry[key] = round(mine[f"{key}_mib_s"] / plain[f"{key}_mib_s"], 3)
                best = mine[f"best_{key}_mib_s"] / plain[f"best_{key}_mib_s"]
                entry[f"best_{key}"] = round(best, 3)
            ratios[f"{reader}/{baseline}"] = entry
    result["ratios"] = ratios
    return result


def _wanted(worker: str, readers: list[str]) -> bool:
    return worker in readers


async def _one(
    reader: str,
    emu: EmulatorProcess,
    lease: dict[str, Any],
    common: dict[str, Any],
    size: int,
    via_manager: CallWithSink,
    via_stand_in: CallWithSink,
    manager_pid: int,
    stand_in_pid: int,
) -> Run:
    assert emu.pid is not None  # set once the emulator process started
    emulator_before = cpu_seconds(emu.pid)
    sandbox_before = descendants_cpu_seconds(emu.pid)
    reader_before = cpu_seconds(os.getpid())
    node_pid = parent_pid(parent_pid(manager_pid))  # worker -> shim -> the manager's process
    node_before = cpu_seconds(node_pid)
    if reader.startswith("plain"):
        run = await plain_run(emu.base_url, lease["providerLeaseId"], size, reader)
    elif reader == "manager":
        run = await worker_run(reader, via_manager, manager_pid, common, lease, size)
    else:
        run = await worker_run(reader, via_stand_in, stand_in_pid, common, lease, size)
    run.emulator_cpu_s = cpu_seconds(emu.pid) - emulator_before
    run.sandbox_cpu_s = descendants_cpu_seconds(emu.pid) - sandbox_before
    run.reader_cpu_s = cpu_seconds(os.getpid()) - reader_before
    if reader == "manager":
        run.node_cpu_s = cpu_seconds(node_pid) - node_before
    return run


def _print_run(run: Run) -> None:
    cpu = f", worker cpu {run.cpu_s:.2f} s" if run.cpu_s is not None else ""
    print(
        f"  {run.reader:9} live {run.live_mib_s:7.1f} MiB/s, whole {run.whole_mib_s:7.1f} MiB/s, "
        f"call {run.call_s:5.2f} s, {run.chunks} chunks (max {run.max_chunk}){cpu}, "
        f"this script cpu {run.reader_cpu_s:.2f} s, emulator cpu {run.emulator_cpu_s:.2f} s "
        f"+ sandbox {run.sandbox_cpu_s:.2f} s"
        + (f", node cpu {run.node_cpu_s:.2f} s" if run.node_cpu_s is not None else ""),
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=256, help="output size (default 256)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--readers", default="plain,plain-256k,manager,stand-in")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args()
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    if args.mib * MIB < LIVE_CAP:
        parser.error("--mib must be at least 128 (the live cap)")
    result = anyio.run(measure, args.mib * MIB, args.rounds, readers)
    print(f"execute relay: {args.mib} MiB of text, median of {args.rounds} round(s)")
    for reader, figures in result["readers"].items():
        line = (
            f"  {reader:9} live relay {figures['live_mib_s']:7.1f} MiB/s"
            f"  whole command {figures['whole_mib_s']:7.1f} MiB/s  call {figures['call_s']} s"
        )
        if "cpu_s_per_gib" in figures:
            line += f"  worker {figures['cpu_s_per_gib']} CPU s/GiB"
        print(line)
    for name, ratio in result["ratios"].items():
        print(
            f"ratio {name}: live {ratio['live']}, whole {ratio['whole']} (medians; best runs: "
            f"live {ratio['best_live']}, whole {ratio['best_whole']}) (goal >= {GOAL_RATIO})"
        )
    for worker, mib in result["worker_peak_rss_mib"].items():
        print(f"worker peak RSS ({worker}): {mib} MiB (goal < {GOAL_RSS_MIB})")
    if not args.no_save:
        save_result("execute_relay", result)


if __name__ == "__main__":
    main()
