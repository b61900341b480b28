"""`make publish` (packaging/publish.py) with the real npm client against a scripted registry.

The registry is pytest-httpserver: it records every request and answers a publish (``PUT
/<name>``) with what a test scripts, so order, authentication, the stop at the first failure and
the report of what was published can be asserted exactly. The tarballs are tiny npm packages with
the names and version of release.toml (what publish.py checks); the real build is published to
a real registry by tests/e2e/test_package_install_e2e.py.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tests.packaging.conftest import REPO_ROOT, host_key

RELEASE: dict[str, Any] = tomllib.loads((REPO_ROOT / "release.toml").read_text())
MAIN: str = RELEASE["name"]
VERSION: str = RELEASE["version"]
RUNTIMES: list[str] = RELEASE["publish"]["runtimes"]
HOST_RUNTIME = f"paperclip-createos-runtime-{host_key()}"
SCRIPT = REPO_ROOT / "packaging" / "publish.py"
TOKEN = "npm_publishtesttoken0123456789abcdef"  # made up for the test

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not on PATH")


def fake_package(dist: Path, name: str, version: str = VERSION) -> Path:
    """``<dist>/<name>-<version>.tgz`` holding only package/package.json."""
    dist.mkdir(parents=True, exist_ok=True)
    path = dist / f"{name}-{VERSION}.tgz"
    data = json.dumps({"name": name, "version": version, "license": "MIT"}).encode()
    with tarfile.open(path, "w:gz") as tgz:
        info = tarfile.TarInfo("package/package.json")
        info.size = len(data)
        tgz.addfile(info, io.BytesIO(data))
    return path


def run_publish(
    *args: str, token: str | None = TOKEN, registry_env: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env.pop("NPM_TOKEN", None)
    if token is not None:
        env["NPM_TOKEN"] = token
    if registry_env is not None:  # where a dry run asks whether the version exists
        env["npm_config_registry"] = registry_env
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


class Registry:
    """Records requests; answers ``PUT /<name>`` with ``status_of(name)``, GETs with 404."""

    def __init__(self, server: HTTPServer, failing: set[str] | None = None) -> None:
        self.server = server
        self.failing = failing or set()
        self.seen: list[tuple[str, str, str]] = []  # method, path, authorization
        server.expect_request(re.compile(".*")).respond_with_handler(self.answer)

    def answer(self, request: Request) -> Response:
        self.seen.append((request.method, request.path, request.headers.get("Authorization", "")))
        if request.method == "PUT":
            name = request.path.lstrip("/").replace("%2f", "/")
            if name in self.failing:
                # npm's answer to a version that exists (a 5xx would be retried for a minute)
                body = '{"error":"cannot publish over the previously published versions"}'
                return Response(body, 403, content_type="application/json")
            return Response('{"ok":"created"}', 201, content_type="application/json")
        return Response('{"error":"not found"}', 404, content_type="application/json")

    def puts(self) -> list[str]:
        return [path.lstrip("/") for method, path, _ in self.seen if method == "PUT"]


def test_publishes_the_runtime_then_the_plugin_with_the_token_from_the_environment(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    registry = Registry(httpserver)
    for name in (HOST_RUNTIME, MAIN):
        fake_package(tmp_path, name)
    url = httpserver.url_for("/")
    done = run_publish("--dist", str(tmp_path), "--platforms", "host", "--registry", url)
    assert done.returncode == 0, done.stderr
    assert registry.puts() == [HOST_RUNTIME, MAIN]
    auth = {a for method, _, a in registry.seen if method == "PUT"}
    assert auth == {f"Bearer {TOKEN}"}
    assert TOKEN not in done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"published {HOST_RUNTIME}-{VERSION}.tgz",
        f"published {MAIN}-{VERSION}.tgz",
        f"2 packages ({url})",
    ]


def test_the_first_failure_stops_the_run_and_says_what_was_published(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    registry = Registry(httpserver, failing={RUNTIMES[1]})
    for name in (*RUNTIMES, MAIN):
        fake_package(tmp_path, name)
    done = run_publish("--dist", str(tmp_path), "--registry", httpserver.url_for("/"))
    assert done.returncode == 1
    assert registry.puts() == RUNTIMES[:2], "nothing is sent after the failed one"
    assert f"npm publish of {RUNTIMES[1]}-{VERSION}.tgz failed" in done.stderr
    assert f"published before it: {RUNTIMES[0]}\n" in done.stderr
    assert f"not published: {', '.join([*RUNTIMES[1:], MAIN])}" in done.stderr
    assert "npm error" in done.stderr  # npm's own reason, not its file listing
    assert TOKEN not in done.stdout + done.stderr


@pytest.mark.parametrize("case", ["missing", "stale", "no-token"])
def test_nothing_is_sent_when_the_publish_set_or_the_token_is_wrong(
    tmp_path: Path, httpserver: HTTPServer, case: str
) -> None:
    registry = Registry(httpserver)
    fake_package(tmp_path, MAIN)
    if case != "missing":
        fake_package(tmp_path, HOST_RUNTIME, "0.0.1" if case == "stale" else VERSION)
    url = httpserver.url_for("/")
    token = None if case == "no-token" else TOKEN
    done = run_publish(
        "--dist", str(tmp_path), "--platforms", "host", "--registry", url, token=token
    )
    assert done.returncode == 1
    assert registry.seen == []
    expected = {
        "missing": f"lacks {HOST_RUNTIME}-{VERSION}.tgz: run `make package` first",
        "stale": f"holds {HOST_RUNTIME}@0.0.1, not {HOST_RUNTIME}@{VERSION}",
        "no-token": "REGISTRY is set but $NPM_TOKEN is empty",
    }[case]
    assert expected in done.stderr


def test_a_dry_run_publishes_nothing(tmp_path: Path, httpserver: HTTPServer) -> None:
    registry = Registry(httpserver)
    for name in (*RUNTIMES, MAIN):
        fake_package(tmp_path, name)
    done = run_publish("--dist", str(tmp_path), token=None, registry_env=httpserver.url_for("/"))
    assert done.returncode == 0, done.stderr
    assert registry.puts() == []
    assert done.stdout.splitlines()[:-1] == [
        f"would publish {name}-{VERSION}.tgz" for name in (*RUNTIMES, MAIN)
    ]
