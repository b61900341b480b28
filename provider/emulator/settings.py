"""Emulator settings: behaviour knobs tests change through ``PATCH /_emulator/settings``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .journal import JournalLimits

CREATE_MODES = ("sync", "async")


@dataclass
class Settings:
    """Every knob with its default; names are part of the admin interface."""

    create_mode: str = "sync"
    create_omits_status: bool = False  # create answers the TS SDK's body (no status, no view field)
    create_delay_ms: int = 0
    pause_delay_ms: int = 200
    resume_delay_ms: int = 100
    delete_delay_ms: int = 0
    stale_reads: int = 0
    fork_busy_ms: int = 0
    rate_limit: bool = False
    rate_limit_per_minute: int = 300
    journal_bytes: int = 1 << 20
    heartbeat_ms: int = 5000
    min_auto_pause_seconds: int = 60
    auto_pause_time_scale: float = 1.0  # idle pause after N x this many seconds (float > 0)
    accept_any_shape: bool = False
    destroyed_retention_ms: int = 5000
    max_file_bytes: int = 512 << 20
    region: str = "us"
    # Extensions beyond the brief's list.
    backpressure_ms: int = 10_000  # how long a slow attached reader may hold back a producer
    exit_drain_ms: int = 100  # after the leader exits, wait this long for pipes to reach EOF
    no_credit: bool = False  # answer 402 to create, resume and fork
    exec_stream: bool = True  # false: an "older server", /exec?stream=true answers 404
    max_exec_body_bytes: int = 4 << 20  # the largest exec JSON body accepted (else 413)
    guest_agent: bool = True  # false: sandboxes booted from now on get no 127.0.0.1:1029

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def journal_limits(self) -> JournalLimits:
        return JournalLimits(self.journal_bytes, self.backpressure_ms)

    def update(self, changes: dict[str, Any]) -> dict[str, str]:
        """Apply ``changes``; answers a field -> message map of refused ones (nothing applied)."""
        errors: dict[str, str] = {}
        fields = {f.name: f for f in dataclasses.fields(self)}
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            field = fields.get(name)
            if field is None:
                errors[name] = "unknown setting"
                continue
            kind = type(getattr(self, name))
            if kind is bool:
                ok = isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif kind is float:
                ok = (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                    and value > 0
                )
                value = float(value) if ok else value
            else:
                ok = isinstance(value, str) and bool(value)
            if name == "create_mode" and value not in CREATE_MODES:
                ok = False
            if (
                name in ("journal_bytes", "rate_limit_per_minute", "max_exec_body_bytes")
                and ok
                and value < 1
            ):
                ok = False
            if not ok:
                errors[name] = f"invalid value for {name}"
                continue
            checked[name] = value
        if not errors:
            for name, value in checked.items():
                setattr(self, name, value)
        return errors
