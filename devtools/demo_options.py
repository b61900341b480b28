"""What the demo was asked to do: :class:`DemoOptions`, parsed by :mod:`devtools.demo` and read
by the session every step uses (its own module so neither has to import the other)."""

from __future__ import annotations

from dataclasses import dataclass

from devtools.demo_hosts import HostChoice


@dataclass(frozen=True)
class DemoOptions:
    api_url: str | None  # None: the embedded emulator
    api_key: str
    shape: str
    rootfs: str | None
    host: HostChoice
    keep: bool
