"""Lease acquire forked from a snapshot template vs a fresh create with the same tree synced in.

Issue 16: what a prepared template saves at lease start. The driver runs in this process
(``DriverService`` on a ``DriverRuntime``) against the emulator in its own process, at the
worker's **default pacing** (token bucket of 10, one request per 250 ms) unless ``--pace-ms``
(or ``PAPERCLIP_CREATEOS_PACE_MS``) says otherwise; ``--pace-ms 0`` is the latency floor.

A tree shaped like a prepared image (default 2,000 files, 50 MiB, 300 directories, 40 symbolic
links; seeded random bytes: a few large files, many small ones) is written on the host. Once,
untimed: ``environmentStartInteractiveSetup`` creates a setup sandbox, ``environmentSyncIn``
puts the tree into its ``/paperclip-workspace`` (the call carries a lease-shaped metadata for the
setup sandbox: the host itself never syncs into a setup session, an operator prepares it by
hand), ``environmentCaptureTemplate`` pauses it as a template (``templateRef``) and
``environmentCancelInteractiveSetup`` with ``promoted`` ends the session as the host does. Then
per round, both modes interleaved (the order reversed every other round):

- ``fork``: ``environmentAcquireLease`` with ``snapshot: <templateRef>`` in the config: the
  lease forks the template and has the tree. Timed: the acquire.
- ``fresh``: ``environmentAcquireLease`` without a snapshot, then ``environmentSyncIn`` of the
  same tree into ``/paperclip-workspace``. Timed: the acquire and the sync together (baseline).

Each lease is destroyed outside the timed window. Before every timed run the page cache is
written back (``sync``) and the script sleeps until the bucket is full again (10 x interval),
so no run starts on the other's debt. In the first round each mode's tree is checked from inside
the lease (files, directories, links and bytes under the workspace, by ``environmentExecute``),
against the host's counts. Requests per timed run come from the emulator's request log
(``GET /_emulator/requests``), by endpoint; also the parts of each window: the fork's wait in
``forking`` (from the fork's answer to the status read that found it running, log times), the
fresh lease's acquire and sync. The template is deleted at the end
(``environmentDeleteTemplate``). Prints the medians, every round, the ratio fork/fresh and the
request counts, and writes bench/results/template_acquire.json (``-pace-<ms>`` appended when
``--pace-ms`` is given, ``-<filesystem>`` with ``--tmpdir``).

On the emulator a fork copies the template's trees (``cp -a``) and the baseline extracts an
archive: both create every file of the tree once, on the filesystem of the temp folder.
``--tmpdir /dev/shm`` puts the tree, the sync's temp files and the emulator's sandboxes on tmpfs,
which takes the disk's file creation cost (large and unsteady on a shared VM) out of both.

    .venv/bin/python bench/template_acquire.py [--rounds 5] [--files 2000] [--mib 50]
        [--dirs 300] [--links 40] [--pace-ms 0] [--tmpdir /dev/shm] [--no-save]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Final

import anyio
from _common import MIB, emulator_process, environment_call, save_result

from devtools.emulator_process import EmulatorProcess
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL, ENV_INTERVAL_MS
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService

WS: Final = "/paperclip-workspace"
MODES: Final = ("fork", "fresh")
SEED: Final = 16
BIG_SHARE: Final = 0.6  # of the bytes, in 1% of the files (a prepared image's large binaries)
# Files, directories, links and bytes under the workspace, the lease's own runtime folder left
# out (GNU find; "." is one of the directories).
COUNT_SCRIPT: Final = (
    f"cd {WS} && find . -path ./.paperclip-runtime -prune -o "
    r"\( -type f -printf 'f %s\n' \) -o \( -type l -printf 'l 0\n' \) "
    r"-o \( -type d -printf 'd 0\n' \) "
    '| awk \'{n[$1]++; s+=$2} END {print n["f"]+0, n["d"]-1, n["l"]+0, s+0}\''
)
_SANDBOX_PATH: Final = re.compile(r"^(/v1/sandboxes)/[^/]+(/processes/[^/]+|/files)?(.*)$")


async def _noop(*_: Any) -> None:
    return None


# --- the tree -------------------------------------------------------------------------------


def make_tree(root: Path, files: int, total: int, dirs: int, links: int) -> dict[str, int]:
    """A seeded tree like a prepared image; answers its counts (as COUNT_SCRIPT prints them)."""
    rng = random.Random(SEED)
    root.mkdir(mode=0o755)
    root.chmod(0o755)  # placement gives the workspace the source root's mode
    folders: list[tuple[Path, int]] = [(root, 0)]
    for n in range(dirs):
        parent, depth = rng.choice([f for f in folders if f[1] < 4])
        folder = parent / f"d{n:03d}"
        folder.mkdir()
        folders.append((folder, depth + 1))
    big = max(1, files // 100)
    weights = [rng.expovariate(1.0) for _ in range(files - big)]
    small_total = total - int(total * BIG_SHARE)
    weight_sum = sum(weights)
    sizes = [int(small_total * w / weight_sum) for w in weights]
    big_total = total - sum(sizes)
    sizes += [big_total // big + (1 if n < big_total % big else 0) for n in range(big)]
    rng.shuffle(sizes)
    written: list[Path] = []
    for n, size in enumerate(sizes):
        folder = rng.choice(folders)[0]
        path = folder / f"f{n:04d}.{rng.choice(('py', 'js', 'so', 'json', 'txt', 'bin'))}"
        path.write_bytes(rng.randbytes(size))
        if rng.random() < 0.1:
            path.chmod(0o755)
        written.append(path)
    for n in range(links):
        link = rng.choice(folders)[0] / f"l{n:03d}"
        target = rng.choice(written) if n % 4 else rng.choice(folders[1:])[0]
        link.symlink_to(os.path.relpath(target, link.parent))
    return {"files": files, "dirs": dirs, "links": links, "bytes": sum(sizes)}


def filesystem_of(path: Path) -> str:
    """The type of the filesystem that holds ``path`` (``ext4``, ``tmpfs``), from the mounts."""
    real, best, kind = str(path.resolve()), "", "?"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def sync_operation(tree: Path) -> dict[str, Any]:
    return {
        "operationId": "image",
        "files": [{"sourcePath": str(tree), "targetPath": WS, "kind": "directory"}],
    }


# --- request log ----------------------------------------------------------------------------


def endpoint(entry: dict[str, Any]) -> str:
    """``METHOD /v1/sandboxes/{id}/...`` with the ids (and file paths) folded."""
    path = str(entry["path"])
    match = _SANDBOX_PATH.match(path)
    if match:
        sub = match.group(2) or ""
        if sub.startswith("/processes/"):
            sub = "/processes/{pid}"
        path = f"{match.group(1)}/{{id}}{sub}{'' if sub == '/files' else match.group(3)}"
    return f"{entry['method']} {path}"


def forking_seconds(log: list[dict[str, Any]]) -> float | None:
    """From the fork's answer to the status read that found the fork running (the emulator's
    copy of the template's trees and the boot, to the driver's 250 ms polling)."""
    fork = next((e for e in log if endpoint(e) == "POST /v1/sandboxes/{id}/fork"), None)
    reads = [e for e in log if endpoint(e) == "GET /v1/sandboxes/{id}"]
    if fork is None or not reads:
        return None
    return float(reads[-1]["time"]) - float(fork["time"])


async def last_seq(emu: EmulatorProcess) -> int:
    log = await emu.admin.requests()
    return int(log[-1]["seq"]) if log else 0


async def requests_since(emu: EmulatorProcess, seq: int) -> list[dict[str, Any]]:
    return await emu.admin.requests(since=seq)


# --- the bench ------------------------------------------------------------------------------


class Bench:
    def __init__(
        self, service: DriverService, emu: EmulatorProcess, tree: Path, interval: float
    ) -> None:
        self.service = service
        self.emu = emu
        self.tree = tree
        self.interval = interval
        self.common = environment_call(emu.base_url)
        self.leases: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (call, lease) alive

    def call(self, snapshot: str | None = None) -> dict[str, Any]:
        config = dict(self.common["config"])
        if snapshot is not None:
            config["snapshot"] = snapshot
        return {**self.common, "config": config}

    async def settle(self) -> None:
        """Dirty pages written back and a full bucket: each timed run starts the same way."""
        await anyio.to_thread.run_sync(os.sync)
        await anyio.sleep(CAPACITY * self.interval + 0.05)

    async def acquire(self, call: dict[str, Any], run_id: str) -> dict[str, Any]:
        lease: dict[str, Any] = await self.service.acquire({**call, "runId": run_id})
        self.leases.append((call, lease))
        return lease

    async def destroy(self, call: dict[str, Any], lease: dict[str, Any]) -> None:
        self.leases.remove((call, lease))
        await self.service.destroy(
            {
                **call,
                "providerLeaseId": lease["providerLeaseId"],
                "leaseMetadata": lease["metadata"],
            }
        )

    async def sync_in(self, call: dict[str, Any], lease: dict[str, Any]) -> None:
        await self.service.sync_in(
            {
                **call,
                "lease": {**lease, "expiresAt": None},
                "operations": [sync_operation(self.tree)],
            }
        )

    async def count(self, call: dict[str, Any], lease: dict[str, Any]) -> dict[str, int]:
        answer = await self.service.execute(
            {
                **call,
                "lease": {**lease, "expiresAt": None},
                "command": "/bin/bash",
                "args": ["-c", COUNT_SCRIPT],
            }
        )
        if answer.get("exitCode") != 0:
            raise RuntimeError(f"the count command failed: {answer}")
        files, dirs, links, size = (int(v) for v in str(answer["stdout"]).split())
        return {"files": files, "dirs": dirs, "links": links, "bytes": size}

    # -- the template --------------------------------------------------------------------

    async def make_template(self) -> tuple[dict[str, Any], dict[str, float]]:
        """Setup session, the tree synced in, captured: the capture answer and step times."""
        steps: dict[str, float] = {}
        call = self.call()
        started = time.perf_counter()
        session = await self.service.start_setup(
            {
                **call,
                "sessionId": str(uuid.uuid4()),
                "connectionExpiresInMinutes": 15,
            }
        )
        steps["start_setup_s"] = time.perf_counter() - started
        sandbox_id = session["providerLeaseId"]
        setup = {**call, "providerLeaseId": sandbox_id, "setupMetadata": session["metadata"]}
        try:
            # What a lease of this call would carry: the sync's ownership check reads these.
            lease = {
                "providerLeaseId": sandbox_id,
                "metadata": {
                    "provider": "createos",
                    "companyId": call["companyId"],
                    "environmentId": call["environmentId"],
                    "apiUrl": self.emu.base_url,
                },
            }
            started = time.perf_counter()
            await self.sync_in(call, lease)
            steps["setup_sync_s"] = time.perf_counter() - started
            started = time.perf_counter()
            captured = await self.service.capture_template(
                {**setup, "templateLabel": "bench-template-acquire", "timeoutMs": 600_000}
            )
            steps["capture_s"] = time.perf_counter() - started
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.service.cancel_setup({**setup, "reason": "failed"})
            raise
        await self.service.cancel_setup({**setup, "reason": "promoted"})  # keeps the template
        return captured, steps

    async def delete_template(self, captured: dict[str, Any]) -> None:
        await self.service.delete_template(
            {
                **self.call(),
                "templateRef": captured["templateRef"],
                "templateKind": captured["templateKind"],
                "metadata": captured["metadata"],
                "reason": "bench done",
            }
        )

    # -- one timed run -------------------------------------------------------------------

    async def run_mode(
        self, mode: str, ref: str, run_id: str, verify: dict[str, int] | None
    ) -> tuple[float, float, list[dict[str, Any]]]:
        """The timed window, the acquire's share of it, and the window's requests."""
        call = self.call(ref if mode == "fork" else None)
        await self.settle()
        seq = await last_seq(self.emu)
        started = time.perf_counter()
        lease = await self.acquire(call, run_id)
        acquired = time.perf_counter() - started
        if mode == "fresh":
            await self.sync_in(call, lease)
        seconds = time.perf_counter() - started
        log = await requests_since(self.emu, seq)
        try:
            if verify is not None:
                found = await self.count(call, lease)
                if found != verify:
                    raise RuntimeError(f"{mode}: the lease holds {found}, the host tree {verify}")
                print(f"  {mode}: tree checked in the lease ({found})", flush=True)
        finally:
            await self.destroy(call, lease)
        return seconds, acquired, log

    async def cleanup(self) -> None:
        for call, lease in list(self.leases):
            try:
                await self.destroy(call, lease)
            except Exception as exc:  # report it and go on with the rest
                print(f"cleanup: lease {lease.get('providerLeaseId')} not destroyed: {exc}")


class Figures:
    """Every timed run: wall time, its parts, its requests (by endpoint)."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        self.requests: dict[str, list[int]] = {mode: [] for mode in MODES}
        self.endpoints: dict[str, list[dict[str, int]]] = {mode: [] for mode in MODES}
        # fork: its wait in "forking" (log times); fresh: the acquire and the sync in its window
        self.parts: dict[str, list[float]] = {"forking": [], "acquire": [], "sync": []}

    def add(self, mode: str, took: float, acquired: float, log: list[dict[str, Any]]) -> str:
        self.seconds[mode].append(took)
        self.requests[mode].append(len(log))
        self.endpoints[mode].append(dict(sorted(Counter(endpoint(e) for e in log).items())))
        if mode == "fork":
            forking = forking_seconds(log) or 0.0
            self.parts["forking"].append(forking)
            return f"forking {forking:.2f} s"
        self.parts["acquire"].append(acquired)
        self.parts["sync"].append(took - acquired)
        return f"acquire {acquired:.2f} s + sync {took - acquired:.2f} s"

    def summary(self) -> dict[str, Any]:
        medians = {mode: statistics.median(values) for mode, values in self.seconds.items()}
        pairs = zip(self.seconds["fork"], self.seconds["fresh"], strict=True)
        return {
            "median_s": {mode: round(v, 3) for mode, v in medians.items()},
            "rounds_s": {m: [round(v, 3) for v in values] for m, values in self.seconds.items()},
            "parts_median_s": {k: round(statistics.median(v), 3) for k, v in self.parts.items()},
            "parts_rounds_s": {k: [round(x, 3) for x in v] for k, v in self.parts.items()},
            "requests": {m: statistics.median(values) for m, values in self.requests.items()},
            "requests_rounds": self.requests,
            "requests_by_endpoint": {m: values[0] for m, values in self.endpoints.items()},
            "fork_over_fresh": round(medians["fork"] / medians["fresh"], 3),
            "ratio_rounds": [round(f / b, 3) for f, b in pairs],
        }


async def run(
    rounds: int, files: int, mib: int, dirs: int, links: int, interval: float
) -> dict[str, Any]:
    figures = Figures()
    async with emulator_process() as emu:
        with tempfile.TemporaryDirectory(prefix="bench-template-acquire-") as tmp:
            tree = Path(tmp) / "image"
            started = time.perf_counter()
            counts = make_tree(tree, files, mib * MIB, dirs, links)
            print(
                f"tree: {counts['files']} files, {counts['dirs']} directories, "
                f"{counts['links']} links, {counts['bytes'] / MIB:.1f} MiB "
                f"(written in {time.perf_counter() - started:.1f} s)",
                flush=True,
            )
            journal = LeaseJournal(Path(tmp) / "state" / "leases.sqlite3")
            runtime = DriverRuntime(environ={}, journal=journal)
            service = DriverService(runtime, notify=_noop, log=_noop)
            bench = Bench(service, emu, tree, interval)
            async with runtime.background.running():
                await bench.settle()
                captured, setup_steps = await bench.make_template()
                ref = str(captured["templateRef"])
                print(
                    "template: setup start {start_setup_s:.2f} s, sync in {setup_sync_s:.2f} s, "
                    "capture {capture_s:.2f} s".format(**setup_steps),
                    flush=True,
                )
                try:
                    for n in range(rounds):
                        for mode in MODES if n % 2 == 0 else MODES[::-1]:
                            verify = counts if n == 0 else None
                            took, acquired, log = await bench.run_mode(
                                mode, ref, f"bench-{n}-{mode}", verify
                            )
                            part = figures.add(mode, took, acquired, log)
                            print(
                                f"round {n} {mode:5} {took:6.2f} s ({part}), {len(log)} requests",
                                flush=True,
                            )
                finally:
                    with anyio.CancelScope(shield=True):
                        await bench.cleanup()
                        await bench.delete_template(captured)
                        await service.shutdown()
                leftovers = [
                    s
                    for s in (await emu.admin.state())["sandboxes"]
                    if s["status"] not in ("destroyed", "destroying")
                ]
    return {
        "rounds": rounds,
        "pace_interval_ms": round(interval * 1000, 1),
        "tmp_dir": tempfile.gettempdir(),
        "tmp_fs": filesystem_of(Path(tempfile.gettempdir())),
        "tree": counts,
        "setup_s": {k: round(v, 3) for k, v in setup_steps.items()},
        **figures.summary(),
        "leftover_sandboxes": [s["id"] for s in leftovers],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=50, help="total bytes of the files, in MiB")
    parser.add_argument("--dirs", type=int, default=300)
    parser.add_argument("--links", type=int, default=40)
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=None,
        help="the driver's refill interval (PAPERCLIP_CREATEOS_PACE_MS); default: that variable "
        f"or the worker's own ({DEFAULT_INTERVAL * 1000:g} ms); 0 turns pacing off",
    )
    parser.add_argument(
        "--tmpdir",
        type=Path,
        default=None,
        help="where the host tree, the sync's temp files and the emulator's sandboxes live "
        "(default: the system temp folder); e.g. /dev/shm to take the disk's file creation "
        "out of both modes; the results file gets -<filesystem> appended",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args()
    if args.files < 100 or args.dirs < 1 or args.links < 0 or args.rounds < 1:
        parser.error("needs at least 100 files, 1 directory and 1 round")
    if args.pace_ms is not None:
        os.environ[ENV_INTERVAL_MS] = f"{args.pace_ms:g}"  # read when the pacer is made
    if args.tmpdir is not None:
        tempfile.tempdir = str(args.tmpdir.resolve())  # this process (tree, sync, emulator data)
        os.environ["TMPDIR"] = tempfile.tempdir  # and the emulator's own
    raw = os.environ.get(ENV_INTERVAL_MS, "").strip()
    interval = max(float(raw), 0.0) / 1000 if raw else DEFAULT_INTERVAL
    result = anyio.run(run, args.rounds, args.files, args.mib, args.dirs, args.links, interval)
    pacing = f"pacing {result['pace_interval_ms']:g} ms" if interval else "pacing off"
    print(
        f"template_acquire: median of {args.rounds} round(s), {pacing}, "
        f"temp folder on {result['tmp_fs']}"
    )
    labels = {"fork": "fork (acquire)", "fresh": "fresh (acquire + sync in)"}
    for mode in MODES:
        print(
            f"  {labels[mode]:26} {result['median_s'][mode]:6.2f} s  "
            f"{result['requests'][mode]:g} requests  (rounds {result['rounds_s'][mode]})"
        )
        names = ("forking",) if mode == "fork" else ("acquire", "sync")
        shares = ", ".join(f"{k} {result['parts_median_s'][k]:.2f} s" for k in names)
        print(f"    of which {shares}")
        breakdown = ", ".join(f"{k} {v}" for k, v in result["requests_by_endpoint"][mode].items())
        print(f"    round 0 requests: {breakdown}")
    print(f"ratio fork / fresh: {result['fork_over_fresh']} (rounds {result['ratio_rounds']})")
    if result["leftover_sandboxes"]:
        print(f"LEFT BEHIND: {result['leftover_sandboxes']}")
    if not args.no_save:
        suffix = "" if args.pace_ms is None else f"-pace-{args.pace_ms:g}"
        suffix += "" if args.tmpdir is None else f"-{result['tmp_fs']}"
        print(f"written to {save_result('template_acquire' + suffix, result)}")


if __name__ == "__main__":
    main()
