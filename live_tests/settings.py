"""What the live smoke tests run against, read from the environment.

``CREATEOS_LIVE_TEST``:
  unset, empty or ``0``  every live test is skipped;
  ``1``                  a real CreateOS account: ``CREATEOS_API_URL``, ``CREATEOS_API_KEY`` and
                         ``CREATEOS_SHAPE`` are required, ``CREATEOS_ROOTFS`` is optional;
  ``emulator``           the embedded emulator with a throwaway key (what CI runs).
``CREATEOS_LIVE_HOST`` picks who runs the worker: ``auto`` (default: the real Paperclip worker
manager when Node is present), ``node`` or ``python`` (the Python stdio host).
``CREATEOS_SECOND_API_KEY`` (optional, real mode): another account's key, for the doctor's
"another key's sandbox answers 404" check (``live_tests/test_doctor.py``; skipped without it).
``CREATEOS_EGRESS_ALLOWLIST`` (optional, either mode): comma-separated egress rules (``*``, a host
such as ``github.com`` or ``*.example.com``, an IP address or CIDR, optionally with ``:port``) put
into the config's ``egressAllowlist``; blanks around and between entries are ignored, entries are
normalized as the worker does (lower-case hosts, duplicates dropped) and a bad one is refused by
position. A restrictive list puts every test's sandbox behind it (on the emulator: loopback only).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from devtools.demo_hosts import HOST_CHOICES, HostChoice
from provider.egress_rules import ACCEPTED_FORMS, RuleError, normalize_rule

MODE_VARIABLE: Final = "CREATEOS_LIVE_TEST"
HOST_VARIABLE: Final = "CREATEOS_LIVE_HOST"
EGRESS_VARIABLE: Final = "CREATEOS_EGRESS_ALLOWLIST"
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
    egress_allowlist: tuple[str, ...] = ()  # normalized; empty: the config leaves it unset
    second_api_key: str = field(default="", repr=False)  # another account's key (doctor)


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


def egress_allowlist(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``CREATEOS_EGRESS_ALLOWLIST`` as normalized rules (see the module docstring)."""
    rules: list[str] = []
    entries = [e for e in environ.get(EGRESS_VARIABLE, "").split(",") if e.strip()]
    for position, entry in enumerate(entries, start=1):
        try:
            rule = normalize_rule(entry)
        except RuleError as exc:  # the reason never quotes the entry
            raise LiveSettingsError(
                f"{EGRESS_VARIABLE} entry {position} is not an egress rule ({exc.reason}): "
                f"{ACCEPTED_FORMS}"
            ) from None
        if rule not in rules:
            rules.append(rule)
    return tuple(rules)


def load_settings(environ: Mapping[str, str] | None = None) -> LiveSettings:
    env = os.environ if environ is None else environ
    mode = live_mode(env)
    host = env.get(HOST_VARIABLE, "auto").strip() or "auto"
    if host not in HOST_CHOICES:
        raise LiveSettingsError(f"{HOST_VARIABLE} must be one of {', '.join(HOST_CHOICES)}")
    choice: HostChoice = "node" if host == "node" else "python" if host == "python" else "auto"
    rootfs = env.get("CREATEOS_ROOTFS", "").strip() or None
    egress = egress_allowlist(env)
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
            egress_allowlist=egress,
            second_api_key=env.get("CREATEOS_SECOND_API_KEY", "").strip(),
        )
    shape = env.get("CREATEOS_SHAPE", "").strip() or EMULATOR_SHAPE
    return LiveSettings(
        mode=mode,
        host=choice,
        shape=shape,
        rootfs=rootfs,
        api_key=secrets.token_urlsafe(18),
        egress_allowlist=egress,
        second_api_key=secrets.token_urlsafe(18),
    )
