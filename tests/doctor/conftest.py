"""Fixtures for the doctor tests: the scripted endpoint and a runner of the real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from tests.doctor.fake_api import FakeCreateOS

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    def row(self, assumption_start: str) -> str:
        """The table row whose assumption starts with ``assumption_start``."""
        rows = [line for line in self.stdout.splitlines() if assumption_start in line]
        assert len(rows) == 1, (assumption_start, self.stdout)
        return rows[0]


def doctor_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "provider", "doctor", *args]


def doctor_env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CREATEOS_")}
    return {**clean, "PAPERCLIP_CREATEOS_PACE_MS": "0", **extra}


def run_doctor(args: Sequence[str], **env: str) -> Ran:
    done = subprocess.run(
        doctor_argv(*args),
        cwd=REPO_ROOT,
        env=doctor_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def key_file(tmp_path: Path, name: str, key: str) -> str:
    path = tmp_path / name
    path.write_text(key + "\n")
    return str(path)


@pytest.fixture
def fake() -> Iterator[tuple[FakeCreateOS, str]]:
    """The scripted endpoint (threaded: streams and other calls overlap) and its origin."""
    server = HTTPServer(threaded=True)
    server.start()
    api = FakeCreateOS()
    server.expect_request(re.compile("^/")).respond_with_handler(api.handle)
    try:
        yield api, server.url_for("/").rstrip("/")
    finally:
        server.clear()
        server.stop()
