"""CreateOS emulator: a loopback server speaking the CreateOS Sandbox API.

Sandboxes run as real processes isolated with bubblewrap.

This package imports nothing from the worker side of ``provider`` (rpc, driver, createos, config,
errors).
"""

from .bwrap import BwrapUnavailable
from .client import EmulatorAdmin, EmulatorAdminError
from .server import Emulator

__all__ = ["BwrapUnavailable", "Emulator", "EmulatorAdmin", "EmulatorAdminError"]
