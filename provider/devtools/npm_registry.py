"""A tiny read-only npm registry on loopback, serving given package tarballs (``npm pack`` output).

Enough of the registry protocol for ``npm install <name>``: ``GET /<name>`` (``/@scope%2fname``
for a scoped name) answers the packument, one version per tarball, built from the tarball's own
``package/package.json`` plus ``dist`` (tarball URL, sha1 ``shasum``, sha512 ``integrity``);
``GET /<name>/-/<file>.tgz`` answers the bytes. Every other request (another name, the audit
endpoint, any method but GET/HEAD) is a 404 with a JSON body, as the public registry answers a
name it does not know. Every request is logged (``requests``) for asserts::

    with NpmRegistry([main_tgz, runtime_tgz]) as registry:
        (plugins_dir / ".npmrc").write_text(f"registry={registry.url}\\n")
        ...
    assert "paperclip-plugin-createos" in registry.packuments_served()

Stdlib only (``http.server`` in a daemon thread); binds 127.0.0.1 on a free port.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tarfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, unquote, urlsplit


class RegistryError(ValueError):
    """A tarball the registry cannot serve (no package.json, duplicate name and version)."""


@dataclass(frozen=True)
class Tarball:
    """One package version: its package.json and the bytes npm downloads."""

    name: str
    version: str
    manifest: dict[str, Any]
    data: bytes

    @property
    def filename(self) -> str:
        """The file name npm's registry uses: the unscoped name, a dash, the version."""
        return f"{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"

    @property
    def shasum(self) -> str:
        return hashlib.sha1(self.data, usedforsecurity=False).hexdigest()

    @property
    def integrity(self) -> str:
        return "sha512-" + base64.b64encode(hashlib.sha512(self.data).digest()).decode()


@dataclass(frozen=True)
class Request:
    """One logged request: method, decoded path (no query) and the status answered."""

    method: str
    path: str
    status: int


def read_tarball(path: Path) -> Tarball:
    """``package/package.json`` of an npm tarball, with the file's bytes."""
    data = path.read_bytes()
    with tarfile.open(path, "r:gz") as tgz:
        try:
            member = tgz.extractfile("package/package.json")
        except KeyError:
            member = None
        if member is None:
            raise RegistryError(f"{path} has no package/package.json")
        manifest = json.loads(member.read())
    name, version = manifest.get("name"), manifest.get("version")
    if not isinstance(name, str) or not isinstance(version, str):
        raise RegistryError(f"{path}: package.json needs a string name and version")
    return Tarball(name, version, manifest, data)


class NpmRegistry:
    """``with NpmRegistry(tarballs) as registry``: ``registry.url`` ends with ``/``."""

    def __init__(self, tarballs: Iterable[Path], host: str = "127.0.0.1", port: int = 0) -> None:
        self.packages: dict[str, dict[str, Tarball]] = {}
        for path in tarballs:
            tarball = read_tarball(path)
            versions = self.packages.setdefault(tarball.name, {})
            if tarball.version in versions:
                raise RegistryError(f"{tarball.name}@{tarball.version} is given twice")
            versions[tarball.version] = tarball
        self.host = host
        self.port = port
        self.url = ""
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- what was asked ------------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def packuments_served(self) -> list[str]:
        """Names whose packument was answered 200, in request order (repeats kept)."""
        return [
            unquote(r.path.lstrip("/"))
            for r in self.requests
            if r.status == 200 and "/-/" not in r.path
        ]

    def tarballs_served(self) -> list[str]:
        """File names of the tarballs answered 200, in request order."""
        return [
            r.path.rsplit("/", 1)[-1] for r in self.requests if r.status == 200 and "/-/" in r.path
        ]

    def not_found(self) -> list[str]:
        """Paths answered 404 (names npm asked for that this registry does not hold)."""
        return [r.path for r in self.requests if r.status == 404]

    def _log(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    # --- answers -------------------------------------------------------------------------------

    def packument(self, name: str) -> dict[str, Any] | None:
        versions = self.packages.get(name)
        if not versions:
            return None
        base = self.url.rstrip("/")
        entries = {}
        for version, tarball in versions.items():
            entries[version] = {
                **tarball.manifest,
                "_id": f"{name}@{version}",
                "dist": {
                    "tarball": f"{base}/{name}/-/{tarball.filename}",
                    "shasum": tarball.shasum,
                    "integrity": tarball.integrity,
                },
            }
        releases = [v for v in versions if "-" not in v] or list(versions)
        latest = max(releases, key=_version_key)  # the highest release, as after npm publish
        return {"_id": name, "name": name, "dist-tags": {"latest": latest}, "versions": entries}

    def tarball(self, name: str, filename: str) -> bytes | None:
        for tarball in self.packages.get(name, {}).values():
            if tarball.filename == filename:
                return tarball.data
        return None

    def answer(self, method: str, raw_path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request; pure apart from the URL."""
        path = unquote(urlsplit(raw_path).path)
        if method in ("GET", "HEAD"):
            if "/-/" in path:
                name, _, filename = path.lstrip("/").partition("/-/")
                data = self.tarball(name, filename)
                if data is not None:
                    return 200, "application/octet-stream", data
            else:
                packument = self.packument(path.lstrip("/"))
                if packument is not None:
                    return 200, "application/json", json.dumps(packument).encode()
        return 404, "application/json", json.dumps({"error": "Not found"}).encode()

    # --- start and stop ------------------------------------------------------------------------

    def start(self) -> None:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)  # a POST (npm audit) body: drain it, answer 404
                status, kind, body = registry.answer(self.command, self.path)
                registry._log(Request(self.command, unquote(urlsplit(self.path).path), status))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # requests are logged in registry.requests instead

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self.url = f"http://{self.host}:{self.port}/"
        self._thread = threading.Thread(
            target=server.serve_forever, name="npm-registry", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def packument_path(name: str) -> str:
    """The request path of a packument: ``/name``, or ``/@scope%2Fname`` for a scoped name."""
    return "/" + quote(name, safe="@")


def _version_key(version: str) -> tuple[tuple[int, ...], int, str]:
    """Semver order, enough for dist-tags.latest: release numbers, then a release after its
    prereleases (prerelease tags compared as text)."""
    release, _, pre = version.partition("-")
    numbers = tuple(int(part) for part in release.split(".") if part.isdigit())
    return numbers, 0 if pre else 1, pre
