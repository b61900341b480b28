"""Shared pieces of the benchmarks: the emulator as a subprocess, /proc figures of a process, and
config helpers. The Python host stand-in is :class:`devtools.stdio_host.StdioHost`.

Not a test helper: nothing here asserts; the scripts print what they measure.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from devtools import call_params
from devtools.emulator_process import EmulatorProcess
from devtools.host_peer import REPO_ROOT, HostPeer

PYTHON: Final = str(REPO_ROOT / ".venv" / "bin" / "python")
API_KEY: Final = "bench-key"
SHAPE: Final = "s-1vcpu-1gb"
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
MIB: Final = 1024 * 1024
GIB: Final = 1024 * MIB
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


# --- /proc figures --------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its own threads, not its children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat


def descendants_cpu_seconds(root: int) -> float:
    """CPU time of every live descendant of ``root`` plus the children each one has reaped
    (utime, stime, cutime, cstime): for the emulator, its sandboxes' processes."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS
    total = 0.0
    for pid in times:
        ancestor = parents.get(pid, 0)
        while ancestor > 1 and ancestor != root:
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            total += times[pid]
    return total


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` line of /proc/<pid>/status (``VmHWM``, ``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def peak_rss_mib(pid: int) -> float:
    return status_kib(pid, "VmHWM") / 1024


def save_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# --- the emulator in its own process --------------------------------------------------------


@asynccontextmanager
async def emulator_process() -> AsyncIterator[EmulatorProcess]:
    """``python -m provider.emulator`` on an ephemeral port in a temp folder, stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-emulator-") as tmp:
        root = Path(tmp)
        root.chmod(0o711)  # the sandboxes' unprivileged uid must reach the data folder
        async with EmulatorProcess(root / "data", API_KEY) as emu:
            yield emu


def environment_call(base_url: str, *, timeout_ms: int = 600_000) -> dict[str, Any]:
    """The common params of every driver call against ``base_url``."""
    return call_params.environment_call(
        base_url,
        API_KEY,
        company_id="bench-company",
        environment_id="bench-env",
        timeout_ms=timeout_ms,
        shape=SHAPE,
    )


# --- worker starts under the real manager ------------------------------------------------------


async def start_and_stop(peer: HostPeer, plugin_id: str, **where: Any) -> tuple[float, float]:
    """Start a worker (``where``: ``package_root`` or ``entrypoint_path``), answer one
    ``health``, stop it; the start's and the first call's milliseconds."""
    info = await peer.start_worker(plugin_id, first_call=("health", {}), **where)
    await peer.stop_worker(plugin_id)
    assert info.first_call_ms is not None
    return info.start_ms, info.first_call_ms


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 1)
