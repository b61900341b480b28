"""Shared pieces of the benchmarks: the emulator as a subprocess, /proc figures of a process, and
config helpers. The Python host stand-in is :class:`provider.devtools.stdio_host.StdioHost`.

Not a test helper: nothing here asserts; the scripts print what they measure.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

from provider.devtools.host_peer import REPO_ROOT
from provider.emulator import EmulatorAdmin
from provider.rpc.stdio import LineReader

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


@dataclass(frozen=True)
class RunningEmulator:
    base_url: str
    admin: EmulatorAdmin
    pid: int


@asynccontextmanager
async def emulator_process() -> AsyncIterator[RunningEmulator]:
    """``python -m provider.emulator`` on an ephemeral port, stopped with SIGTERM afterwards."""
    token = secrets.token_urlsafe(16)
    process = await anyio.open_process(
        [
            PYTHON,
            "-m",
            "provider.emulator",
            "--quiet",
            "--api-key",
            API_KEY,
            "--admin-token",
            token,
        ],
        stdout=subprocess.PIPE,
        stderr=None,
        cwd=REPO_ROOT,
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            base_url = (await LineReader(process.stdout).receive_line()).decode().strip()
        yield RunningEmulator(base_url, EmulatorAdmin(base_url, token), process.pid)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(30):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


def environment_call(base_url: str, *, timeout_ms: int = 600_000) -> dict[str, Any]:
    """The common params of every driver call against ``base_url``."""
    return {
        "driverKey": "createos",
        "companyId": "bench-company",
        "environmentId": "bench-env",
        "config": {
            "apiUrl": base_url,
            "apiKey": API_KEY,
            "shape": SHAPE,
            "timeoutMs": timeout_ms,
            "reuseLease": False,
        },
    }
