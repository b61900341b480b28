"""A real agent heartbeat: the host's local environment vs a ``createos`` sandbox (emulator).

One full Paperclip server (2026.916.1), one emulator, the stub agent CLI of
``tests/e2e/agent-image`` (devtools/agent_heartbeat.py). Each round runs one heartbeat
per variant, interleaved, so every variant meets the same machine load. Each paced heartbeat
starts on a full request bucket (the bench waits ``capacity x interval`` before it, outside the
timed window): the lone heartbeat the pacer's burst is sized for. ``--back-to-back`` starts each
at once instead, on whatever the previous one left (saturated pacing):

- ``local``: the agent on the host's local environment (the baseline);
- ``sandbox``: a createos environment with default pacing and default host settings;
- ``unpaced``: the same with ``PAPERCLIP_CREATEOS_PACE_MS=0`` (the emulator's latency floor);
- ``streamed``: the environment setting ``streamRunLogs: true`` (the host's own default before
  our validation stored ``false``: it tails the run log through a command every 250 ms);
- ``duplex``: ``sandbox`` with the instance's experimental ``enableSandboxDuplexBridge`` on, so
  the agent's API calls travel over one of our duplex channels instead of the file bridge's
  request folder polled through commands (toggled outside the timed window).

The plugin is installed from a temp copy of the package whose entrypoint sets the worker's
environment from a file before starting the real shim (the host scrubs the worker's
environment), so the bench can switch pacing (a worker restart between variants, outside the
timed window) and turn on the worker's call log (``PAPERCLIP_CREATEOS_CALL_LOG``). Per heartbeat:
wall time (invoke to final status), API requests (emulator log, invoke to the lease's release),
``environmentExecute`` calls and their p50/p90 latency, how many were the host's bridge polls and
log-tail ticks (classified from the commands the emulator ran, its exec and process histories:
``bench/_timeline.py``), requests per execute, and the ratio to local, and the agent's bridge
round trip (one ``GET /api/agents/me`` from inside the sandbox, timed by the stub) with the
bridge mode it saw; over the whole run, the busiest 60 s window of request starts the emulator
saw (``busiest_60s_window``, from its request log's timestamps), and what the emulator still
held once the server stopped (``left_in_emulator``, nothing or exit status 1). ``--timeline``
adds each heartbeat's calls one by one: worker time against the sandbox time of the commands
each ran. The stage (server, emulator, company) is ``_agents.py``'s, shared with
``bench/concurrency.py``. Writes bench/results/heartbeat.json.

    .venv/bin/python bench/heartbeat.py [--rounds 2] [--back-to-back]
        [--variants local,sandbox,unpaced,streamed,duplex] [--timeline]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
from _agents import agent_stage
from _common import save_result
from _timeline import count_kinds, timeline

from devtools.agent_heartbeat import AgentSite
from devtools.e2e_server import REPO_ROOT, PaperclipServer
from devtools.emulator_process import EmulatorProcess
from devtools.windows import max_in_window
from provider.createos.pacer import CAPACITY, DEFAULT_INTERVAL

VARIANTS: Final = ("local", "sandbox", "unpaced", "streamed", "duplex")
PACED: Final = ("sandbox", "streamed", "duplex")
PLUGIN_KEY: Final = json.loads((REPO_ROOT / "manifest.json").read_text())["id"]
LIFECYCLE: Final = re.compile(r"^/v1/sandboxes(/sb_[^/]+(/pause|/resume)?)?$")
BENCH_SHIM: Final = """// bench entrypoint: worker environment from worker-env.json, then the shim
import { readFileSync } from "node:fs";
const extra = JSON.parse(readFileSync(new URL("./worker-env.json", import.meta.url), "utf8"));
Object.assign(process.env, extra);
await import(%s);
"""


@dataclass
class Measured:
    variant: str
    round: int
    status: str
    wall_s: float
    requests: int = 0
    execute_requests: int = 0  # requests outside sync calls and sandbox lifecycle calls
    executes: list[float] = field(default_factory=list)  # ms each
    bridge_polls: int = 0
    log_tails: int = 0
    syncs: int = 0
    sync_ms: list[float] = field(default_factory=list)  # each environmentSync* call
    by_endpoint: dict[str, int] = field(default_factory=dict)
    bridge_ms: int | None = None  # the agent's one API call, timed inside the sandbox
    bridge_mode: str | None = None  # PAPERCLIP_API_BRIDGE_MODE as the agent saw it
    duplex_channels: int = 0
    channel_writes: list[float] = field(default_factory=list)  # duplexChannelWrite, ms each
    timeline: dict[str, Any] | None = None  # --timeline: call by call (bench/_timeline.py)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variant": self.variant,
            "round": self.round,
            "status": self.status,
            "wall_s": round(self.wall_s, 2),
            "bridge_ms": self.bridge_ms,
            "bridge_mode": self.bridge_mode,
        }
        if self.variant != "local":
            out.update(
                requests=self.requests,
                executes=len(self.executes),
                bridge_polls=self.bridge_polls,
                duplex_channels=self.duplex_channels,
                channel_writes=len(self.channel_writes),
                channel_write_ms=[round(ms) for ms in self.channel_writes],
                log_tails=self.log_tails,
                syncs=self.syncs,
                execute_p50_ms=round(_percentile(self.executes, 50), 1),
                execute_p90_ms=round(_percentile(self.executes, 90), 1),
                requests_per_execute=round(self.requests_per_execute, 2),
                sync_ms=[round(ms) for ms in self.sync_ms],
                by_endpoint=dict(sorted(self.by_endpoint.items(), key=lambda kv: -kv[1])),
            )
        if self.timeline is not None:
            out["timeline"] = self.timeline
        return out

    @property
    def requests_per_execute(self) -> float:
        """Requests of the heartbeat made outside sync and lifecycle calls, per execute."""
        return self.execute_requests / len(self.executes) if self.executes else 0.0


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def make_package(folder: Path) -> Path:
    """A copy of the package manifest whose worker entrypoint reads worker-env.json first."""
    folder.mkdir(parents=True)
    package = json.loads((REPO_ROOT / "package.json").read_text())
    package["paperclipPlugin"]["worker"] = "./bench-shim.mjs"
    (folder / "package.json").write_text(json.dumps(package, indent=2))
    shutil.copy(REPO_ROOT / "manifest.js", folder / "manifest.js")
    manifest = json.loads((REPO_ROOT / "manifest.json").read_text())
    manifest["entrypoints"]["worker"] = "./bench-shim.mjs"
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shim_url = json.dumps((REPO_ROOT / "shim.mjs").as_uri())
    (folder / "bench-shim.mjs").write_text(BENCH_SHIM % shim_url)
    return folder


class Bench:
    def __init__(self, root: Path, server: PaperclipServer, emu: EmulatorProcess):
        self.root = root
        self.server = server
        self.emu = emu
        self.package = make_package(root / "package")
        self.call_log = root / "calls.jsonl"
        self.pace: str | None = None
        self.duplex = False
        self._write_env(None)  # the worker the install starts: default pacing, call log on

    def _write_env(self, pace_ms: str | None) -> None:
        env = {"PAPERCLIP_CREATEOS_CALL_LOG": str(self.call_log)}
        if pace_ms is not None:
            env["PAPERCLIP_CREATEOS_PACE_MS"] = pace_ms
        (self.package / "worker-env.json").write_text(json.dumps(env))

    async def set_worker_env(self, pace_ms: str | None) -> None:
        """Restart the worker when the pacing differs (outside the timed window)."""
        if pace_ms == self.pace:
            return
        self._write_env(pace_ms)
        await self.server.cli("plugin", "disable", PLUGIN_KEY)
        await self.server.cli("plugin", "enable", PLUGIN_KEY)
        self.pace = pace_ms

    async def set_duplex_bridge(self, site: AgentSite, enabled: bool) -> None:
        if enabled != self.duplex:
            await site.set_duplex_bridge(enabled)
            self.duplex = enabled

    def calls_between(self, start: float, end: float) -> list[dict[str, Any]]:
        if not self.call_log.exists():
            return []
        calls = [json.loads(line) for line in self.call_log.read_text().splitlines() if line]
        return [c for c in calls if start <= c["start"] <= end]


async def run_variant(
    bench: Bench,
    site: AgentSite,
    agents: dict[str, str],
    envs: dict[str, str],
    variant: str,
    n: int,
    back_to_back: bool,
    with_timeline: bool = False,
) -> Measured:
    await bench.set_worker_env("0" if variant == "unpaced" else None)
    await bench.set_duplex_bridge(site, variant == "duplex")
    if variant in PACED and not back_to_back:
        await anyio.sleep(CAPACITY * DEFAULT_INTERVAL + 0.05)  # a full bucket: a lone heartbeat
    seen = max([0, *(r["seq"] for r in await bench.emu.admin.requests())])
    history_seen = len(await bench.emu.admin.process_history())
    execs_seen = len(await bench.emu.admin.exec_history())
    wall_start = time.time()
    run = await site.heartbeat(agents[variant])
    measured = Measured(variant, n, run.status, run.wall_s)
    bridge_ms, mode = run.stub_values("bridge-ms"), run.stub_values("bridge-mode")
    measured.bridge_ms = int(bridge_ms[0]) if bridge_ms and bridge_ms[0].isdigit() else None
    measured.bridge_mode = mode[0] if mode else None
    if variant == "local":
        return measured
    await site.wait_released(envs[variant])
    requests = [r for r in await bench.emu.admin.requests(since=seen)]
    measured.requests = len(requests)
    for r in requests:
        parts = [p if not p.startswith(("sb_", "proc_")) else "{id}" for p in r["path"].split("/")]
        kind = f"{r['method']} {'/'.join(parts)}"
        measured.by_endpoint[kind] = measured.by_endpoint.get(kind, 0) + 1
    calls = bench.calls_between(wall_start, time.time())
    measured.executes = [c["ms"] for c in calls if c["method"] == "environmentExecute"]
    measured.channel_writes = [c["ms"] for c in calls if c["method"] == "duplexChannelWrite"]
    syncs = [c for c in calls if c["method"].startswith("environmentSync")]
    measured.syncs = len(syncs)
    measured.sync_ms = [c["ms"] for c in syncs]
    windows = [(c["start"], c["start"] + c["ms"] / 1000) for c in syncs]
    measured.execute_requests = sum(
        1
        for r in requests
        if not LIFECYCLE.match(r["path"]) and not any(a <= r["time"] <= b for a, b in windows)
    )
    execs = (await bench.emu.admin.exec_history())[execs_seen:]
    kinds = count_kinds((await bench.emu.admin.process_history())[history_seen:], execs)
    measured.bridge_polls = kinds["bridge_poll"]
    measured.log_tails = kinds["log_tail"]
    measured.duplex_channels = kinds["duplex_channel"]
    if with_timeline:
        measured.timeline = timeline(wall_start, calls, execs)
        measured.timeline["run_times"] = {k: v for k, v in run.record.items() if k.endswith("At")}
    return measured


async def run(
    rounds: int, variants: list[str], back_to_back: bool, with_timeline: bool
) -> dict[str, Any]:
    results: list[Measured] = []
    async with agent_stage("bench-heartbeat-", "Bench Co") as stage:
        bench = Bench(stage.root, stage.server, stage.emu)
        await stage.server.cli("plugin", "install", str(bench.package), "--json")
        envs = {
            "sandbox": await stage.environment("paced"),
            "streamed": await stage.environment("streamed", streamRunLogs=True),
        }
        envs["unpaced"] = envs["duplex"] = envs["sandbox"]
        agents = {"local": await stage.local_agent("local")}
        for variant in ("sandbox", "unpaced", "streamed", "duplex"):
            agents[variant] = await stage.sandbox_agent(variant, envs[variant])
        for n in range(rounds):
            for variant in variants:
                m = await run_variant(
                    bench, stage.site, agents, envs, variant, n, back_to_back, with_timeline
                )
                results.append(m)
                line = {k: v for k, v in m.as_dict().items() if k != "timeline"}
                print(json.dumps(line), flush=True)
        starts = [r["time"] for r in await bench.emu.admin.requests()]
    summary = summarize(results)
    summary["busiest_60s_window"] = max_in_window(starts, 60.0)
    summary["left_in_emulator"] = stage.left
    return summary


def summarize(results: list[Measured]) -> dict[str, Any]:
    by_variant: dict[str, list[Measured]] = {}
    for m in results:
        by_variant.setdefault(m.variant, []).append(m)
    local = (
        statistics.median(m.wall_s for m in by_variant.get("local", []))
        if "local" in by_variant
        else None
    )
    summary: dict[str, Any] = {}
    for variant, runs in by_variant.items():
        wall = statistics.median(m.wall_s for m in runs)
        bridge = [m.bridge_ms for m in runs if m.bridge_ms is not None]
        entry: dict[str, Any] = {
            "runs": len(runs),
            "all_succeeded": all(m.status == "succeeded" for m in runs),
            "wall_s_median": round(wall, 2),
            "bridge_ms_median": statistics.median(bridge) if bridge else None,
            "bridge_modes": sorted({m.bridge_mode or "none" for m in runs}),
        }
        if local:
            entry["ratio_to_local"] = round(wall / local, 1)
        if variant != "local":
            executes = [ms for m in runs for ms in m.executes]
            sync_ms = [ms for m in runs for ms in m.sync_ms]
            entry.update(
                requests_median=statistics.median(m.requests for m in runs),
                executes_median=statistics.median(len(m.executes) for m in runs),
                bridge_polls_median=statistics.median(m.bridge_polls for m in runs),
                duplex_channels_median=statistics.median(m.duplex_channels for m in runs),
                log_tails_median=statistics.median(m.log_tails for m in runs),
                execute_p50_ms=round(_percentile(executes, 50), 1),
                execute_p90_ms=round(_percentile(executes, 90), 1),
                sync_p50_ms=round(_percentile(sync_ms, 50), 1),
                sync_max_ms=round(max(sync_ms, default=0.0), 1),
                requests_per_execute=round(
                    statistics.median(m.requests_per_execute for m in runs), 2
                ),
            )
        summary[variant] = entry
    return {"summary": summary, "runs": [m.as_dict() for m in results]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="start each paced heartbeat at once instead of on a full bucket",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="record each heartbeat call by call: worker vs sandbox time (bench/_timeline.py)",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    started = time.monotonic()
    result = anyio.run(run, args.rounds, variants, args.back_to_back, args.timeline)
    result["wall_s"] = round(time.monotonic() - started, 1)
    for variant, entry in result["summary"].items():
        print(f"{variant:9} {json.dumps(entry)}")
    print(f"busiest 60 s window of request starts at the emulator: {result['busiest_60s_window']}")
    print(f"left in the emulator: {', '.join(result['left_in_emulator']) or 'nothing'}")
    print(f"written to {save_result('heartbeat', result)}")
    ok = all(entry["all_succeeded"] for entry in result["summary"].values())
    ok = ok and not result["left_in_emulator"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
