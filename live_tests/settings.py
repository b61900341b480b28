"""What the live smoke tests run against, read from the environment.

``CREATEOS_LIVE_TEST``:
  unset, empty or ``0``  every live test is skipped;
  ``1``                  a real CreateOS account: ``CREATEOS_API_URL``, ``CREATEOS_API_KEY`` and
                         ``CREATEOS_SHAPE`` are required, ``CREATEOS_ROOTFS`` is optional;
  ``emulator``           the embedded emulator with a throwaway key (what CI runs).
``CREATEOS_LIVE_HOST`` picks who runs the worker: ``auto`` (default: the real Paperclip worker
manager when Node is present), ``node`` or ``python`` (the Python stdio host).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from provider.devtools.demo_hosts import HOST_CHOICES, HostChoice

MODE_VARIABLE: Final = "CREATEOS_LIVE_TEST"
HOST_VARIABLE: Final = "CREATEOS_LIVE_HOST"
REQUIRED_FOR_REAL: Final = ("CREATEOS_API_URL", "CREATEOS_API_KEY", "CREATEOS_SHAPE")
EMULATOR_SHAPE: Final = "s-1vcpu-1gb"
SKIP_REASON: Final = (
    f"live smoke tests are opt-in: set {MODE_VARIABLE}=1 (with CREATEOS_API_URL, "
    f"CREATEOS_API_KEY, CREATEOS_SHAPE) or {MODE_VARIABLE}=emulator"
)

Mode = Literal["off", "real", "emulator"]


class LiveSettingsError(Exception):
    """The environment asks for live tests but is incomplete; names variables, never values."""


@dataclass(frozen=True)
class LiveSettings:
    mode: Mode
    host: HostChoice
    shape: str = EMULATOR_SHAPE
    rootfs: str | None = None
    api_url: str | None = None  # None in emulator mode: the fixture fills in the emulator's URL
    api_key: str = field(default="", repr=False)


def live_mode(environ: Mapping[str, str] | None = None) -> Mode:
    env = os.environ if environ is None else environ
    value = env.get(MODE_VARIABLE, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return "off"
    if value == "emulator":
        return "emulator"
    if value in ("1", "true", "yes"):
        return "real"
    raise LiveSettingsError(f"{MODE_VARIABLE} must be 1, emulator or unset")


def load_settings(environ: Mapping[str, str] | None = None) -> LiveSettings:
    env = os.environ if environ is None else environ
    mode = live_mode(env)
    host = env.get(HOST_VARIABLE, "auto").strip() or "auto"
    if host not in HOST_CHOICES:
        raise LiveSettingsError(f"{HOST_VARIABLE} must be one of {', '.join(HOST_CHOICES)}")
    choice: HostChoice = "node" if host == "node" else "python" if host == "python" else "auto"
    rootfs = env.get("CREATEOS_ROOTFS", "").strip() or None
    if mode == "real":
        missing = [name for name in REQUIRED_FOR_REAL if not env.get(name, "").strip()]
        if missing:
            raise LiveSettingsError(
                f"{MODE_VARIABLE}=1 needs {', '.join(missing)} (set them in the environment)"
            )
        return LiveSettings(
            mode=mode,
            host=choice,
            shape=env["CREATEOS_SHAPE"].strip(),
            rootfs=rootfs,
            api_url=env["CREATEOS_API_URL"].strip(),
            api_key=env["CREATEOS_API_KEY"].strip(),
        )
    shape = env.get("CREATEOS_SHAPE", "").strip() or EMULATOR_SHAPE
    return LiveSettings(
        mode=mode, host=choice, shape=shape, rootfs=rootfs, api_key=secrets.token_urlsafe(18)
    )
