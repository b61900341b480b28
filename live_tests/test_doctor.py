"""Live: ``python -m provider doctor`` finds every API assumption of the worker holding.

Against a real account (``CREATEOS_LIVE_TEST=1``) it creates one sandbox of
``CREATEOS_SHAPE`` and takes about five minutes (the 60 s idle window is checked for real);
``CREATEOS_SECOND_API_KEY`` enables the other-key check. Against the emulator
(``CREATEOS_LIVE_TEST=emulator``) the idle floor is lowered so a 2 s window is checked. The
test passes when the doctor exits 0 (every check ok or skipped); otherwise its table is the
failure report (scrubbed of the keys by the conftest).
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Final

import anyio
import pytest

from live_tests.settings import LiveSettings
from provider.emulator import BwrapUnavailable, Emulator

pytestmark = pytest.mark.anyio

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S: Final = 1200
EMULATOR_SETTINGS: Final = {"min_auto_pause_seconds": 1, "heartbeat_ms": 1000}
EMULATOR_ARGS: Final = ("--auto-pause-seconds", "2", "--stream-seconds", "3")


def _key_file(folder: Path, name: str, key: str) -> str:
    path = folder / name
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return str(path)


def _doctor(api_url: str, keys: list[str], folder: Path, *extra: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "provider", "doctor", "--api-url", api_url]
    argv += ["--api-key-file", _key_file(folder, "key", keys[0])]
    if len(keys) > 1 and keys[1]:
        argv += ["--second-api-key-file", _key_file(folder, "second", keys[1])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREATEOS_")}
    done = subprocess.run(
        [*argv, *extra],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


async def test_the_doctor_finds_every_assumption_holding(
    live_settings: LiveSettings, tmp_path: Path
) -> None:
    keys = [live_settings.api_key, live_settings.second_api_key]
    if live_settings.mode == "emulator":
        async with AsyncExitStack() as stack:
            emulator = Emulator(api_keys=keys, settings=EMULATOR_SETTINGS)
            try:
                await stack.enter_async_context(emulator)
            except BwrapUnavailable as exc:
                pytest.skip(f"the emulator cannot sandbox here: {exc}")
            code, output = await anyio.to_thread.run_sync(
                _doctor, emulator.base_url, keys, tmp_path, *EMULATOR_ARGS
            )
    else:
        assert live_settings.api_url is not None
        extra = ["--shape", live_settings.shape]
        if live_settings.rootfs:
            extra += ["--rootfs", live_settings.rootfs]
        code, output = await anyio.to_thread.run_sync(
            _doctor, live_settings.api_url, keys, tmp_path, *extra
        )
    assert code == 0, output
    assert "sandboxes created: 1, deleted: 1" in output
