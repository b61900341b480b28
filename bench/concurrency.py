"""Capacity: N agents heartbeating at once on one Paperclip server and one ``createos`` environment.

One full Paperclip server, one emulator with CreateOS's 300-requests-per-minute limit on, one
``createos`` environment (default settings, default pacing, the file bridge) and the stub agent
of ``tests/e2e/agent-image`` (devtools/agent_heartbeat.py), as in ``bench/heartbeat.py``.
Runs, each starting on a full request bucket (the bench waits ``capacity x interval`` first):

- ``at-once-N``, for each N of ``--agents``: N agents invoke one heartbeat each at the same time;
- ``back-to-back-4``: 4 agents each invoke a heartbeat again as soon as their last one ended, for
  ``--duration`` seconds; a heartbeat still running at the end is waited for (its requests
  count) but not counted as completed in the window.

Per run: completed (succeeded) heartbeats, completed heartbeats per minute, each heartbeat's wall
time (invoke to final status; median, max) and status, API requests per heartbeat (the emulator's
log from the run's start to the release of every lease), the busiest 60 s window of request
starts in that log (must stay <= 280, the pacer's bound: a FAIL line otherwise) and whether the
emulator answered any 429, and how many commands were the host's bridge polls and log-tail ticks
(from the emulator's exec and process histories). The baseline is one lone heartbeat of the same
stub agent on the host's local environment: each run's median wall time is also printed as a
ratio to it. At the end the emulator must hold no sandbox, no live process tree and no orphaned
host process (checked after the server stopped). Writes bench/results/concurrency.json; exit
status 1 on a FAIL.

    .venv/bin/python bench/concurrency.py [--agents 1,2,4,8] [--duration 180]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from _agents import agent_stage
from _common import save_result
from _timeline import count_kinds

from devtools.agent_heartbeat import AgentSite
from devtools.e2e_server import REPO_ROOT
from devtools.emulator_process import EmulatorProcess
from devtools.windows import max_in_window
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL

BACK_TO_BACK_AGENTS: Final = 4
WINDOW_BOUND: Final = 280  # the pacer's 40 + 4/s over 60 s, under CreateOS's 300
HEARTBEAT_TIMEOUT_S: Final = 600.0
RELEASE_TIMEOUT_S: Final = 180.0


@dataclass
class Beat:
    agent: int
    status: str
    wall_s: float
    ended: float  # monotonic
    late: bool = False  # back to back: ended after the window (its requests still count)


@dataclass
class Run:
    name: str
    agents: int
    beats: list[Beat]
    started: float  # monotonic, after the wait for a full bucket
    span_s: float  # counted window: the last final status (at once) or --duration (back to back)
    requests: list[dict[str, Any]]
    commands: dict[str, int]  # the commands the emulator ran, by kind (bench/_timeline.py)

    @property
    def completed(self) -> list[Beat]:
        return [b for b in self.beats if b.status == "succeeded" and not b.late]

    def as_dict(self, local_wall_s: float) -> dict[str, Any]:
        walls = [b.wall_s for b in self.beats]
        statuses: dict[str, int] = {}
        for b in self.beats:
            statuses[b.status] = statuses.get(b.status, 0) + 1
        median = statistics.median(walls) if walls else 0.0
        return {
            "run": self.name,
            "agents": self.agents,
            "heartbeats": len(self.beats),
            "completed": len(self.completed),
            "completed_per_minute": round(len(self.completed) * 60 / self.span_s, 2),
            "window_s": round(self.span_s, 1),
            "wall_s_median": round(median, 2),
            "wall_s_max": round(max(walls, default=0.0), 2),
            "ratio_to_local": round(median / local_wall_s, 1) if local_wall_s else None,
            "statuses": statuses,
            "ended_after_window": sum(b.late for b in self.beats),
            "requests": len(self.requests),
            "requests_per_heartbeat": round(len(self.requests) / max(1, len(self.beats)), 1),
            "busiest_60s_window": max_in_window([r["time"] for r in self.requests], 60.0),
            "answered_429": sum(1 for r in self.requests if r["status"] == 429),
            "bridge_polls": self.commands.get("bridge_poll", 0),
            "log_tails": self.commands.get("log_tail", 0),
            "beats": [
                {"agent": b.agent, "status": b.status, "wall_s": round(b.wall_s, 2), "late": b.late}
                for b in self.beats
            ],
        }


class Runner:
    """The runs: the company's agents on its one createos environment, on one emulator."""

    def __init__(self, site: AgentSite, emu: EmulatorProcess, env_id: str, agents: list[str]):
        self.site = site
        self.emu = emu
        self.env_id = env_id
        self.agents = agents

    async def beat(self, index: int, agent_id: str) -> Beat:
        run = await self.site.heartbeat(agent_id, timeout_s=HEARTBEAT_TIMEOUT_S)
        return Beat(index, run.status, run.wall_s, time.monotonic())

    async def at_once(self, count: int) -> Run:
        beats: list[Beat] = []

        async def one(index: int) -> None:
            beats.append(await self.beat(index, self.agents[index]))

        async def body(_: float) -> None:
            async with anyio.create_task_group() as tg:
                for index in range(count):
                    tg.start_soon(one, index)

        return await self._measure(f"at-once-{count}", count, beats, body, None)

    async def back_to_back(self, count: int, duration_s: float) -> Run:
        beats: list[Beat] = []

        async def loop(index: int, deadline: float) -> None:
            while time.monotonic() < deadline:
                beats.append(await self.beat(index, self.agents[index]))

        async def body(started: float) -> None:
            async with anyio.create_task_group() as tg:
                for index in range(count):
                    tg.start_soon(loop, index, started + duration_s)

        run = await self._measure(f"back-to-back-{count}", count, beats, body, duration_s)
        for b in run.beats:
            b.late = b.ended > run.started + duration_s
        return run

    async def _measure(
        self,
        name: str,
        count: int,
        beats: list[Beat],
        body: Callable[[float], Awaitable[None]],
        window_s: float | None,
    ) -> Run:
        await anyio.sleep(CAPACITY * DEFAULT_INTERVAL + 0.05)  # every run starts on a full bucket
        seen = max([0, *(r["seq"] for r in await self.emu.admin.requests())])
        history_seen = len(await self.emu.admin.process_history())
        execs_seen = len(await self.emu.admin.exec_history())
        started = time.monotonic()
        await body(started)
        span = window_s if window_s is not None else time.monotonic() - started
        await self.site.wait_released(self.env_id, timeout_s=RELEASE_TIMEOUT_S)
        requests = await self.emu.admin.requests(since=seen)
        kinds = count_kinds(
            (await self.emu.admin.process_history())[history_seen:],
            (await self.emu.admin.exec_history())[execs_seen:],
        )
        beats.sort(key=lambda b: (b.agent, b.ended))
        return Run(name, count, beats, started, span, requests, dict(kinds))


async def run(counts: list[int], duration_s: float) -> dict[str, Any]:
    runs: list[Run] = []
    async with agent_stage("bench-concurrency-", "Concurrency Co") as stage:
        await stage.emu.admin.settings(rate_limit=True)  # CreateOS's 300 per minute
        await stage.server.cli("plugin", "install", str(REPO_ROOT), "--json")
        env_id = await stage.environment("shared")
        local = await stage.local_agent("local")
        lone = await stage.site.heartbeat(local, timeout_s=HEARTBEAT_TIMEOUT_S)
        print(f"local baseline: {lone.status} in {lone.wall_s:.2f} s", flush=True)
        agents = [
            await stage.sandbox_agent(f"agent-{n}", env_id)
            for n in range(max([*counts, BACK_TO_BACK_AGENTS]))
        ]
        runner = Runner(stage.site, stage.emu, env_id, agents)
        for count in counts:
            runs.append(await runner.at_once(count))
            print(json.dumps(runs[-1].as_dict(lone.wall_s)), flush=True)
        runs.append(await runner.back_to_back(BACK_TO_BACK_AGENTS, duration_s))
        print(json.dumps(runs[-1].as_dict(lone.wall_s)), flush=True)
        starts = [r["time"] for r in await stage.emu.admin.requests()]
    return {
        "settings": {"agents": counts, "duration_s": duration_s, "bridge": "file"},
        "local_wall_s": round(lone.wall_s, 2),
        "local_status": lone.status,
        "runs": [r.as_dict(lone.wall_s) for r in runs],
        "busiest_60s_window": max_in_window(starts, 60.0),
        "left_in_emulator": stage.left,
    }


def failures(result: dict[str, Any]) -> list[str]:
    found = []
    if result["local_status"] != "succeeded":
        found.append(f"the local baseline heartbeat ended {result['local_status']}")
    for r in result["runs"]:
        if r["busiest_60s_window"] > WINDOW_BOUND:
            found.append(
                f"{r['run']}: {r['busiest_60s_window']} request starts in one 60 s window "
                f"(bound {WINDOW_BOUND})"
            )
        if r["answered_429"]:
            found.append(f"{r['run']}: the emulator answered 429 {r['answered_429']} times")
        bad = {s: n for s, n in r["statuses"].items() if s != "succeeded"}
        if bad:
            found.append(f"{r['run']}: heartbeats did not succeed: {bad}")
    if result["left_in_emulator"]:
        found.append(f"left in the emulator: {', '.join(result['left_in_emulator'])}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="1,2,4,8", help="comma-separated agent counts")
    parser.add_argument("--duration", type=float, default=180.0, help="back-to-back seconds")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.agents.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--agents must be comma-separated whole numbers, got {args.agents!r}")
    if not counts or min(counts) < 1:
        parser.error(f"--agents needs counts of at least 1, got {args.agents!r}")
    if args.duration <= 0:
        parser.error(f"--duration must be positive, got {args.duration}")
    started = time.monotonic()
    result = anyio.run(run, counts, args.duration)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(f"local baseline (one lone heartbeat): {result['local_wall_s']} s")
    for r in result["runs"]:
        print(
            f"{r['run']:15} {r['completed']}/{r['heartbeats']} completed, "
            f"{r['completed_per_minute']}/min, wall median {r['wall_s_median']} s "
            f"(x{r['ratio_to_local']} local) max {r['wall_s_max']} s, "
            f"{r['requests_per_heartbeat']} requests/heartbeat, "
            f"busiest 60 s {r['busiest_60s_window']}, 429s {r['answered_429']}"
        )
    print(f"busiest 60 s window over the whole bench: {result['busiest_60s_window']}")
    print(f"left in the emulator: {', '.join(result['left_in_emulator']) or 'nothing'}")
    found = failures(result)
    result["failures"] = found
    for line in found:
        print(f"FAIL {line}")
    print(f"written to {save_result('concurrency', result)}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
