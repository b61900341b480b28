"""What a sandbox is made of before it runs: its validated fields and the status vocabulary.

:class:`SandboxSpec` holds the fields a create (or fork) body settles; ``route_inputs.py`` builds
it from a request and :class:`~.sandboxes.Sandbox` keeps it for its life (PATCH and ``PUT
/egress`` change a few fields in place). The status tuples name which states count as live and
which are transitional. :func:`egress_restricts` decides, from the egress list at create or fork,
whether the sandbox's network namespace is loopback-only (else user-mode: ``usernet.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .catalog import DEFAULT_DISK_MIB

LIVE = ("creating", "running", "pausing", "paused", "resuming", "forking", "error")
TRANSITIONAL = ("creating", "pausing", "resuming", "forking", "destroying")


def egress_restricts(egress: list[str] | None) -> bool:
    """Whether a (normalized) egress list limits traffic: non-empty and without ``*`` (absent,
    ``[]`` and ``["*"]`` allow everything; a list holding ``*`` does too)."""
    return bool(egress) and "*" not in (egress or [])


@dataclass
class SandboxSpec:
    """Validated create fields."""

    shape: str
    vcpu: int
    mem_mib: int
    rootfs: str
    region: str
    name: str
    disk_mib: int = DEFAULT_DISK_MIB
    egress: list[str] | None = None
    envs: dict[str, str] = field(default_factory=dict)
    auto_pause_after_seconds: int | None = None
    ingress_enabled: bool = False
    image_root: Path | None = None  # folder of the rootfs image (None = plain host view)
