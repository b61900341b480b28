"""Stream checks: heartbeat spacing on ``connect`` and on the exec stream, and where the exec
stream ends when a background child keeps stdout open (docs/protocol.md C5, C6.3, C9 q. 4).

Each check runs one silent command for ``stream_seconds`` and reads its stream to the end
through :class:`~provider.doctor.wire.Wire`, which times every line. A heartbeat is a
``{"type":"heartbeat"}`` frame on ``connect`` and ``{"hb":true}`` on the exec stream; a ``:``
comment line (SSE keepalive) keeps a connection alive too and is reported as such. Every
command ends by itself, so nothing outlives the check.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Final

from provider.createos.errors import APITimeout
from provider.doctor.report import HEARTBEAT_LIMIT_S, Finding, ok, violated
from provider.doctor.wire import STREAM_READ_S, Line, Wire

CHILD_HOLD_S: Final = 3
"""How long the exec-stream-end check's background child keeps stdout open."""


@dataclass(frozen=True)
class Target:
    """What every check works on: the wire and the doctor's sandbox."""

    wire: Wire
    sandbox_id: str
    stream_seconds: float = 35.0

    @property
    def read_s(self) -> float:
        """A silent command's stream ends with its exit frame after ``stream_seconds``: the
        read waits longer than that, so no heartbeat at all still shows as the gap it is."""
        return max(self.stream_seconds, STREAM_READ_S) + 10.0


def _silent_command(seconds: float) -> list[str]:
    return ["-c", f"sleep {seconds:g}"]


async def connect_heartbeat(target: Target) -> Finding:
    """A managed process that prints nothing; its ``connect`` stream, read to the exit."""
    key = "connect_heartbeat"
    client = target.wire.client
    process = await client.create_process(
        target.sandbox_id, cmd="/bin/bash", args=_silent_command(target.stream_seconds)
    )
    path = f"/sandboxes/{target.sandbox_id}/processes/{process.process_id}/connect"
    lines: list[Line] = []
    try:
        async with target.wire.lines(
            "GET",
            path,
            operation="follow process output",
            params={"after": 0},
            read_s=target.read_s,
        ) as stream:
            async for line in stream:
                lines.append(line)
                if line.frame is not None and line.frame.get("type") == "exit":
                    break
    except APITimeout:
        return violated(key, f"no byte for {target.read_s:.0f} s on a silent process")
    beats = [line for line in lines if line.frame and line.frame.get("type") == "heartbeat"]
    return _spacing(key, lines, beats, target.stream_seconds)


async def exec_heartbeat(target: Target) -> Finding:
    """A silent command on ``POST /exec?stream=true``, read to its end."""
    key = "exec_heartbeat"
    try:
        lines = await _exec_stream(target, _silent_command(target.stream_seconds))
    except APITimeout:
        return violated(key, f"no byte for {target.read_s:.0f} s on a silent command")
    beats = [line for line in lines if line.frame is not None and line.frame.get("hb") is True]
    return _spacing(key, lines, beats, target.stream_seconds)


async def exec_stream_end(target: Target) -> Finding:
    """The leader prints and exits at once; a background child holds stdout for
    :data:`CHILD_HOLD_S` and then prints. Its line on the stream means the stream waited for
    stdio EOF; an exit frame without it means the stream ended at the leader's exit. Both are
    handled by the worker (docs/protocol.md 3.9); a stream without an exit frame is not."""
    key = "exec_stream_end"
    script = f"(sleep {CHILD_HOLD_S}; echo child-done) & echo leader-done"
    lines = await _exec_stream(target, ["-c", script])
    stdout = "".join(str(line.frame.get("stdout", "")) for line in lines if line.frame is not None)
    exits = [line for line in lines if line.frame is not None and "exit_code" in line.frame]
    if not exits:
        return violated(key, "the stream ended without an exit_code frame")
    code = exits[-1].frame.get("exit_code") if exits[-1].frame else None
    if "child-done" in stdout:
        return ok(
            key,
            f"at stdio EOF: the exit frame (exit_code {code}) came after the background "
            f"child's output, {exits[-1].at:.1f} s after the start",
        )
    return ok(
        key,
        f"at the leader's exit: exit_code {code} after {exits[-1].at:.1f} s, while the "
        f"background child still held stdout",
    )


async def _exec_stream(target: Target, args: Sequence[str]) -> list[Line]:
    body = {"cmd": "/bin/bash", "args": list(args), "stream": True}
    lines: list[Line] = []
    async with target.wire.lines(
        "POST",
        f"/sandboxes/{target.sandbox_id}/exec",
        operation="run command (stream)",
        json_body=body,
        params={"stream": "true"},
        read_s=target.read_s,
    ) as stream:
        async for line in stream:
            lines.append(line)
    return lines


def _spacing(key: str, lines: Sequence[Line], beats: Sequence[Line], seconds: float) -> Finding:
    """ok when heartbeats (or keepalive comments) came and no silence exceeded the limit."""
    times = [0.0] + [line.at for line in lines]
    longest = max(b - a for a, b in itertools.pairwise(times)) if lines else 0.0
    comments = sum(1 for line in lines if line.framing == "comment")
    framing = sorted({line.framing for line in lines} - {"ndjson"})
    extra = f"; framing seen: {', '.join(framing)}" if framing else ""
    if not beats and not comments:
        return violated(
            key,
            f"no heartbeat during a silent {seconds:g} s command (longest silence "
            f"{longest:.1f} s){extra}",
        )
    beat_times = [0.0] + [line.at for line in beats]
    every = median(b - a for a, b in itertools.pairwise(beat_times)) if beats else 0
    summary = (
        f"{len(beats)} heartbeats and {comments} comment lines in a silent {seconds:g} s "
        f"command, about every {every:.1f} s; longest silence {longest:.1f} s{extra}"
    )
    if longest > HEARTBEAT_LIMIT_S:
        return violated(key, summary)
    return ok(key, summary)
