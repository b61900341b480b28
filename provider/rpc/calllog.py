"""Opt-in timing log of served requests, for benchmarks: ``PAPERCLIP_CREATEOS_CALL_LOG=<file>``.

Each answered request appends one JSON line ``{"method", "start", "ms", "ok"}`` (``start`` in
Unix seconds, ``ms`` from the request's arrival to its reply being written, ``ok`` false for an
error reply). Only the method name is recorded, never params or results, so the file can hold
no secret. Off unless the variable names a file; a file that cannot be written turns the log
off with one line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Final

import anyio

CALL_LOG_ENV: Final = "PAPERCLIP_CREATEOS_CALL_LOG"


class CallLog:
    """Appends one line per served request to ``path`` (writes run in a worker thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = anyio.Lock()
        self._broken = False

    @classmethod
    def from_environment(cls) -> CallLog | None:
        path = os.environ.get(CALL_LOG_ENV, "").strip()
        return cls(path) if path else None

    async def record(self, method: str, started: float, ok: bool) -> None:
        """``started`` is the ``time.monotonic()`` of the request's arrival."""
        if self._broken:
            return
        elapsed = time.monotonic() - started
        line = json.dumps(
            {
                "method": method,
                "start": round(time.time() - elapsed, 6),
                "ms": round(elapsed * 1000, 3),
                "ok": ok,
            }
        )
        async with self._lock:
            try:
                await anyio.to_thread.run_sync(self._append, line)
            except OSError as exc:
                self._broken = True
                print(f"call log disabled: cannot write {self.path}: {exc}", file=sys.stderr)

    def _append(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
