"""The pacing folder is one per account and machine: every Paperclip instance and every tool run
by the account lands on the same per-origin files, whatever its environment says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provider.createos import pacer as pacer_module
from provider.createos.pacer import ENV_INTERVAL_MS, ENV_RUNTIME_DIR, default_runtime_dir, pacer_for

ACCOUNT_FOLDER = Path(f"/tmp/paperclip-createos-{os.getuid()}")


@pytest.mark.parametrize(
    "environ",
    [
        {},  # a worker under the host: a scrubbed environment
        {"PAPERCLIP_PLUGIN_ID": "6f1c2a43-8d0e-4a55-9d0b-2f5e8c4b7a10"},  # another instance
        {"XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/var/tmp/op"},  # a login shell
        {"XDG_STATE_HOME": "/srv/state", "HOME": "/home/op", ENV_RUNTIME_DIR: "  "},
    ],
)
def test_the_folder_ignores_everything_but_the_override(environ: dict[str, str]) -> None:
    assert default_runtime_dir(environ) == ACCOUNT_FOLDER


def test_the_override_names_the_folder() -> None:
    assert default_runtime_dir({ENV_RUNTIME_DIR: "/srv/pace"}) == Path("/srv/pace")


def test_pacers_of_a_scrubbed_environment_use_the_account_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pacer_module, "_registry", {})
    for name in (ENV_RUNTIME_DIR, ENV_INTERVAL_MS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent-runtime")
    monkeypatch.setenv("TMPDIR", "/nonexistent-tmp")

    pacer = pacer_for("https://api.sb.createos.sh")

    assert pacer.shared_path is not None and pacer.shared_path.parent == ACCOUNT_FOLDER
