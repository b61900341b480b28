"""Environment config of the ``createos`` driver: parse, normalize, fill defaults, resolve the key.

One parser serves ``environmentValidateConfig`` and every runtime call (docs/protocol.md
section 1). The host applies no schema defaults and no ``required``: we do. Every error names the
field and the fix; no message ever repeats the API key or the given URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from provider.config_fields import (
    AUTO_PAUSE,
    IntegerField,
    egress_allowlist,
    integer_field,
    rootfs_by_adapter,
    snapshot,
    text_field,
)
from provider.config_url import LOOPBACK_HOSTS as LOOPBACK_HOSTS
from provider.config_url import normalize_api_url as normalize_api_url
from provider.errors import ConfigError
from provider.worker_env import API_KEY_ENV as API_KEY_ENV

DEFAULT_API_URL: Final = "https://api.sb.createos.sh"
DEFAULT_TIMEOUT_MS: Final = 300_000
# Host-owned run flags we default in the stored config. Paperclip strips them before it asks us
# to validate and puts the operator's own value back over ours when one was given, so these only
# fill the gap. streamRunLogs false: the host then writes our live execute.log chunks straight
# into the run log instead of tailing a log file through a command every 250 ms (those commands
# cost API requests and left the run log seconds behind).
HOST_FLAG_DEFAULTS: Final[dict[str, object]] = {"streamRunLogs": False}
MAX_TIMEOUT_MS: Final = 86_400_000
DEFAULT_REUSE_MAX_IDLE_SECONDS: Final = 86_400
MIN_REUSE_MAX_IDLE_SECONDS: Final = 600
MAX_REUSE_MAX_IDLE_SECONDS: Final = 2_592_000
DEFAULT_REUSE_MAX_KEPT: Final = 5
MAX_REUSE_MAX_KEPT: Final = 100

KNOWN_SHAPES: Final[tuple[str, ...]] = (
    "s-1vcpu-256mb",
    "s-0.25vcpu-512mb",
    "s-0.5vcpu-1gb",
    "s-1vcpu-1gb",
    "s-1vcpu-2gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-8vcpu-8gb",
    "s-8vcpu-16gb",
)

_TEXT_FIELDS: Final = ("apiUrl", "apiKey", "shape", "rootfs", "region")


class EnvironmentConfig(BaseModel):
    """A parsed, normalized environment config (absent optionals are ``None``)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    api_url: str
    api_key: str | None = Field(repr=False)  # the configured value; never shown
    shape: str
    rootfs: str | None
    region: str | None
    timeout_ms: int
    reuse_lease: bool
    reuse_max_idle_seconds: int
    reuse_max_kept_sandboxes: int
    egress_allowlist: tuple[str, ...] = ()
    auto_pause_after_seconds: int = AUTO_PAUSE.default
    rootfs_by_adapter: dict[str, str] = Field(default_factory=dict)
    snapshot: str | None = None  # a paused template sandbox each lease forks (8.4)

    def normalized(self) -> dict[str, object]:
        """The ``normalizedConfig`` object the host persists (camelCase keys, nulls kept)."""
        return {
            "apiUrl": self.api_url,
            "apiKey": self.api_key,
            "shape": self.shape,
            "rootfs": self.rootfs,
            "region": self.region,
            "timeoutMs": self.timeout_ms,
            "reuseLease": self.reuse_lease,
            "reuseMaxIdleSeconds": self.reuse_max_idle_seconds,
            "reuseMaxKeptSandboxes": self.reuse_max_kept_sandboxes,
            "egressAllowlist": list(self.egress_allowlist),
            "autoPauseAfterSeconds": self.auto_pause_after_seconds,
            "rootfsByAdapter": dict(self.rootfs_by_adapter),
            "snapshot": self.snapshot,
        }


_TIMEOUT_MS: Final = IntegerField(
    "timeoutMs",
    DEFAULT_TIMEOUT_MS,
    lambda n: 1 <= n <= MAX_TIMEOUT_MS,
    f"a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}",
)
_REUSE_BOUNDS: Final = (
    IntegerField(
        "reuseMaxIdleSeconds",
        DEFAULT_REUSE_MAX_IDLE_SECONDS,
        lambda n: n == 0 or MIN_REUSE_MAX_IDLE_SECONDS <= n <= MAX_REUSE_MAX_IDLE_SECONDS,
        "a whole number of seconds: 0 (no age bound) or from "
        f"{MIN_REUSE_MAX_IDLE_SECONDS} to {MAX_REUSE_MAX_IDLE_SECONDS}",
    ),
    IntegerField(
        "reuseMaxKeptSandboxes",
        DEFAULT_REUSE_MAX_KEPT,
        lambda n: 0 <= n <= MAX_REUSE_MAX_KEPT,
        f"a whole number from 0 (no count bound) to {MAX_REUSE_MAX_KEPT}",
    ),
)


def _reuse_lease(raw: Mapping[str, Any]) -> bool:
    value = raw.get("reuseLease")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(
            "reuseLease must be true or false (or null for the default false)", field="reuseLease"
        )
    return value


def _collect(raw: object) -> tuple[EnvironmentConfig | None, list[ConfigError]]:
    """Parse ``raw``; returns the config or every field error found (in field order)."""
    if not isinstance(raw, Mapping):
        return None, [ConfigError("config must be a JSON object with the driver's fields")]
    errors: list[ConfigError] = []
    texts: dict[str, str | None] = {}
    api_url = DEFAULT_API_URL
    for field in _TEXT_FIELDS:
        try:
            texts[field] = text_field(raw, field)
            if field == "apiUrl" and texts[field] is not None:
                api_url = normalize_api_url(texts["apiUrl"] or "")
        except ConfigError as exc:
            errors.append(exc)
            texts[field] = None
    if texts["apiKey"] is not None and not is_key_text(texts["apiKey"]):
        errors.append(ConfigError(_KEY_CHARACTERS.format(where="apiKey"), field="apiKey"))
        texts["apiKey"] = None
    shape = texts["shape"]
    if shape is None and not any(e.field == "shape" for e in errors):
        errors.append(
            ConfigError(
                "shape is required: set it to a CreateOS shape such as s-1vcpu-1gb "
                f"(catalog: {', '.join(KNOWN_SHAPES)})",
                field="shape",
            )
        )
    timeout_ms = DEFAULT_TIMEOUT_MS
    reuse_lease = False
    try:
        timeout_ms = integer_field(raw, _TIMEOUT_MS)
    except ConfigError as exc:
        errors.append(exc)
    try:
        reuse_lease = _reuse_lease(raw)
    except ConfigError as exc:
        errors.append(exc)
    bounds = {spec.name: spec.default for spec in _REUSE_BOUNDS}
    for spec in _REUSE_BOUNDS:
        try:
            bounds[spec.name] = integer_field(raw, spec)
        except ConfigError as exc:
            errors.append(exc)
    placement: dict[str, Any] = {}
    for name, parse in (
        ("egress_allowlist", egress_allowlist),
        ("auto_pause_after_seconds", lambda r: integer_field(r, AUTO_PAUSE)),
        ("rootfs_by_adapter", rootfs_by_adapter),
    ):
        try:
            placement[name] = parse(raw)
        except ConfigError as exc:
            errors.append(exc)
    try:
        placement["snapshot"] = snapshot(
            raw, rootfs=texts["rootfs"], by_adapter=placement.get("rootfs_by_adapter", {})
        )
    except ConfigError as exc:
        errors.append(exc)
    if errors or shape is None:
        return None, errors
    config = EnvironmentConfig(
        api_url=api_url,
        api_key=texts["apiKey"],
        shape=shape,
        rootfs=texts["rootfs"],
        region=texts["region"],
        timeout_ms=timeout_ms,
        reuse_lease=reuse_lease,
        reuse_max_idle_seconds=bounds["reuseMaxIdleSeconds"],
        reuse_max_kept_sandboxes=bounds["reuseMaxKeptSandboxes"],
        **placement,
    )
    return config, []


def parse_config(raw: object) -> EnvironmentConfig:
    """Parse and normalize an environment config; raises ``ConfigError`` (the first problem)."""
    config, errors = _collect(raw)
    if config is None:
        raise errors[0]
    return config


def validate_config(raw: object) -> dict[str, object]:
    """The ``environmentValidateConfig`` result. Never resolves keys or touches the network."""
    config, errors = _collect(raw)
    if config is None:
        return {"ok": False, "errors": [str(e) for e in errors]}
    if config.api_key is None and config.api_url != DEFAULT_API_URL:
        return {
            "ok": False,
            "errors": [
                f"apiKey is required for an apiUrl other than {DEFAULT_API_URL}: add an apiKey "
                f"to the environment config ({API_KEY_ENV} is honoured for the official "
                "endpoint only)"
            ],
        }
    warnings: list[str] = []
    if config.shape not in KNOWN_SHAPES:
        warnings.append(
            f"shape {config.shape!r} is not in the bundled CreateOS catalog "
            f"({', '.join(KNOWN_SHAPES)}); it is sent to CreateOS as given"
        )
    if "*" in config.egress_allowlist and len(config.egress_allowlist) > 1:
        warnings.append(
            "egressAllowlist holds '*' beside other rules: the other rules restrict egress, so "
            "'*' is dropped (use ['*'] or [] alone to allow everything)"
        )
    if config.api_key is None:
        warnings.append(
            f"no apiKey is set: the worker then needs {API_KEY_ENV} in its own environment, "
            "which Paperclip hosts do not forward to plugins; set apiKey in the environment config"
        )
    normalized = {**config.normalized(), **HOST_FLAG_DEFAULTS}
    result: dict[str, object] = {"ok": True, "normalizedConfig": normalized}
    if warnings:
        result["warnings"] = warnings
    return result


_KEY_CHARACTERS: Final = (
    "{where} holds a space, a control character or a non-ASCII character (a CreateOS API key is "
    "printable ASCII, sent as the X-Api-Key header): paste the key alone, as CreateOS issued it"
)


def is_key_text(key: str) -> bool:
    """True for a non-empty key of visible ASCII only (``!`` to ``~``): what an HTTP header can
    carry unchanged. Anything else would fail to encode (non-ASCII) or split the header."""
    return bool(key) and all(0x21 <= ord(ch) <= 0x7E for ch in key)


def resolve_api_key(config: EnvironmentConfig, environ: Mapping[str, str] | None = None) -> str:
    """The key to send as ``X-Api-Key`` (docs/protocol.md 1.4); raises ``ConfigError`` naming
    the fix."""
    if config.api_key is not None:
        key = config.api_key.strip()
    elif config.api_url == DEFAULT_API_URL:
        env = os.environ if environ is None else environ
        key = env.get(API_KEY_ENV, "").strip()
    else:
        raise ConfigError(
            f"apiKey is required for an apiUrl other than {DEFAULT_API_URL}: add an apiKey to "
            f"the environment config ({API_KEY_ENV} is honoured for the official endpoint only)",
            field="apiKey",
        )
    if not key:
        raise ConfigError(
            f"no usable CreateOS API key: set apiKey in the environment config or provide "
            f"{API_KEY_ENV} to the worker (the key must be non-empty, on one line)",
            field="apiKey",
        )
    if not is_key_text(key):
        where = "apiKey" if config.api_key is not None else f"the worker's {API_KEY_ENV}"
        raise ConfigError(_KEY_CHARACTERS.format(where=where), field="apiKey")
    return key
