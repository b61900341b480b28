"""The full Paperclip server (docs/protocol.md H9.2) on a throwaway PostgreSQL, driven by its CLI.

``PaperclipServer`` installs Node 24 + ``paperclipai``/``@paperclipai/server`` 2026.916.1
(``host/e2e/install-host.sh``, cached), starts a PostgreSQL cluster (``host/e2e/postgres.sh``),
generates the instance config with ``test-drive`` and points it at that database with telemetry
and update checks off (``host/e2e/instance-config.sh``, ``configure.mjs``), starts
``paperclipai run`` on a free loopback port and waits for ``/api/health``. Everything it writes
lives under ``work_dir``; the caller deletes that folder::

    async with PaperclipServer(tmp / "paperclip", secrets=[api_key]) as server:
        plugins = (await server.cli("plugin", "list", "--json")).json()
    assert server.leftover_pids == []

Stopping: SIGTERM to the server (SIGKILL to its process group after 30 s), then a fast
PostgreSQL shutdown. ``leftover_pids`` lists any process of ours that had to be killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self

import anyio
import anyio.abc
import httpx

from devtools.procfs import child_pids, wait_until_gone

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
E2E_DIR: Final = REPO_ROOT / "host" / "e2e"
PAPERCLIP_VERSION: Final = "2026.916.1"
SERVER_STOP_S: Final = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SCRUBBED = ("DATABASE_URL", "DATABASE_MIGRATION_URL", "HOST", "PORT", "SERVE_UI", "NODE_OPTIONS")


class E2EError(RuntimeError):
    """Installing, starting or driving the full server failed (message redacted)."""


@dataclass(frozen=True)
class CliResult:
    """One ``paperclipai`` run: exit status and the decoded output."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (callers retry on a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first, then theirs)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [child for parent in frontier for child in child_pids(parent)]
        found.extend(children)
        frontier = children
    return found


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


async def ensure_host_installed(host_dir: Path | None = None) -> Path:
    """Run ``host/e2e/install-host.sh`` (idempotent); returns the install folder."""
    env = dict(os.environ)
    if host_dir is not None:
        env["PAPERCLIP_HOST_CACHE"] = str(host_dir)
    result = await anyio.run_process(
        ["bash", str(E2E_DIR / "install-host.sh")], env=env, check=False, stderr=subprocess.PIPE
    )
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace")[-2000:]
        raise E2EError(f"host/e2e/install-host.sh failed ({result.returncode}):\n{detail}")
    return Path(result.stdout.decode().strip().splitlines()[-1])


class PaperclipServer:
    """The real server and its database, as an async context manager (see the module doc)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        host_dir: Path | None = None,
        secrets: Iterable[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.host_dir = host_dir
        self.secrets = [s for s in secrets if s]
        self.extra_env = dict(extra_env or {})
        self.data_dir = work_dir / "data"
        self.pg_dir = work_dir / "pg"
        self.log_path = work_dir / "server.log"
        self.config_path = self.data_dir / "instances" / "default" / "config.json"
        self.api_base = ""
        self.port = 0
        self.database_url = ""
        self.pid: int | None = None
        self.postmaster_pid: int | None = None
        self.leftover_pids: list[int] = []
        self.timings: dict[str, float] = {}
        self._node = Path()
        self._cli_js = Path()
        self._process: anyio.abc.Process | None = None
        self._log_file: IO[bytes] | None = None
        self._pg_started = False

    # --- environment and helpers ------------------------------------------------------------

    @property
    def home_dir(self) -> Path:
        """``HOME`` of every Paperclip process (see ``env``)."""
        return self.work_dir / "home"

    @property
    def plugins_dir(self) -> Path:
        """Where the server npm-installs a plugin given by name (``--prefix``): the
        ``~/.paperclip/plugins`` of its ``HOME`` (@paperclipai/server's plugin-loader
        ``DEFAULT_LOCAL_PLUGIN_DIR``); its ``.npmrc`` is npm's project config there."""
        return self.home_dir / ".paperclip" / "plugins"

    def raw_log_text(self) -> str:
        """The server's stdout/stderr so far, unredacted (to assert a secret never got there)."""
        try:
            return self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""

    def env(self) -> dict[str, str]:
        """The environment every Paperclip process gets: no stray PAPERCLIP_*, no telemetry."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAPERCLIP_")}
        for key in _SCRUBBED:
            env.pop(key, None)
        env.update(
            PATH=f"{self._node.parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            HOME=str(self.home_dir),
            PAPERCLIP_UPDATE_CHECK="0",
            PAPERCLIP_TELEMETRY_DISABLED="1",
            DO_NOT_TRACK="1",
            NO_COLOR="1",
        )
        env.update(self.extra_env)
        return env

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[REDACTED]")
        return text

    def log_text(self) -> str:
        """The server's stdout/stderr so far, ANSI colours removed, secrets redacted."""
        try:
            raw = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return self.redact(strip_ansi(raw))

    def _tail(self, path: Path, lines: int = 30) -> str:
        try:
            text = path.read_text("utf-8", "replace")
        except OSError:
            return "(no log)"
        return self.redact(strip_ansi("\n".join(text.splitlines()[-lines:])))

    async def cli(
        self, *args: str, check: bool = True, api: bool = True, timeout_s: float = 120.0
    ) -> CliResult:
        """Run ``paperclipai <args>`` (plus ``--api-base``); raises ``E2EError`` on failure."""
        argv = [str(self._node), str(self._cli_js), *args]
        if api:
            argv += ["--api-base", self.api_base]
        with anyio.fail_after(timeout_s):
            done = await anyio.run_process(
                argv, env=self.env(), cwd=self.work_dir / "cwd", check=False
            )
        result = CliResult(
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )
        if check and result.returncode != 0:
            words = " ".join(a for a in args[:2] if not a.startswith("{"))
            detail = self.redact(strip_ansi(result.stderr or result.stdout))[-2000:]
            raise E2EError(f"paperclipai {words} exited {result.returncode}: {detail}")
        return result

    # --- start -------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        started = time.monotonic()
        host_dir = await ensure_host_installed(self.host_dir)
        self._node = host_dir / "node24" / "bin" / "node"
        self._cli_js = host_dir / "node_modules" / "paperclipai" / "dist" / "index.js"
        self.timings["install_s"] = time.monotonic() - started
        for sub in ("home", "cwd"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            await self._start_postgres()
            self.timings["postgres_s"] = time.monotonic() - started
            await self._write_config()
            self.timings["config_s"] = time.monotonic() - started
            await self._start_server()
            self.timings["server_s"] = time.monotonic() - started
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()

    async def _script(self, name: str, *args: str) -> str:
        """Run ``host/e2e/<name>`` (bash or node); its last stdout line, or ``E2EError``."""
        runner = str(self._node) if name.endswith(".mjs") else "bash"
        argv = [runner, str(E2E_DIR / name), *args]
        result = await anyio.run_process(argv, env=self.env(), check=False, stderr=subprocess.PIPE)
        if result.returncode != 0:
            detail = self.redact(result.stderr.decode("utf-8", "replace")[-2000:])
            raise E2EError(f"host/e2e/{name} {args[0]} failed ({result.returncode}): {detail}")
        lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    async def _start_postgres(self) -> None:
        for attempt in range(3):  # a port picked by free_port() can be taken before we bind it
            self._pg_started = True
            try:
                port = str(free_port())
                self.database_url = await self._script(
                    "postgres.sh", "start", str(self.pg_dir), port
                )
            except E2EError:
                await self._script("postgres.sh", "stop", str(self.pg_dir))
                await anyio.to_thread.run_sync(_remove_tree, self.pg_dir)
                if attempt == 2:
                    raise
                continue
            pid_line = (self.pg_dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
            self.postmaster_pid = int(pid_line)
            return

    async def _write_config(self) -> None:
        """test-drive writes the instance config; configure.mjs points it at our database."""
        self.port = free_port()
        self.api_base = f"http://127.0.0.1:{self.port}"
        args = (str(self.data_dir), self.database_url, str(self.port))
        await self._script("instance-config.sh", *args)

    async def _choose_port(self) -> None:
        """A fresh free port in ``server.port`` (the server reads its port from the config)."""
        self.port = free_port()
        self.api_base = f"http://127.0.0.1:{self.port}"
        args = (str(self.config_path), self.database_url, str(self.port))
        await self._script("configure.mjs", *args)

    async def _start_server(self) -> None:
        """``paperclipai run`` until ``/api/health`` says ok; a new port if it dies early."""
        argv = [str(self._node), str(self._cli_js), "run", "-d", str(self.data_dir), "--no-repair"]
        self._log_file = self.log_path.open("ab")
        for attempt in range(3):
            if attempt:
                await self._choose_port()
            process = await anyio.open_process(
                argv,
                env=self.env(),
                cwd=self.work_dir / "cwd",
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._process = process
            self.pid = process.pid
            if await self._wait_healthy(process):
                return
            if process.returncode is None:
                break  # alive but never healthy: not a port race
            await process.aclose()
            self._process = None
        raise E2EError(
            f"the server did not report healthy on {self.api_base}:\n"
            f"{self._tail(self.log_path, 40)}"
        )

    async def _wait_healthy(self, process: anyio.abc.Process) -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            with anyio.move_on_after(180):
                while process.returncode is None:
                    try:
                        answer = await client.get(f"{self.api_base}/api/health")
                        if answer.status_code == 200 and answer.json().get("status") == "ok":
                            return True
                    except (httpx.HTTPError, ValueError):
                        pass
                    await anyio.sleep(0.5)
        return False

    # --- stop --------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop the server (and its plugin workers), then PostgreSQL; idempotent, bounded."""
        process, self._process = self._process, None
        if process is not None:
            ours = [process.pid, *descendants(process.pid)]
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with anyio.move_on_after(SERVER_STOP_S):
                    await process.wait()
                if process.returncode is None:
                    _kill_group(process.pid, signal.SIGKILL)
                    with anyio.move_on_after(10):
                        await process.wait()
            await process.aclose()
            await self._reap(ours)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._pg_started:
            self._pg_started = False
            cluster = []
            if self.postmaster_pid is not None:
                cluster = [self.postmaster_pid, *descendants(self.postmaster_pid)]
            try:
                with anyio.fail_after(60):  # pg_ctl itself gives up after 30 s
                    await self._script("postgres.sh", "stop", str(self.pg_dir))
            finally:
                await self._reap(cluster)

    async def _reap(self, pids: Sequence[int]) -> None:
        """Wait briefly for ``pids`` to end; SIGKILL and record the ones that do not."""
        for pid in pids:
            if not await wait_until_gone(pid, 10.0):
                self.leftover_pids.append(pid)
                _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _kill_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
