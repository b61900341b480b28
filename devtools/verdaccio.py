"""A real npm registry (verdaccio) on loopback, with a throwaway config and storage.

``host/e2e/install-verdaccio.sh`` installs the pinned verdaccio into ``.cache/verdaccio`` on
first use (flock-guarded, reused when present); verdaccio 6 needs Node 22+, so it runs under the
full server's Node 24. The config has no uplink (a name it does not hold is a 404, as the public
registry answers an unknown name), no web UI, htpasswd auth (anyone may read, a user added with
:meth:`Verdaccio.add_user` may publish) and a JSON request log that :meth:`requests` reads::

    async with running_verdaccio(tmp / "registry", node) as registry:
        token = await registry.add_user("publisher")
        ...  # NPM_TOKEN=token packaging/publish.py --registry registry.url
    assert "GET /paperclip-plugin-createos" in [f"{r.method} {r.path}" for r in registry.requests()]

Everything it writes lives under ``work_dir``; the caller deletes that folder.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc
import httpx

from devtools.e2e_server import E2E_DIR, E2EError, free_port

STOP_S: Final = 10.0
READY_S: Final = 60.0
_HTTP_LEVEL: Final = 25  # verdaccio's "http" log level: one line per answered request


@dataclass(frozen=True)
class RegistryRequest:
    """One answered request: method, decoded path (no query) and status."""

    method: str
    path: str
    status: int


async def ensure_verdaccio_installed() -> Path:
    """Run ``host/e2e/install-verdaccio.sh`` (idempotent); the verdaccio bin script."""
    script = str(E2E_DIR / "install-verdaccio.sh")
    result = await anyio.run_process(["bash", script], check=False, stderr=subprocess.PIPE)
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace")[-2000:]
        raise E2EError(f"host/e2e/install-verdaccio.sh failed ({result.returncode}):\n{detail}")
    return Path(result.stdout.decode().strip().splitlines()[-1])


def write_config(work_dir: Path) -> Path:
    """config.yaml: local storage and htpasswd under ``work_dir``, no uplinks, no web UI."""
    config = work_dir / "config.yaml"
    lines = [
        f"storage: {json.dumps(str(work_dir / 'storage'))}",
        "auth:",
        "  htpasswd:",
        f"    file: {json.dumps(str(work_dir / 'htpasswd'))}",
        "    max_users: 10",
        "packages:",
        "  '**':",
        "    access: $all",
        "    publish: $authenticated",
        "    unpublish: $authenticated",
        "max_body_size: 200mb",  # a runtime package is about 10 MB (the default limit)
        "web:",
        "  enable: false",
        "log: { type: stdout, format: json, level: http }",
    ]
    config.write_text("\n".join(lines) + "\n")
    return config


@asynccontextmanager
async def running_verdaccio(work_dir: Path, node: Path) -> AsyncIterator[Verdaccio]:
    """A started :class:`Verdaccio`, stopped on the way out (shielded) whatever happened."""
    registry = Verdaccio(work_dir, node)
    try:
        await registry.start()
        yield registry
    finally:
        with anyio.CancelScope(shield=True):
            await registry.stop()


class Verdaccio:
    """Verdaccio on loopback after :meth:`start`; ``url`` ends with ``/``."""

    def __init__(self, work_dir: Path, node: Path) -> None:
        self.work_dir = work_dir
        self.node = node
        self.log_path = work_dir / "verdaccio.log"
        self.url = ""
        self._process: anyio.abc.Process | None = None
        self._log_file: IO[bytes] | None = None

    async def start(self) -> None:
        """Install if needed, write the config, start on a free loopback port, wait for ping."""
        bin_js = await ensure_verdaccio_installed()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = write_config(self.work_dir)
        self._log_file = self.log_path.open("ab")
        for _ in range(3):  # a port picked by free_port() can be taken before we bind it
            port = free_port()
            argv = [str(self.node), str(bin_js), "--config", str(config)]
            argv += ["--listen", f"127.0.0.1:{port}"]
            self._process = await anyio.open_process(
                argv,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.url = f"http://127.0.0.1:{port}/"
            if await self._wait_ready(self._process):
                return
            await self._stop_process()
        raise E2EError(f"verdaccio did not answer /-/ping:\n{self._tail()}")

    async def _wait_ready(self, process: anyio.abc.Process) -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            with anyio.move_on_after(READY_S):
                while process.returncode is None:
                    try:
                        if (await client.get(f"{self.url}-/ping")).status_code == 200:
                            return True
                    except httpx.HTTPError:
                        pass
                    await anyio.sleep(0.2)
        return False

    async def add_user(self, name: str) -> str:
        """Create a user (npm's adduser request) and return its publish token."""
        body = {"name": name, "password": secrets.token_urlsafe(16)}
        async with httpx.AsyncClient(timeout=30.0) as client:
            answer = await client.put(f"{self.url}-/user/org.couchdb.user:{name}", json=body)
        if answer.status_code != 201:
            raise E2EError(f"verdaccio refused the user {name!r}: {answer.status_code}")
        token = answer.json().get("token")
        if not isinstance(token, str) or not token:
            raise E2EError("verdaccio answered the new user without a token")
        return token

    def requests(self) -> list[RegistryRequest]:
        """Every request verdaccio answered so far, in order (from its JSON log)."""
        try:
            lines = self.log_path.read_text("utf-8", "replace").splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # Node's own warnings
            request = entry.get("request") if isinstance(entry, dict) else None
            if entry.get("level") != _HTTP_LEVEL or not isinstance(request, dict):
                continue
            path = unquote(urlsplit(str(request.get("url", ""))).path)
            found.append(RegistryRequest(str(request.get("method")), path, int(entry["status"])))
        return found

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(STOP_S):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
        await process.aclose()

    async def stop(self) -> None:
        """Stop verdaccio (SIGTERM, then SIGKILL); idempotent."""
        await self._stop_process()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
