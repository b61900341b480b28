"""What a lease's sandbox is made of, decided at acquire and checked again at resume and release
(docs/protocol.md 2.9-2.11). Pure functions, no I/O.

- **Egress** (2.9): the environment's base allowlist plus the run's ``networkEgress`` grants
  (``allowFqdns``, ``allowCidrs``), unique and in order; once any rule other than ``*`` remains,
  every ``*`` is dropped, and ``["*"]`` alone becomes ``[]`` (allow all). Both lists are kept in
  the lease metadata; resume re-applies the stored effective list unless the sandbox already
  holds it (:func:`egress_in_place`).
- **Warm window** (2.10): a reusable lease (reuse on, an execution workspace and an agent) is
  created with ``auto_pause_after_seconds`` when the window is at least 60 s, and released warm;
  with window 0 it is paused at release, as before. Disposable leases have no window.
- **Rootfs per adapter** (2.11): ``rootfsByAdapter[adapterType]``, else ``rootfs``, else none;
  none with a ``snapshot``.
- **Snapshot** (8.4): a lease of an environment bound to a template forks that paused sandbox
  instead of creating one. The fork always names its egress (``["*"]`` for allow-all, since an
  empty list would inherit the template's) and sets the window by PATCH afterwards.

A lease whose stored base list, window, rootfs or snapshot no longer matches the current config
is gone at resume (the host then acquires a fresh one), and is not kept at release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provider.config import EnvironmentConfig
from provider.config_fields import MIN_AUTO_PAUSE_SECONDS, egress_rules
from provider.driver.leases.reuse import is_reusable
from provider.egress_rules import RuleError, normalize_rule
from provider.errors import ConfigError, RequestRefused


@dataclass(frozen=True)
class Placement:
    rootfs: str | None
    adapter_type: str | None
    base_egress: tuple[str, ...]
    effective_egress: tuple[str, ...]
    reusable: bool
    window: int | None  # autoPauseAfterSeconds of a reusable lease; None for a disposable one
    snapshot: str | None = None  # the template sandbox a lease forks (8.4)

    @property
    def idle_pause(self) -> int | None:
        """The window CreateOS idle-pauses the sandbox after (a warm lease), else None."""
        if self.window is not None and self.window >= MIN_AUTO_PAUSE_SECONDS:
            return self.window
        return None

    def create_fields(self) -> dict[str, Any]:
        """What the create body adds: ``egress`` when restrictive, the window when warm."""
        fields: dict[str, Any] = {}
        if self.effective_egress:
            fields["egress"] = list(self.effective_egress)
        if self.idle_pause is not None:
            fields["auto_pause_after_seconds"] = self.idle_pause
        return fields

    def fork_egress(self) -> list[str]:
        """The fork's ``egress`` (2.9.3): the effective list, or ``["*"]`` for allow-all."""
        return list(self.effective_egress) or ["*"]

    def window_patch(self) -> dict[str, Any]:
        """The PATCH a fork gets (2.10.2), as :meth:`CreateOSClient.patch_sandbox` keywords: a
        warm window arms the idle pause, anything else disarms the one the fork inherited."""
        if self.idle_pause is not None:
            return {"auto_pause_after_seconds": self.idle_pause}
        return {"disable_auto_pause": True}

    def metadata(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "rootfs": self.rootfs,
            "adapterType": self.adapter_type,
            "reuseLease": self.reusable,
            "baseEgressAllowlist": list(self.base_egress),
            "effectiveEgressAllowlist": list(self.effective_egress),
            "autoPauseAfterSeconds": self.window,
        }


def effective_rootfs(config: EnvironmentConfig, adapter_type: str | None) -> str | None:
    if config.snapshot is not None:
        return None  # the template is the image
    if adapter_type is not None and adapter_type in config.rootfs_by_adapter:
        return config.rootfs_by_adapter[adapter_type]
    return config.rootfs


def merge_egress(base: Sequence[str], grants: Sequence[str]) -> tuple[str, ...]:
    merged: list[str] = []
    for rule in (*base, *grants):
        if rule not in merged:
            merged.append(rule)
    if any(rule != "*" for rule in merged):
        return tuple(rule for rule in merged if rule != "*")
    return ()  # nothing, or only "*": allow all


def egress_grants(settings: object) -> list[str]:
    """The run's grants from ``executionWorkspaceSettings.networkEgress`` (2.9.1); anything
    malformed is refused before any request, naming the field and the entry's position."""
    if settings is None:
        return []
    if not isinstance(settings, Mapping):
        raise RequestRefused("executionWorkspaceSettings must be an object when given.")
    egress = settings.get("networkEgress")
    if egress is None:
        return []
    if not isinstance(egress, Mapping):
        raise RequestRefused(
            "executionWorkspaceSettings.networkEgress must be an object with optional "
            "allowFqdns and allowCidrs arrays."
        )
    grants: list[str] = []
    for key in ("allowFqdns", "allowCidrs"):
        values = egress.get(key)
        if values is None:
            continue
        try:
            grants.extend(egress_rules(values, f"networkEgress.{key}"))
        except ConfigError as exc:
            raise RequestRefused(str(exc)) from None
    return grants


def plan_placement(
    config: EnvironmentConfig,
    *,
    adapter_type: object,
    workspace_settings: object,
    execution_workspace_id: object,
    agent_id: object,
) -> Placement:
    adapter = adapter_type if isinstance(adapter_type, str) and adapter_type else None
    grants = egress_grants(workspace_settings)
    reusable = is_reusable(config, execution_workspace_id, agent_id)
    return Placement(
        rootfs=effective_rootfs(config, adapter),
        adapter_type=adapter,
        base_egress=config.egress_allowlist,
        effective_egress=merge_egress(config.egress_allowlist, grants),
        reusable=reusable,
        window=config.auto_pause_after_seconds if reusable else None,
        snapshot=config.snapshot,
    )


def stored_egress(metadata: Mapping[str, Any]) -> list[str] | None:
    """The metadata's effective list if every rule still passes the grammar, else None."""
    stored = metadata.get("effectiveEgressAllowlist")
    if not isinstance(stored, list):
        return None
    try:
        return [normalize_rule(rule) for rule in stored]
    except RuleError:
        return None


def egress_in_place(current: object, stored: Sequence[str]) -> bool:
    """Whether a sandbox view's ``egress`` (``current``) already is the ``stored`` effective
    list, so resume needs no PUT (2.9.4): the same list, or allow-all either way (``[]``
    stored, ``["*"]`` held: a fork's allow-all, 2.9.3). Anything else, absent included, is not."""
    if not isinstance(current, list):
        return False
    return current == list(stored) or (not stored and current == ["*"])


def placement_changed(config: EnvironmentConfig, metadata: Mapping[str, Any]) -> bool:
    """Resume (2.4.2): True when the lease no longer matches the current config, so it is gone
    without a request (resume also checks the stored effective list: :func:`stored_egress`)."""
    adapter = metadata.get("adapterType")
    if adapter is not None and not isinstance(adapter, str):
        return True
    if metadata.get("shape") != config.shape or metadata.get("region") != config.region:
        return True
    if metadata.get("snapshot") != config.snapshot:
        return True
    if metadata.get("rootfs") != effective_rootfs(config, adapter):
        return True
    if metadata.get("baseEgressAllowlist") != list(config.egress_allowlist):
        return True
    return metadata.get("reuseLease") is True and not _window_matches(config, metadata)


def _window_matches(config: EnvironmentConfig, metadata: Mapping[str, Any]) -> bool:
    stored = metadata.get("autoPauseAfterSeconds")
    return (
        isinstance(stored, int)
        and not isinstance(stored, bool)
        and stored == config.auto_pause_after_seconds
    )


def is_keepable(config: EnvironmentConfig, metadata: Mapping[str, Any] | None) -> bool:
    """Release (2.10.3): the current config reuses leases, the lease was issued reusable, and
    its stored window is the current one (a lease without the key does not match)."""
    meta = metadata or {}
    return config.reuse_lease and meta.get("reuseLease") is True and _window_matches(config, meta)


def is_warm(config: EnvironmentConfig) -> bool:
    """A keepable lease is released warm (left running for CreateOS to idle-pause)."""
    return config.auto_pause_after_seconds >= MIN_AUTO_PAUSE_SECONDS
