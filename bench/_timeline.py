"""Where a heartbeat's time goes: the worker's calls (its call log) against the commands the
emulator ran (``GET /_emulator/exec-history`` and ``/process-history``), for the agent benches.

:func:`classify` names a command from the host's scripts (docs/protocol.md A3): a bridge poll, a
log-tail tick, a duplex channel or anything else; a streamed exec is the worker's bash wrapper,
whose text holds the command, so it is classified from the same words. :func:`timeline` lays
one heartbeat out call by call: when each call started (from the invoke), how long the worker
took, how long its commands ran in the sandbox (spawn to the leader's exit) and what they were,
and the gaps where no call was in flight (the host's own time).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Final

KINDS: Final = ("bridge_poll", "log_tail", "duplex_channel", "other")
_WRAPPED: Final = re.compile(r"pc_held; exec env (.*?); \}", re.DOTALL)


def command_text(entry: dict[str, Any]) -> str:
    """The command of a process or exec entry, with a streamed command's wrapper taken off."""
    text = " ".join([str(entry.get("cmd", "")), *map(str, entry.get("args") or [])])
    found = _WRAPPED.search(text)
    return found.group(1) if found else text


def classify(entry: dict[str, Any], *, managed: bool) -> str:
    """What a command the emulator ran was, from the host's scripts (docs/protocol.md A3)."""
    text = command_text(entry)
    if "tail -c +" in text:
        return "log_tail"
    if "paperclip-bridge/queue" in text or "/queue/requests" in text:
        return "bridge_poll"
    args = entry.get("args") or []
    if managed and args[:1] == ["-c"] and "paperclip-bridge-server.mjs" in text:
        return "duplex_channel"  # channels run under bash -c; commands under bash -lc
    return "other"


def count_kinds(processes: list[dict[str, Any]], execs: list[dict[str, Any]]) -> Counter[str]:
    """Commands by kind, from managed processes and execs together."""
    kinds = Counter(classify(p, managed=True) for p in processes)
    kinds.update(classify(e, managed=False) for e in execs)
    return kinds


def timeline(
    start: float, calls: list[dict[str, Any]], execs: list[dict[str, Any]]
) -> dict[str, Any]:
    """One heartbeat from ``start`` (Unix seconds): each call with the execs it made, in ms."""
    rows: list[dict[str, Any]] = []
    busy_until = start
    gaps = 0.0
    for call in sorted(calls, key=lambda c: c["start"]):
        begin, end = call["start"], call["start"] + call["ms"] / 1000
        gaps += max(0.0, begin - busy_until)
        busy_until = max(busy_until, end)
        inside = [e for e in execs if begin <= e["time"] <= end]
        ran = [(e["exited"] or end) - e["time"] for e in inside]
        rows.append(
            {
                "at_ms": round((begin - start) * 1000),
                "method": call["method"],
                "worker_ms": round(call["ms"], 1),
                "sandbox_ms": round(sum(ran) * 1000, 1),
                "execs": len(inside),
                "commands": [command_text(e)[:100] for e in inside],
            }
        )
    by_method: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = by_method.setdefault(row["method"], {"calls": 0, "worker_ms": 0.0})
        entry["calls"] += 1
        entry["worker_ms"] = round(entry["worker_ms"] + row["worker_ms"], 1)
        entry["sandbox_ms"] = round(entry.get("sandbox_ms", 0.0) + row["sandbox_ms"], 1)
    return {
        "calls": rows,
        "by_method": by_method,
        "host_gaps_ms": round(gaps * 1000, 1),  # no call in flight: the host's own time
        "last_call_end_ms": round((busy_until - start) * 1000, 1),
    }
