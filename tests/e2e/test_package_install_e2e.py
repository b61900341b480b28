"""The built npm packages, installed BY NAME by the REAL Paperclip server from a local registry.

What an operator does after we publish: ``paperclipai plugin install paperclip-plugin-createos``.
The server runs ``npm install paperclip-plugin-createos --prefix ~/.paperclip/plugins --save
--ignore-scripts`` (packaging.md); a local registry (provider/devtools/npm_registry.py) named in
``<plugins dir>/.npmrc`` serves the two packages ``packaging/build.py --platforms host`` builds
and a 404 for every other name, so npm skips the other platforms' optional runtime packages.
The worker must then start from the shipped files only (python/bootstrap.py, the runtime
package's compiled modules; no .venv), probe a CreateOS emulator, and an uninstall must take
every file of ours away. Fails, never skips, when Node or the server cannot be installed.
"""

from __future__ import annotations

import io
import json
import platform
import re
import secrets
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider.devtools.e2e_server import REPO_ROOT, PaperclipServer, ensure_host_installed
from provider.devtools.emulator_process import EmulatorProcess
from provider.devtools.npm_registry import NpmRegistry
from provider.devtools.procfs import cmdline, wait_until_gone
from tests.e2e.inspection import cmdline_mentions, plugin_worker_pids

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

MANIFEST = json.loads((REPO_ROOT / "manifest.json").read_text())
PLUGIN_KEY = MANIFEST["id"]
VERSION = MANIFEST["version"]
MAIN = "paperclip-plugin-createos"
RUNTIME_PREFIX = "paperclip-createos-runtime-"
SHAPE = "s-1vcpu-1gb"
INSTALL_BUDGET_S = 420  # first run only: about 1.5 GB from npm
BUILD_BUDGET_S = 300  # about 5 s with a warm wheel cache; the first run downloads about 20 MB
SCENARIO_BUDGET_S = 300
WORKER_EXIT_S = 20.0
LIFECYCLE = re.compile(r"^/v1/sandboxes(/sb_[^/]+)?$")
PROCESSES = re.compile(r"^/v1/sandboxes/(sb_[^/]+)/processes$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# What may stay in the plugins dir after the uninstall: npm's files of the prefix itself.
PREFIX_FILES = {
    ".npmrc",
    "package.json",
    "package-lock.json",
    "node_modules",
    "node_modules/.package-lock.json",
}


def host_key() -> str:
    """This machine's runtime package key, spelled like packaging/pins.toml's platforms."""
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    arch = cpu[platform.machine().lower()]
    system = platform.system().lower()
    if system == "linux":
        return f"linux-{arch}-{'gnu' if platform.libc_ver()[0] == 'glibc' else 'musl'}"
    return f"{system}-{arch}"


async def _build(out: Path) -> dict[str, Path]:
    """``packaging/build.py --platforms host --out <out>``: the main and this host's runtime."""
    command = [sys.executable, str(REPO_ROOT / "packaging" / "build.py")]
    command += ["--platforms", "host", "--out", str(out)]
    with anyio.fail_after(BUILD_BUDGET_S):
        done = await anyio.run_process(command, cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-3000:]
    built = {path.name: path for path in out.glob("*.tgz")}
    runtime = f"{RUNTIME_PREFIX}{host_key()}"
    assert sorted(built) == sorted([f"{MAIN}-{VERSION}.tgz", f"{runtime}-{VERSION}.tgz"])
    return built


def _tree(folder: Path) -> set[str]:
    """Every path below ``folder`` (files and folders), relative, POSIX spelling."""
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


def _tarball_files(registry: NpmRegistry, name: str) -> set[str]:
    """``<name>/<path>`` of the files in the registry's tarball of ``name`` at VERSION."""
    with tarfile.open(fileobj=io.BytesIO(registry.packages[name][VERSION].data)) as tgz:
        return {f"{name}/{m.name.removeprefix('package/')}" for m in tgz.getmembers() if m.isfile()}


def _mapped_files(pid: int) -> set[str]:
    """The files a process has mapped (its executable, shared libraries, extension modules)."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            found.add(fields[5].removesuffix(" (deleted)"))
    return found


async def _sandbox_requests(emu: EmulatorProcess, seen: int) -> tuple[list[tuple[str, str]], int]:
    """(method, path) of the emulator's sandbox lifecycle and process-start calls since ``seen``."""
    requests: list[dict[str, Any]] = await emu.admin.requests(since=seen)
    calls = [
        (r["method"], r["path"])
        for r in requests
        if r["method"] in ("POST", "DELETE")
        and (LIFECYCLE.match(r["path"]) or PROCESSES.match(r["path"]))
        and r["status"] == 200
    ]
    return calls, max([seen, *(r["seq"] for r in requests)])


async def _scenario(
    server: PaperclipServer, emu: EmulatorProcess, registry: NpmRegistry, api_key: str
) -> None:
    overrides = [k for k in server.env() if k.lower() == "npm_config_registry"]
    assert not overrides, f"{overrides} in the environment would beat <plugins dir>/.npmrc"
    plugins = server.plugins_dir
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / ".npmrc").write_text(f"registry={registry.url}\n")
    runtime = f"{RUNTIME_PREFIX}{host_key()}"
    package_dir = plugins / "node_modules" / MAIN
    runtime_dir = plugins / "node_modules" / runtime

    # --- install by name: the server runs npm against our registry --------------------------
    installed = (await server.cli("plugin", "install", MAIN, "--json")).json()
    assert installed["pluginKey"] == PLUGIN_KEY
    assert installed["status"] == "ready", installed.get("lastError")
    assert installed["version"] == VERSION
    listed = (await server.cli("plugin", "list", "--json")).json()
    ours = [p for p in listed if p["pluginKey"] == PLUGIN_KEY]
    assert [(p["status"], p["version"], p["packageName"]) for p in ours] == [
        ("ready", VERSION, MAIN)
    ]
    record = (await server.cli("plugin", "inspect", PLUGIN_KEY, "--json")).json()
    assert record["lastError"] is None
    assert record["packagePath"] is None  # an npm install: <plugins dir>/node_modules/<name>

    assert set(registry.packuments_served()) >= {MAIN, runtime}
    assert sorted(set(registry.tarballs_served())) == sorted(
        [f"{MAIN}-{VERSION}.tgz", f"{runtime}-{VERSION}.tgz"]
    )
    # npm reads every optional dependency's packument (os/cpu/libc live there); the other
    # platforms' names are 404 here, which npm skips without failing the install.
    optional = json.loads((package_dir / "package.json").read_text())["optionalDependencies"]
    others = {f"/{name}" for name in optional} - {f"/{runtime}"}
    assert len(others) == 4
    assert set(registry.not_found()) >= others
    assert sorted(p.name for p in (plugins / "node_modules").iterdir() if p.name[0] != ".") == [
        runtime,
        MAIN,
    ]
    assert json.loads((plugins / "package.json").read_text())["dependencies"] == {
        MAIN: f"^{VERSION}"
    }

    # --- the worker runs from the shipped files: bootstrap.py and the runtime package --------
    assert not (package_dir / ".venv").exists()
    assert (package_dir / "python" / "bootstrap.py").is_file()
    workers = plugin_worker_pids(server.pid or 0, package_dir / "shim.mjs")
    bootstrap = str(package_dir / "python" / "bootstrap.py")
    pythons = [pid for pid in workers if bootstrap in cmdline(pid)]
    assert len(pythons) == 1, {pid: cmdline(pid) for pid in workers}
    assert "-I" in cmdline(pythons[0])  # isolated: no user site, no PYTHON* variables
    mapped = _mapped_files(pythons[0])
    compiled = {f for f in mapped if "/pydantic_core/" in f or "/msgspec/" in f}
    assert any("/pydantic_core/" in f for f in compiled), sorted(mapped)
    assert any("/msgspec/" in f for f in compiled), sorted(mapped)
    assert all(f.startswith(f"{runtime_dir}/") for f in compiled), sorted(compiled)
    for so in compiled:  # the cp3XY build that matches the worker's CPython
        match = re.search(r"/cp3(\d+)/.*\.cpython-3(\d+)", so)
        assert match and match[1] == match[2], so
    assert not [f for f in mapped if f.startswith(f"{REPO_ROOT}/")], "the checkout is in use"

    # --- a createos environment on the emulator, the key stored as a company secret ----------
    company = (
        await server.cli("company", "create", "--json", "--payload-json", '{"name":"Pkg Co"}')
    ).json()
    config = {"provider": "createos", "apiUrl": f"{emu.base_url}/v1", "apiKey": api_key}
    config["shape"] = SHAPE
    payload = {"name": "createos-pkg", "driver": "sandbox", "config": config}
    created = await server.cli(
        "environment", "create", "-C", company["id"], "--json", "--payload-json",
        json.dumps(payload),
    )  # fmt: skip
    assert api_key not in created.stdout
    environment = created.json()
    assert UUID.match(environment["config"]["apiKey"]), "the key must be a secret reference"

    # --- probe of the saved environment (the host's acquire + release) ----------------------
    _, seen = await _sandbox_requests(emu, 0)
    probe = (await server.cli("environment", "probe", environment["id"], "--json")).json()
    assert probe["ok"] is True, probe
    sandbox = probe["details"]["providerLeaseId"]
    calls, seen = await _sandbox_requests(emu, seen)
    assert calls[0] == ("POST", "/v1/sandboxes")
    assert calls[-1] == ("DELETE", f"/v1/sandboxes/{sandbox}")

    # --- our environmentProbe: create a sandbox, run a command in it, delete it -------------
    draft = {"driver": "sandbox", "config": {**config, "apiUrl": emu.base_url}}
    probed = await server.cli(
        "environment", "probe-config", "-C", company["id"], "--json", "--payload-json",
        json.dumps(draft),
    )  # fmt: skip
    result = probed.json()
    assert result["ok"] is True, result
    assert result["details"]["pluginKey"] == PLUGIN_KEY
    assert "ran a command" in result["summary"]
    calls, seen = await _sandbox_requests(emu, seen)
    assert len(calls) == 3, calls
    draft_sandbox = calls[-1][1].rsplit("/", 1)[-1]
    assert calls == [
        ("POST", "/v1/sandboxes"),
        ("POST", f"/v1/sandboxes/{draft_sandbox}/processes"),
        ("DELETE", f"/v1/sandboxes/{draft_sandbox}"),
    ]

    # --- uninstall: the worker stops and no file of ours stays in the plugins dir ------------
    shipped = _tarball_files(registry, MAIN) | _tarball_files(registry, runtime)
    written = {
        f"{folder.name}/{path}"
        for folder in (package_dir, runtime_dir)
        for path in _tree(folder)
        if (folder / path).is_file()
    } - shipped
    assert [p for p in written if "/__pycache__/" in p], "the worker wrote no bytecode?"
    removed = await server.cli("plugin", "uninstall", PLUGIN_KEY)
    assert f"Uninstalled {PLUGIN_KEY}" in removed.stdout
    for pid in workers:
        assert await wait_until_gone(pid, WORKER_EXIT_S), f"worker process {pid} outlived uninstall"
    after = (await server.cli("plugin", "list", "--json")).json()
    assert [p["status"] for p in after if p["pluginKey"] == PLUGIN_KEY] in ([], ["uninstalled"])
    left = _tree(plugins)
    assert left <= PREFIX_FILES, sorted(left - PREFIX_FILES)[:20]
    assert not [p for p in left if "__pycache__" in p or MAIN in p or RUNTIME_PREFIX in p]
    assert json.loads((plugins / "package.json").read_text()).get("dependencies", {}) == {}
    if (plugins / "package-lock.json").exists():
        lock = (plugins / "package-lock.json").read_text()
        assert MAIN not in lock and RUNTIME_PREFIX not in lock


async def test_the_real_server_installs_the_built_package_by_name_and_uninstalls_it() -> None:
    started = time.monotonic()
    with anyio.fail_after(INSTALL_BUDGET_S):
        await ensure_host_installed()
    root = Path(tempfile.mkdtemp(prefix="paperclip-pkg-e2e-"))
    root.chmod(0o711)  # the postgres user must reach its cluster folder below
    api_key = f"emu-key-{secrets.token_hex(8)}"
    raw_log = ""
    try:
        built = await _build(root / "dist")
        with anyio.fail_after(SCENARIO_BUDGET_S):
            with NpmRegistry(built.values()) as registry:
                async with EmulatorProcess(root / "emulator", api_key) as emu:
                    async with PaperclipServer(root / "paperclip", secrets=[api_key]) as server:
                        await _scenario(server, emu, registry, api_key)
                    raw_log = server.raw_log_text()
                    assert server.leftover_pids == [], "processes outlived the server's SIGTERM"
                    state = await emu.admin.state()
                    assert state["sandboxes"] == [], "a sandbox outlived the scenario"
                assert emu.leftover_pids == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert cmdline_mentions(str(root)) == [], "a process still refers to the test's folder"
    assert "plugin-loader: fetching plugin from npm" in raw_log
    assert api_key not in raw_log  # unredacted: the key never reached the server's output
    print(f"e2e package install: {time.monotonic() - started:.1f} s")
