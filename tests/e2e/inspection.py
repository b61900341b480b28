"""Process and log inspection for the e2e smoke: plugin workers, leaks, pino log lines."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devtools.e2e_server import descendants
from devtools.emulator_process import EmulatorProcess
from devtools.procfs import cmdline, pid_alive


def plugin_worker_pids(server_pid: int, entrypoint: Path) -> list[int]:
    """Shim processes under the server that run ``entrypoint``, with their Python children."""
    found: list[int] = []
    for pid in descendants(server_pid):
        if str(entrypoint) in cmdline(pid):
            found.append(pid)
            found.extend(descendants(pid))
    return found


async def assert_emulator_empty(emu: EmulatorProcess, what: str) -> None:
    """Nothing of the scenario (``what``) is left in the emulator: no sandbox, no live process
    tree, no orphaned host process."""
    state = await emu.admin.state()
    assert state["sandboxes"] == [], f"a sandbox outlived the {what}"
    assert not [p for p in state["processes"] if p["tree_alive"]], f"a process outlived the {what}"
    assert state["orphan_host_pids"] == []


def cmdline_mentions(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a leak check for a temp folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not pid_alive(int(entry.name)):
            continue
        if any(text in part for part in cmdline(int(entry.name))):
            found.append(int(entry.name))
    return found


def json_lines(text: str, needle: str) -> list[Mapping[str, Any]]:
    """The JSON objects trailing log lines that contain ``needle`` (pino pretty format)."""
    found: list[Mapping[str, Any]] = []
    for line in text.splitlines():
        if needle in line and "{" in line:
            try:
                value = json.loads(line[line.index("{") :])
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
    return found
