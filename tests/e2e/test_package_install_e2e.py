"""The published plugin, installed BY NAME by the REAL Paperclip server, runs on a stock Python.

What an operator does after a release: ``paperclipai plugin install paperclip-plugin-createos``.
The test builds this host's packages (``packaging/build.py --platforms host``), publishes them
with ``make publish``'s script to a real npm registry (verdaccio from npm, on loopback, throwaway
storage; registry_site.py and devtools/verdaccio.py) and names that registry in
``<plugins dir>/.npmrc``. The server runs ``npm install <name> --prefix <plugins dir> --save
--ignore-scripts``; npm asks for every optional runtime package and skips the other platforms'
(404 there). The server's ``python3`` is the SYSTEM CPython 3.11.0-3.11.3 (Debian 12's 3.11.2,
whose tarfile has no extraction filters), a symlink first on its PATH.

Then, from the shipped files only: the worker starts on that Python, probes an environment on
the emulator, and one real agent heartbeat (the stub CLI of agent-image/, an agent being the
most faithful cause of a workspace sync back) leaves files with binary bytes, several modes and
symlinks that must come back to the host's workspace exactly. A second agent leaves a link out
of its workspace: that sync back must be refused whole, and nothing of it written. An uninstall
takes every file of ours away. Fails, never skips, when Node, the server, verdaccio or an old
enough Python is missing. Prints the timings (install, first start, probe, heartbeat).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from devtools import agent_heartbeat as agents
from devtools.agent_heartbeat import AgentSite
from devtools.e2e_server import REPO_ROOT, PaperclipServer, ensure_host_installed
from devtools.emulator_process import EmulatorProcess
from devtools.procfs import cmdline, wait_until_gone
from devtools.verdaccio import Verdaccio, ensure_verdaccio_installed, running_verdaccio
from tests.e2e import registry_site as site_
from tests.e2e.inspection import assert_emulator_empty, cmdline_mentions, plugin_worker_pids

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

MANIFEST = json.loads((REPO_ROOT / "manifest.json").read_text())
PLUGIN_KEY = MANIFEST["id"]
VERSION = MANIFEST["version"]
MAIN = site_.MAIN
RUNTIME = f"{site_.RUNTIME_PREFIX}{site_.host_key()}"
INSTALL_BUDGET_S = 600  # first run only: the server (about 1.5 GB) and verdaccio from npm
SCENARIO_BUDGET_S = 480
WORKER_EXIT_S = 20.0
# What may stay in the plugins dir after the uninstall: npm's files of the prefix itself.
PREFIX_FILES = {
    ".npmrc",
    "package.json",
    "package-lock.json",
    "node_modules",
    "node_modules/.package-lock.json",
}


def _tree(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


def _mapped_files(pid: int) -> set[str]:
    """The files a process has mapped (its executable, shared libraries, extension modules)."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            found.add(fields[5].removesuffix(" (deleted)"))
    return found


async def _settled(site: AgentSite, environment_id: str) -> list[dict[str, Any]]:
    """The environment's leases once none is active (a failed run's lease ends ``failed``)."""
    with anyio.fail_after(120):
        while True:
            leases = await site.leases(environment_id)
            if all(lease["status"] in ("released", "failed") for lease in leases):
                return leases
            await anyio.sleep(0.2)


def _served(registry: Verdaccio, status: int) -> set[str]:
    return {r.path for r in registry.requests() if r.method == "GET" and r.status == status}


async def _install(
    server: PaperclipServer, registry: Verdaccio, python: Path, timings: dict[str, float]
) -> list[int]:
    plugins = server.plugins_dir
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / ".npmrc").write_text(f"registry={registry.url}\n")
    package_dir = plugins / "node_modules" / MAIN
    started = time.monotonic()
    installed = (await server.cli("plugin", "install", MAIN, "--json")).json()
    timings["install_s"] = time.monotonic() - started  # npm install + the worker's first start
    assert (installed["pluginKey"], installed["status"]) == (PLUGIN_KEY, "ready"), installed
    assert installed["version"] == VERSION
    record = (await server.cli("plugin", "inspect", PLUGIN_KEY, "--json")).json()
    assert record["lastError"] is None
    assert record["packagePath"] is None  # an npm install: <plugins dir>/node_modules/<name>

    # npm fetched both packages from verdaccio and asked for (and skipped) the other runtimes.
    ok = _served(registry, 200)
    assert {f"/{MAIN}", f"/{RUNTIME}"} <= ok, sorted(ok)
    assert {f"/{MAIN}/-/{MAIN}-{VERSION}.tgz", f"/{RUNTIME}/-/{RUNTIME}-{VERSION}.tgz"} <= ok
    optional = json.loads((package_dir / "package.json").read_text())["optionalDependencies"]
    assert len(set(optional) - {RUNTIME}) == 4
    assert {f"/{name}" for name in optional if name != RUNTIME} <= _served(registry, 404)
    children = sorted(p.name for p in (plugins / "node_modules").iterdir() if p.name[0] != ".")
    assert children == [RUNTIME, MAIN]

    # The worker: the system Python, isolated, the shipped bootstrap and runtime, no checkout.
    workers = plugin_worker_pids(server.pid or 0, package_dir / "shim.mjs")
    # The first start: from the shim's fork (workers[0]) to the install's answer, which comes
    # after the worker answered `initialize`.
    since_answer = time.monotonic() - started - timings["install_s"]
    timings["first_start_s"] = _age_s(workers[0]) - since_answer
    bootstrap = str(package_dir / "python" / "bootstrap.py")
    pythons = [pid for pid in workers if bootstrap in cmdline(pid)]
    assert len(pythons) == 1, {pid: cmdline(pid) for pid in workers}
    assert "-I" in cmdline(pythons[0])
    assert os.path.realpath(f"/proc/{pythons[0]}/exe") == os.path.realpath(python)
    mapped = _mapped_files(pythons[0])
    compiled = {f for f in mapped if "/pydantic_core/" in f or "/msgspec/" in f}
    assert compiled and all("/node_modules/" + RUNTIME + "/cp311/" in f for f in compiled)
    assert not [f for f in mapped if f.startswith(f"{REPO_ROOT}/")], "the checkout is in use"
    return workers


async def _heartbeat_syncs_back(
    server: PaperclipServer, emu: EmulatorProcess, api_key: str, timings: dict[str, float]
) -> None:
    async with httpx.AsyncClient(base_url=server.api_base, timeout=60) as client:
        site = await AgentSite.create(server, client, "Registry Co")
        config = {"apiUrl": emu.base_url, "apiKey": api_key, "shape": "s-1vcpu-1gb"}
        environment_id = await site.createos_environment(
            "createos-pkg", {**config, "rootfs": agents.STUB_IMAGE}
        )
        started = time.monotonic()
        probe = (await server.cli("environment", "probe", environment_id, "--json")).json()
        timings["probe_s"] = time.monotonic() - started
        assert probe["ok"] is True, probe

        quiet = {"PAPERCLIP_STUB_PAUSE": "0"}
        good = await site.agent(
            "good", agents.STUB_COMMAND, environment_id=environment_id,
            env={**quiet, "PAPERCLIP_STUB_SCRIPT": site_.GOOD_SCRIPT},
        )  # fmt: skip
        run = await site.heartbeat(good)
        timings["heartbeat_s"] = run.wall_s
        assert run.status == "succeeded", run.error
        await _settled(site, environment_id)
        workspace = site.workspace(good)
        assert (workspace / agents.STUB_FILE).read_text().startswith("heartbeat 1 ran in ")
        assert site_.tree_of(workspace) == site_.EXPECTED_TREE

        hostile = await site.agent(
            "hostile", agents.STUB_COMMAND, environment_id=environment_id,
            env={**quiet, "PAPERCLIP_STUB_SCRIPT": site_.HOSTILE_SCRIPT},
        )  # fmt: skip
        refused = await site.heartbeat(hostile)
        leases = await _settled(site, environment_id)
        assert [lease["cleanupStatus"] for lease in leases] == ["success"] * len(leases)
        assert refused.status == "failed"
        kept = site.workspace(hostile)
        assert not (kept / "pipe").exists() and not (kept / "beside-it").exists()
        assert not (kept / agents.STUB_FILE).exists(), "nothing of a refused archive is written"
        logged = refused.error + refused.stdout() + server.log_text()
        assert "the archive from the sandbox was refused" in logged, refused.error


async def _uninstall(server: PaperclipServer, workers: list[int]) -> None:
    removed = await server.cli("plugin", "uninstall", PLUGIN_KEY)
    assert f"Uninstalled {PLUGIN_KEY}" in removed.stdout
    for pid in workers:
        assert await wait_until_gone(pid, WORKER_EXIT_S), f"worker process {pid} outlived uninstall"
    left = _tree(server.plugins_dir)
    assert left <= PREFIX_FILES, sorted(left - PREFIX_FILES)[:20]
    dependencies = json.loads((server.plugins_dir / "package.json").read_text())
    assert dependencies.get("dependencies", {}) == {}


def _age_s(pid: int) -> float:
    """How long ago ``pid`` started (``/proc``: clock ticks since boot, against the uptime)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


async def install_by_name(python: Path) -> dict[str, float]:
    with anyio.fail_after(INSTALL_BUDGET_S):
        host_dir = await ensure_host_installed()
        await ensure_verdaccio_installed()
    node_dir = host_dir / "node24" / "bin"
    root = agents.scratch_root("paperclip-registry-e2e-")
    api_key = f"emu-key-{secrets.token_hex(8)}"
    timings: dict[str, float] = {}
    try:
        await site_.build(root / "dist", VERSION)
        # python3 first: the shim takes the first on PATH; the rest as for every e2e server.
        first = [site_.python_bin(root / "python-bin", python), node_dir]
        path = os.pathsep.join([*map(str, first), os.environ.get("PATH", "/usr/bin:/bin")])
        server_env = agents.agent_server_env(root) | {"PATH": path}
        with anyio.fail_after(SCENARIO_BUDGET_S):
            async with running_verdaccio(root / "registry", node_dir / "node") as registry:
                token = await registry.add_user("publisher")
                published = await site_.publish(root / "dist", registry.url, token, node_dir)
                assert published.index(RUNTIME) < published.index(f"published {MAIN}-")
                images = {agents.STUB_IMAGE: agents.stage_stub_image(root)}
                async with EmulatorProcess(root / "emulator", api_key, images=images) as emu:
                    async with PaperclipServer(
                        root / "paperclip", secrets=[api_key, token], extra_env=server_env
                    ) as server:
                        workers = await _install(server, registry, python, timings)
                        await _heartbeat_syncs_back(server, emu, api_key, timings)
                        await _uninstall(server, workers)
                    raw_log = server.raw_log_text()
                    assert server.leftover_pids == [], "processes outlived the server's SIGTERM"
                    await assert_emulator_empty(emu, "scenario")
                assert emu.leftover_pids == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert cmdline_mentions(str(root)) == [], "a process still refers to the test's folder"
    assert api_key not in raw_log and token not in raw_log
    return timings


# The test's own budgets run out first, with their message; 300 s for
# the package build between them and the rest.
@pytest.mark.timeout(INSTALL_BUDGET_S + SCENARIO_BUDGET_S + 300)
async def test_the_published_plugin_installs_by_name_and_syncs_back_on_the_system_python() -> None:
    python = site_.old_system_python()
    timings = await install_by_name(python)
    shown = "  ".join(f"{k}={v:.1f}" for k, v in timings.items())
    print(f"\nregistry install on {python} {site_.version_of(python)}: {shown}")
