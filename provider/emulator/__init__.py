"""CreateOS emulator: a loopback server speaking the CreateOS Sandbox API, running sandboxes under bubblewrap.

This package imports nothing from the worker side of ``provider`` (rpc, driver, createos).
"""
