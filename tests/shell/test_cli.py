"""Refusals of ``python -m provider shell`` (all before any HTTP request, exit code 2) and the
dispatch in ``provider/__main__.py`` (the worker's start path imports nothing of the helper)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from provider.emulator import Emulator

from .local_pty import REPO, helper_env, run_helper

SECRET = "sk-live-Qw7-not-for-output"


@pytest.mark.anyio
async def test_a_missing_key_is_refused_without_any_request(
    emulator: Emulator, tmp_path: Path
) -> None:
    for env in (helper_env(tmp_path, None), helper_env(tmp_path, "  \t ")):
        done = await anyio.to_thread.run_sync(
            run_helper, ["--api-url", emulator.base_url, "sb_anything"], env
        )
        assert done.returncode == 2
        err = done.stderr.decode()
        assert "refused: CREATEOS_API_KEY is not set" in err
        assert "export CREATEOS_API_KEY=" in err and "never taken from the command line" in err
        assert done.stdout == b""
    assert await emulator.admin.requests() == []


@pytest.mark.parametrize(
    "url",
    [
        "http://remote.example",
        "https://user:pw@h.example",
        "https://h.example/?k=v",
        "https://h.example/v1/other",  # a path prefix is fine; /v1 may only end it
        "file:///var/run/x.sock",
        "ftp://h.example",
        "",
    ],
)
def test_a_bad_api_url_is_refused(tmp_path: Path, url: str) -> None:
    done = run_helper(["--api-url", url, "sb_anything"], helper_env(tmp_path, SECRET))
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "refused: --api-url: the URL is not accepted (" in err
    assert "use https://<host>[:port]" in err
    assert SECRET not in err and done.stdout == b""
    if url:
        assert url not in err  # the given URL is not repeated either


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    done = run_helper(["--api-url", "http://remote.example", "../etc"], helper_env(tmp_path, None))
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "CREATEOS_API_KEY is not set" in err
    assert "--api-url: the URL is not accepted (http is only allowed for localhost" in err
    assert "SANDBOX_ID must be 1 to 200 letters" in err
    assert err.rstrip().endswith("usage: python3 -m provider shell [--api-url ORIGIN] SANDBOX_ID")


def test_a_key_with_control_characters_is_refused(tmp_path: Path) -> None:
    done = run_helper(["sb_anything"], helper_env(tmp_path, "sk\x01bad"))
    assert done.returncode == 2
    assert b"CREATEOS_API_KEY holds spaces, control or non-ASCII characters" in done.stderr
    assert b"sk\x01bad" not in done.stderr


@pytest.mark.parametrize("args", [[], ["--api-url"], ["a", "b"], ["--key", "x", "sb_1"]])
def test_bad_arguments_are_refused(tmp_path: Path, args: list[str]) -> None:
    done = run_helper(args, helper_env(tmp_path, SECRET))
    assert done.returncode == 2
    assert b"usage: python3 -m provider shell [--api-url ORIGIN] SANDBOX_ID" in done.stderr


def test_help(tmp_path: Path) -> None:
    done = run_helper(["--help"], helper_env(tmp_path, SECRET))
    assert done.returncode == 0
    assert b"CREATEOS_API_KEY" in done.stdout and b"--api-url" in done.stdout


def test_the_worker_keeps_its_usage_and_its_light_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "provider", "bogus"], cwd=REPO, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert b"usage: python -m provider   (serves the Paperclip host on stdio)" in done.stderr
    assert b"python -m provider shell [--api-url ORIGIN] SANDBOX_ID" in done.stderr
    probe = (
        "import sys, provider.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('anyio', 'httpx', 'pydantic')"
        " or m.startswith('provider.shell')))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == b"[]"
