"""The reuse rules: which leases are kept, which kept sandboxes go.

Pure functions, no I/O (docs/protocol.md 2.3.3, 2.10, 2.13):

- :func:`is_reusable`: at acquire, a lease is reusable only when the environment reuses leases
  and the acquire names an execution workspace and an agent (only then does the host ever offer
  it for resume). Probes, login and ad-hoc leases are disposable.
- (whether a released lease is kept also depends on its stored warm window:
  :func:`provider.driver.leases.placement.is_keepable`)
- which kept sandboxes are ours: named by :mod:`provider.driver.core.names`
  (``pc-<scope tag>-<uuid>``), so the reaper never touches another environment's.
- :func:`select_for_reaping`: which kept sandboxes the reaper deletes: those idle longer than
  ``reuseMaxIdleSeconds``, then the oldest beyond ``reuseMaxKeptSandboxes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from provider.config import EnvironmentConfig
from provider.createos.models import SandboxView
from provider.driver.core.names import is_ours


def is_reusable(config: EnvironmentConfig, execution_workspace_id: Any, agent_id: Any) -> bool:
    """True when the lease may be kept at release (2.10.1)."""
    return config.reuse_lease and _named(execution_workspace_id) and _named(agent_id)


def _named(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def parse_time(text: object) -> float | None:
    """An API timestamp (ISO 8601, ``Z`` or an offset; naive = UTC) as epoch seconds; None for
    anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True)
class ReapChoice:
    """One kept sandbox the reaper deletes, and why."""

    sandbox_id: str
    reason: Literal["idle", "over the cap"]


@dataclass(frozen=True)
class _Kept:
    sandbox_id: str
    since: float | None  # paused_at, else created_at; None when neither is readable


def select_for_reaping(
    views: Iterable[SandboxView],
    *,
    tag: str,
    now: float,
    max_idle_seconds: int,
    max_kept: int,
    current: str,
    current_kept: bool,
    forks: frozenset[str] = frozenset(),
) -> list[ReapChoice]:
    """The kept sandboxes of scope ``tag`` to delete, idle ones first, then oldest first.

    Kept = ``paused`` and named :func:`is_ours` with ``tag``, or one of ``forks`` (the ids of
    this scope's reusable leases forked from a template, which take no name). ``current`` (the
    lease being acquired or released) is never chosen; when ``current_kept`` it counts toward
    the cap even if the listing does not show it paused yet. A sandbox without a readable time
    is never idle and counts as the newest. ``max_idle_seconds`` / ``max_kept`` of 0 mean no
    bound.
    """
    kept: dict[str, _Kept] = {}
    for view in views:
        if view.status == "paused" and (is_ours(view.name, tag) or view.id in forks):
            since = parse_time(view.paused_at)
            if since is None:
                since = parse_time(view.created_at)
            kept.setdefault(view.id, _Kept(view.id, since))
    if current_kept and current not in kept:
        kept[current] = _Kept(current, now)
    chosen: list[ReapChoice] = []
    survivors: list[_Kept] = []
    for entry in kept.values():
        idle = entry.since is not None and now - entry.since > max_idle_seconds
        if max_idle_seconds > 0 and idle and entry.sandbox_id != current:
            chosen.append(ReapChoice(entry.sandbox_id, "idle"))
        else:
            survivors.append(entry)
    excess = len(survivors) - max_kept
    if max_kept > 0 and excess > 0:
        deletable = sorted(
            (entry for entry in survivors if entry.sandbox_id != current),
            key=lambda entry: (math.inf if entry.since is None else entry.since, entry.sandbox_id),
        )
        chosen.extend(ReapChoice(entry.sandbox_id, "over the cap") for entry in deletable[:excess])
    return chosen
