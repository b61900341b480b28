"""The npm packages installed the way the host installs them, started by the REAL worker manager.

`make package` builds them (the session's `built` fixture, tests/packaging/conftest.py); each
install runs `npm install <name>@<tgz> <runtime tgz> --prefix <dir> --save --ignore-scripts`
(the host's flags) plus `--offline --no-audit --no-fund`
so that nothing is asked of the registry (npm then leaves out the runtime packages of the other
platforms, which it would skip anyway). The INSTALLED shim is started through the real
`startWorker` (host/peer-driver.mjs): the manager forks it with its scrubbed environment (PATH,
NODE_PATH, NODE_ENV, TZ, PAPERCLIP_PLUGIN_ID and the deployment variables; `env` of
`start_worker` is merged under those) and no cwd of its own, so the worker inherits the
driver's: a foreign folder here.

The manager copies PATH from its own process, so every test starts the driver with a PATH it
builds: a folder holding a `node` symlink and, except where Python must be missing, a `python3`
symlink to the interpreter under test, then `/usr/bin:/bin` (the interpreter of this test run
outside its venv unless a test says otherwise: a venv's Python would see the venv's
site-packages).

Interpreters from ~/.pyenv/versions are used when present (an old CPython for the version
refusal, 3.12 and 3.13 for the shipped builds), but nothing depends on them: without them the
old Python is a fake (`fake_old_python`: this run's interpreter running the bootstrap with
`sys.version_info` replaced) and the 3.12/3.13 starts run on this run's interpreter.

A refused start must be the bootstrap's (or the shim's) message on stderr and exit code, with no
worker answering `initialize`: `startWorker` fails with the manager's "Worker process exited"
and the stderr excerpt, the handle is `crashed`, no `ready` event came, and the text reaches the
host log as `[plugin stderr]` lines.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools import host_peer
from devtools.call_params import environment_call, validate_params
from devtools.host_peer import HostPeer, ensure_peer_installed
from devtools.peer_sessions import PeerCallError
from devtools.procfs import child_pids, cmdline, wait_until_gone
from provider.emulator import Emulator
from tests.packaging.conftest import INSTALL_BUDGET_S, REPO_ROOT, host_key

pytestmark = [pytest.mark.anyio, pytest.mark.host]

RELEASE: dict[str, Any] = tomllib.loads((REPO_ROOT / "release.toml").read_text())
MAIN: str = RELEASE["name"]
VERSION: str = RELEASE["version"]
RUNTIME = f"paperclip-createos-runtime-{host_key()}"
PINS: dict[str, Any] = tomllib.loads((REPO_ROOT / "packaging" / "pins.toml").read_text())
CP_DIRS = ["cp" + python.replace(".", "") for python in PINS["pythons"]]
NPM_FLAGS = ("--save", "--ignore-scripts", "--offline", "--no-audit", "--no-fund")
PYENV_VERSIONS = Path.home() / ".pyenv" / "versions"
SHAPE = "s-1vcpu-1gb"
CALL_TIMEOUT_MS = 120_000
EXIT_GUARD_S = 15.0

# The bootstrap's and the shim's refusals (packaging/bootstrap.py, shim.mjs), spelled out.
FIX = (
    "install CPython 3.11 or newer (3.11 to 3.14 are shipped) on the Paperclip server as "
    "python3 on the server's PATH, then restart the server or enable the plugin again"
)
NO_PYTHON = (
    f"{MAIN}: no Python found: the worker needs CPython 3.11 or newer (3.11 to 3.14 are "
    "shipped) as python3 on the Paperclip server's PATH; install it on the server, then restart "
    "the server or enable the plugin again"
)
REINSTALL = (
    "reinstall the plugin by name (paperclipai plugin uninstall, then plugin install) with npm's "
    "optional dependencies on (no --omit=optional, no omit=optional in the npm config), then "
    "restart the server or enable the plugin again"
)
EXIT_UNUSABLE = 78  # the bootstrap's EX_CONFIG
EXIT_NO_PYTHON = 127  # the shim's

# What the worker's environment may hold: the manager's scrubbed set plus what the shim adds.
HOST_ENV = {
    "PATH",
    "NODE_PATH",
    "NODE_ENV",
    "TZ",
    "PAPERCLIP_PLUGIN_ID",
    "PAPERCLIP_DEPLOYMENT_MODE",
    "PAPERCLIP_DEPLOYMENT_EXPOSURE",
}
SHIM_ENV = {
    "PAPERCLIP_CREATEOS_PLATFORM",
    "PAPERCLIP_CREATEOS_RUNTIME",
    "PAPERCLIP_CREATEOS_SHIM_PID",
    "PYTHONUNBUFFERED",
    "PYTHONUTF8",
}


# -- installs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """An npm prefix as the host's plugins folder: node_modules/<main> (+ the runtime)."""

    prefix: Path

    @property
    def package(self) -> Path:
        return self.prefix / "node_modules" / MAIN

    @property
    def runtime(self) -> Path:
        return self.prefix / "node_modules" / RUNTIME

    def copy(self, target: Path) -> Install:
        """A copy elsewhere: the shim resolves everything from its own folder, so it works."""
        shutil.copytree(self.prefix, target, symlinks=True)
        return Install(target)


def npm_install(prefix: Path, *specs: str, extra: tuple[str, ...] = ()) -> Install:
    prefix.mkdir(parents=True)
    command = ["npm", "install", *specs, "--prefix", str(prefix), *NPM_FLAGS, *extra]
    # npm's cwd is not the prefix (the server runs it from its own folder).
    done = subprocess.run(
        command,
        cwd=prefix.parent,
        capture_output=True,
        text=True,
        timeout=INSTALL_BUDGET_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Install(prefix)


def tarball(built: dict[str, Path], name: str) -> Path:
    return built[f"{name}-{VERSION}.tgz"].resolve()


@pytest.fixture(scope="module")
def installed(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Install:
    """Both packages installed by name into a fresh prefix, once per module."""
    prefix = tmp_path_factory.mktemp("host-home") / "plugins"
    install = npm_install(prefix, f"{MAIN}@{tarball(built, MAIN)}", str(tarball(built, RUNTIME)))
    assert install.package.is_dir() and install.runtime.is_dir()
    return install


def tree(root: Path) -> set[Path]:
    return {path.relative_to(root) for path in root.rglob("*")}


# -- interpreters ------------------------------------------------------------------------------


def base_python() -> Path:
    """This run's interpreter outside its venv (a venv's Python sees the venv's packages)."""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidate = Path(sys.base_prefix) / "bin" / minor
    return candidate if candidate.is_file() else Path(os.path.realpath(sys.executable))


def pyenv_python(minor: str) -> Path | None:
    """~/.pyenv/versions/<minor>.*/bin/python<minor>, the newest patch release, if present."""
    found = sorted(
        PYENV_VERSIONS.glob(f"{minor}.*/bin/python{minor}"),
        key=lambda path: [int(part) for part in path.parts[-3].split(".") if part.isdigit()],
    )
    return found[-1] if found else None


def identify(python: Path) -> tuple[str, str]:
    """(sys.executable, "X.Y.Z") of an interpreter as the shim runs it (any Python 3)."""
    probe = (
        "import sys; sys.stdout.write('%s %d.%d.%d' % ((sys.executable,) + sys.version_info[:3]))"
    )
    done = subprocess.run(
        [str(python), "-I", "-c", probe], capture_output=True, text=True, env={}, check=True
    )
    executable, version = done.stdout.rsplit(" ", 1)
    return executable, version


FAKE_OLD_PYTHON = """#!{python} -I
# A stand-in for an old CPython when ~/.pyenv has none: the shim runs it as
# `python3 -I -u -X utf8 <bootstrap>`; it runs the bootstrap as __main__ on this interpreter
# with sys.version_info replaced, so only the bootstrap's version check sees {version}.
import runpy
import sys

sys.argv = sys.argv[-1:]
sys.version_info = {version_info!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def fake_old_python(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "fake-python"
    parts = tuple(int(part) for part in version.split("."))
    script.write_text(
        FAKE_OLD_PYTHON.format(
            python=base_python(), version=version, version_info=(*parts, "final", 0)
        )
    )
    script.chmod(0o755)
    return script


# -- the host ----------------------------------------------------------------------------------


def host_bin(folder: Path, python: Path | None) -> Path:
    """A PATH folder with `node` and, unless None, `python3` -> ``python``."""
    folder.mkdir(parents=True)
    node = shutil.which("node")
    assert node is not None, "node is not on PATH: the real worker manager needs Node 20+"
    (folder / "node").symlink_to(os.path.realpath(node))
    if python is not None:
        (folder / "python3").symlink_to(python)
    return folder


@dataclass
class Host:
    """The real worker manager (``peer``), started with ``path`` as its PATH from ``cwd``."""

    peer: HostPeer
    log_file: Path
    cwd: Path

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log_file.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def messages(self) -> list[str]:
        return [str(record.get("msg", "")) for record in self.log_records()]

    def plugin_stderr(self) -> list[str]:
        prefix = "[plugin stderr] "
        return [m.removeprefix(prefix) for m in self.messages() if m.startswith(prefix)]


@asynccontextmanager
async def host(tmp_path: Path, path: str) -> AsyncIterator[Host]:
    """The peer driver with PATH=``path`` and cwd a fresh foreign folder; the worker manager
    copies that PATH into every worker it forks (the driver finds `node` on it too)."""
    peer_dir = await ensure_peer_installed()  # with this run's PATH (bash, npm)

    async def already_installed(_: Path | None = None) -> Path:
        return peer_dir

    cwd = tmp_path / "server-cwd"
    cwd.mkdir()
    log_file = tmp_path / "host.log"
    async with AsyncExitStack() as stack:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(host_peer, "ensure_peer_installed", already_installed)
            patch.setenv("PATH", path)  # only while the driver is spawned
            peer = await stack.enter_async_context(
                HostPeer(peer_dir=peer_dir, log_file=log_file, cwd=cwd)
            )
        yield Host(peer, log_file, cwd)


def with_system_dirs(folder: Path) -> str:
    return os.pathsep.join([str(folder), "/usr/bin", "/bin"])


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode().split("=", 1) for item in raw.split(b"\0") if item)
    return {key: value for key, value in pairs}


def mapped_files(pid: int) -> set[str]:
    """Files mapped into ``pid`` (its loaded extension modules among them)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}


def the_worker(peer: HostPeer) -> int:
    shim = peer.shim_pid()
    assert shim is not None
    children = child_pids(shim)
    assert len(children) == 1, children
    return children[0]


def assert_runs_the_bootstrap(worker: int, install: Install, python3: Path, cp: str) -> None:
    """The worker is ``python3 -I ... python/bootstrap.py`` of the installed package, with the
    runtime package npm installed beside it, and its compiled modules came from ``cp``."""
    package, runtime = install.package.resolve(), install.runtime.resolve()
    bootstrap = package / "python" / "bootstrap.py"
    assert cmdline(worker) == [str(python3), "-I", "-u", "-X", "utf8", str(bootstrap)]
    environment = proc_environ(worker)
    assert set(environment) <= HOST_ENV | SHIM_ENV, set(environment) - HOST_ENV - SHIM_ENV
    assert environment["PAPERCLIP_CREATEOS_RUNTIME"] == str(runtime)
    assert environment["PAPERCLIP_CREATEOS_PLATFORM"] == host_key()
    assert Path(os.readlink(f"/proc/{worker}/cwd")) == package  # the shim's choice
    extensions = {f for f in mapped_files(worker) if re.search(r"\.cpython-3\d+[^/]*\.so$", f)}
    ours = {f for f in extensions if f.startswith(f"{runtime}/")}
    for module in ("pydantic_core/_pydantic_core.", "msgspec/_core."):
        loaded = [f for f in ours if f.startswith(f"{runtime}/{cp}/{module}")]
        assert len(loaded) == 1, (module, sorted(extensions))


def assert_installed_layout(install: Install) -> None:
    """The prefix holds what npm wrote and nothing else; bytecode only inside the packages."""
    assert sorted(p.name for p in install.prefix.iterdir()) == [
        "node_modules",
        "package-lock.json",
        "package.json",
    ]
    modules = install.prefix / "node_modules"
    assert sorted(p.name for p in modules.iterdir()) == [".package-lock.json", RUNTIME, MAIN]
    for cache in install.prefix.rglob("__pycache__"):
        assert cache.is_relative_to(install.package) or cache.is_relative_to(install.runtime)
        assert all(p.suffix == ".pyc" for p in cache.iterdir()), sorted(cache.iterdir())


# -- starts that work --------------------------------------------------------------------------


def common(emulator: Emulator) -> dict[str, Any]:
    return environment_call(
        emulator.base_url,
        "test-key",
        company_id="company-installed",
        environment_id="env-installed",
        timeout_ms=60_000,
    )


async def test_the_installed_package_serves_a_lease_under_the_host(
    installed: Install, emulator: Emulator, tmp_path: Path
) -> None:
    assert_installed_layout(installed)
    before = tree(installed.prefix)
    started = time.time()
    python = base_python()
    bin_dir = host_bin(tmp_path / "bin", python)
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        info = await server.peer.start_worker(package_root=installed.package, auto_restart=False)
        assert info.entrypoint_path == str(installed.package / "shim.mjs")
        shim = server.peer.shim_pid()
        assert shim is not None
        assert Path(os.readlink(f"/proc/{shim}/cwd")) == server.cwd.resolve()  # no cwd given
        worker = the_worker(server.peer)
        cp = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        assert_runs_the_bootstrap(worker, installed, bin_dir / "python3", cp)
        assert "HOME" not in proc_environ(worker)

        params = common(emulator)
        run = {"runId": "run-1", "agentId": "agent-1", "executionWorkspaceId": "ws-1"}
        lease = await server.peer.call(
            "environmentAcquireLease", {**params, **run}, timeout_ms=CALL_TIMEOUT_MS
        )
        sandbox_id = lease["providerLeaseId"]
        state = (await emulator.admin.state())["sandboxes"]
        name = next(s["name"] for s in state if s["id"] == sandbox_id)
        script = 'echo "installed-marker $(cat /etc/hostname) as $(id -un) home=$HOME"'
        result = await server.peer.call(
            "environmentExecute",
            {
                **params,
                "lease": {**lease, "expiresAt": None},
                "command": "bash",
                "args": ["-c", script],
            },
            timeout_ms=CALL_TIMEOUT_MS,
        )
        # The sandbox's own hostname and HOME (the worker has no HOME at all).
        assert result["exitCode"] == 0, result
        assert result["stdout"] == f"installed-marker {name} as root home=/root\n"
        history = await emulator.admin.exec_history()  # one streamed exec per command
        ran = [p["sandbox_id"] for p in history if "installed-marker" in " ".join(p["args"])]
        assert ran == [sandbox_id]
        receipt = await server.peer.call(
            "environmentReleaseLease",
            {**params, "providerLeaseId": sandbox_id, "leaseMetadata": lease["metadata"]},
            timeout_ms=CALL_TIMEOUT_MS,
        )
        assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
        await server.peer.stop_worker()
        assert await wait_until_gone(worker, EXIT_GUARD_S)
        assert "worker process started and initialized" in server.messages()

    # Nothing written in the plugins folder but bytecode caches inside both packages. The lease
    # journal lives in the account's home, which an upgrade leaves alone (the worker has no
    # HOME: provider/driver/core/state_folder.py reads it from the password database), in the
    # folder of this instance's plugin id.
    assert list(server.cwd.iterdir()) == []
    assert_installed_layout(installed)
    for new in sorted(tree(installed.prefix) - before):
        inside = new.parts[:2] in (("node_modules", MAIN), ("node_modules", RUNTIME))
        assert inside and "__pycache__" in new.parts, new
    assert (installed.package / "provider" / "__pycache__").is_dir()  # they were written
    root = Path(pwd.getpwuid(os.getuid()).pw_dir, ".local/state/paperclip-createos")
    state = root / "instances" / server.peer.plugin_id
    written = [p.stat().st_mtime for p in state.glob("leases.sqlite3*")]
    assert written and max(written) >= started - 2, sorted(state.iterdir())


def shipped_python(minor: str) -> Path:
    """A CPython ``minor`` from ~/.pyenv or PATH; this run's interpreter when there is none."""
    on_path = shutil.which(f"python{minor}")
    for found in (pyenv_python(minor), Path(on_path) if on_path else None):
        if found is None:
            continue
        try:
            if identify(found)[1].startswith(f"{minor}."):  # not a shim that needs pyenv
                return found
        except (OSError, subprocess.CalledProcessError):
            continue
    return base_python()


@pytest.mark.parametrize("minor", ["3.12", "3.13"])
async def test_another_shipped_cpython_answers_initialize(
    installed: Install, minor: str, tmp_path: Path
) -> None:
    python = shipped_python(minor)
    version = identify(python)[1]
    cp = "cp" + "".join(version.split(".")[:2])
    bin_dir = host_bin(tmp_path / "bin", python)
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        await server.peer.start_worker(package_root=installed.package, auto_restart=False)
        assert_runs_the_bootstrap(the_worker(server.peer), installed, bin_dir / "python3", cp)
        assert await server.peer.call("health", {}) == {"status": "ok"}
        valid = await server.peer.call(
            "environmentValidateConfig", validate_params({"shape": SHAPE})
        )
        assert valid["ok"] is True
        await server.peer.stop_worker()


# -- refusals ----------------------------------------------------------------------------------


async def assert_refused(
    server: Host, install: Install, exit_code: int, message: str | re.Pattern[str]
) -> None:
    """The start fails with ``message`` (a text, or a pattern the whole line must match) as
    the worker's only stderr line and ``exit_code``; nothing answered ``initialize``; the
    handle is crashed; the host log carries the stderr line."""
    with pytest.raises(PeerCallError) as failed:
        await server.peer.start_worker(package_root=install.package, auto_restart=False)
    error = failed.value.message
    head, _, excerpt = error.partition("\n\nWorker stderr:\n")
    assert head == (
        f'Worker initialize failed for "{server.peer.plugin_id}": '
        f"Worker process exited (code={exit_code}, signal=null)"
    ), error
    if isinstance(message, str):
        assert excerpt == message, error
    else:
        assert message.fullmatch(excerpt), error
    diagnostics = await server.peer.worker_diagnostics()
    assert diagnostics is not None
    assert diagnostics["status"] == "crashed"
    assert diagnostics["pid"] is None and diagnostics["totalCrashes"] == 1
    assert [e.type for e in server.peer.events] == []  # no ready (nor a restart)
    messages = server.messages()
    assert server.plugin_stderr() == [excerpt]
    assert "worker initialize failed" in messages
    assert "worker process started and initialized" not in messages


async def test_no_python_on_path_is_refused_by_the_shim(installed: Install, tmp_path: Path) -> None:
    bin_dir = host_bin(tmp_path / "bin", None)
    async with host(tmp_path, str(bin_dir)) as server:  # PATH: node, nothing else
        await assert_refused(server, installed, EXIT_NO_PYTHON, NO_PYTHON)


def old_python(kind: str, folder: Path) -> tuple[Path, str, str]:
    """(python3 for PATH, its sys.executable, version) of a CPython older than 3.11."""
    if kind.startswith("fake-"):
        version = kind.removeprefix("fake-")
        return fake_old_python(folder, version), str(base_python()), version
    real = pyenv_python(kind)
    if real is None:  # not on this machine: the fake claims that version
        return fake_old_python(folder, f"{kind}.0"), str(base_python()), f"{kind}.0"
    return real, "", ""


@pytest.mark.parametrize("kind", ["3.10", "3.6", "fake-3.10.13"])
async def test_a_python_older_than_3_11_is_refused(
    installed: Install, tmp_path: Path, kind: str
) -> None:
    python, executable, version = old_python(kind, tmp_path / "fake")
    bin_dir = host_bin(tmp_path / "bin", python)
    if not version:  # a real one: as it sees itself when the shim runs it
        executable, version = identify(bin_dir / "python3")
    message = (
        f"{MAIN}: Python {version} at {executable} is too old: the worker needs Python 3.11 "
        f"or newer; {FIX}."
    )
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        await assert_refused(server, installed, EXIT_UNUSABLE, message)


async def test_a_missing_runtime_package_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    # The main package alone: what npm leaves when optional dependencies are omitted.
    alone = npm_install(
        tmp_path / "plugins", f"{MAIN}@{tarball(built, MAIN)}", extra=("--omit=optional",)
    )
    assert not alone.runtime.exists()
    message = (
        f"{MAIN}: the runtime package {RUNTIME} is not installed beside the plugin (npm leaves "
        f"optional dependencies out with --omit=optional): {REINSTALL}."
    )
    bin_dir = host_bin(tmp_path / "bin", base_python())
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        await assert_refused(server, alone, EXIT_UNUSABLE, message)


async def test_a_cpython_without_a_shipped_build_is_refused(
    installed: Install, tmp_path: Path
) -> None:
    python = base_python()
    _, version = identify(python)
    cp = "cp" + "".join(version.split(".")[:2])
    # The runtime is resolved from node_modules: the trimmed copy lives in its own prefix.
    trimmed = installed.copy(tmp_path / "plugins")
    shutil.rmtree(trimmed.runtime / cp)
    message = (
        f"{MAIN}: the runtime package for {host_key()} has no build for Python {version} "
        f"(it ships {', '.join(d for d in CP_DIRS if d != cp)}); {FIX}."
    )
    bin_dir = host_bin(tmp_path / "bin", python)
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        await assert_refused(server, trimmed, EXIT_UNUSABLE, message)


@pytest.mark.parametrize("module", ["msgspec/_core", "pydantic_core/_pydantic_core"])
async def test_compiled_modules_that_do_not_load_are_refused(
    installed: Install, tmp_path: Path, module: str
) -> None:
    python = base_python()
    _, version = identify(python)
    cp = "cp" + "".join(version.split(".")[:2])
    broken = installed.copy(tmp_path / "plugins")
    (extension,) = (broken.runtime / cp).glob(f"{module}.cpython-*.so")
    extension.write_bytes(b"")  # truncated
    # The loader's own words name the broken file.
    message = re.compile(
        re.escape(f"{MAIN}: the runtime for {host_key()} and Python {version} does not load ")
        + re.escape("on this machine (")
        + f".*{re.escape(str(extension.resolve()))}.*"
        + re.escape(f"): {REINSTALL}.")
    )
    bin_dir = host_bin(tmp_path / "bin", python)
    async with host(tmp_path, with_system_dirs(bin_dir)) as server:
        await assert_refused(server, broken, EXIT_UNUSABLE, message)
