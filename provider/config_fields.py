"""Field parsers of the environment config (docs/protocol.md 1.2), used by
:mod:`provider.config`: text and integer fields, and the placement fields of the sandbox itself
(``egressAllowlist``, ``autoPauseAfterSeconds``, ``rootfsByAdapter``, ``snapshot``).

Every parser takes the raw mapping and returns the normalized value or raises
:class:`ConfigError` naming the field (or the entry's position) and the accepted forms, never
the value itself (an operator may have pasted a secret into the wrong box).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from provider.createos.models import is_valid_id
from provider.egress_rules import ACCEPTED_FORMS, RuleError, normalize_rule
from provider.errors import ConfigError

MAX_EGRESS_RULES: Final = 256
DEFAULT_AUTO_PAUSE_SECONDS: Final = 600
MIN_AUTO_PAUSE_SECONDS: Final = 60
MAX_AUTO_PAUSE_SECONDS: Final = 86_400
MAX_ROOTFS_BY_ADAPTER: Final = 64
MAX_ROOTFS_TEXT: Final = 200


def text_field(raw: Mapping[str, Any], field: str) -> str | None:
    value = raw.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or "\x00" in value or not value.strip():
        raise ConfigError(
            f"{field} must be a non-empty string without NUL characters "
            f"(or null to leave it unset)",
            field=field,
        )
    return value.strip()


def whole_number(value: object) -> int | None:
    """An integer, or an integral finite float as one; None for anything else (booleans too)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


@dataclass(frozen=True)
class IntegerField:
    name: str
    default: int
    accepts: Callable[[int], bool]
    forms: str  # what the message says is accepted


def integer_field(raw: Mapping[str, Any], spec: IntegerField) -> int:
    """Missing or null: the default; else an integer (integral floats too, never a boolean)."""
    value = raw.get(spec.name)
    if value is None:
        return spec.default
    number = whole_number(value)
    if number is None or not spec.accepts(number):
        raise ConfigError(
            f"{spec.name} must be {spec.forms} (or null for the default {spec.default})",
            field=spec.name,
        )
    return number


AUTO_PAUSE: Final = IntegerField(
    "autoPauseAfterSeconds",
    DEFAULT_AUTO_PAUSE_SECONDS,
    lambda n: n == 0 or MIN_AUTO_PAUSE_SECONDS <= n <= MAX_AUTO_PAUSE_SECONDS,
    "a whole number of seconds: 0 (pause at release) or from "
    f"{MIN_AUTO_PAUSE_SECONDS} to {MAX_AUTO_PAUSE_SECONDS} (1-59 are refused)",
)


def egress_rules(values: object, where: str) -> list[str]:
    """A list of egress rules, normalized, duplicates dropped (the first kept). ``where`` names
    the list in messages (``egressAllowlist``, ``networkEgress.allowFqdns``)."""
    if not isinstance(values, list):
        raise ConfigError(f"{where} must be an array of egress rules ({ACCEPTED_FORMS})")
    if len(values) > MAX_EGRESS_RULES:
        raise ConfigError(f"{where} has more than {MAX_EGRESS_RULES} entries")
    rules: list[str] = []
    for index, value in enumerate(values):
        try:
            rule = normalize_rule(value)
        except RuleError as exc:
            raise ConfigError(
                f"{where}[{index}] is not an egress rule ({exc.reason}): {ACCEPTED_FORMS}"
            ) from None
        if rule not in rules:
            rules.append(rule)
    return rules


def egress_allowlist(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("egressAllowlist")
    if value is None:
        return ()
    try:
        return tuple(egress_rules(value, "egressAllowlist"))
    except ConfigError as exc:
        raise ConfigError(str(exc), field="egressAllowlist") from None


def rootfs_by_adapter(raw: Mapping[str, Any]) -> dict[str, str]:
    """Adapter type -> rootfs: at most 64 entries, keys and values trimmed, non-empty, at most
    200 characters, without control characters; two keys equal once trimmed are refused."""
    value = raw.get("rootfsByAdapter")
    if value is None:
        return {}
    field = "rootfsByAdapter"
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{field} must be an object mapping adapter types (such as codex_local) to a rootfs",
            field=field,
        )
    if len(value) > MAX_ROOTFS_BY_ADAPTER:
        raise ConfigError(f"{field} has more than {MAX_ROOTFS_BY_ADAPTER} entries", field=field)
    result: dict[str, str] = {}
    for position, (key, image) in enumerate(value.items()):
        name = _clean(key)
        if name is None:
            raise ConfigError(
                f"{field} key {position + 1} must be a non-empty adapter type of at most "
                f"{MAX_ROOTFS_TEXT} characters without control characters",
                field=field,
            )
        if name in result:
            raise ConfigError(f"{field} names adapter type {name!r} twice", field=field)
        cleaned = _clean(image)
        if cleaned is None:
            raise ConfigError(
                f"{field}[{name!r}] must be a non-empty rootfs name of at most "
                f"{MAX_ROOTFS_TEXT} characters without control characters",
                field=field,
            )
        result[name] = cleaned
    return result


def _clean(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > MAX_ROOTFS_TEXT:
        return None
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        return None
    return text


def snapshot(
    raw: Mapping[str, Any], *, rootfs: str | None, by_adapter: Mapping[str, str]
) -> str | None:
    """The paused template sandbox each lease forks (docs/protocol.md 1.2.11, 8.4): a text
    field holding a CreateOS id. A template replaces the image, so it is refused beside
    ``rootfs`` or a non-empty ``rootfsByAdapter``."""
    field = "snapshot"
    try:
        value = text_field(raw, field)
    except ConfigError:
        value = None
        valid = False
    else:
        valid = value is None or is_valid_id(value)  # a CreateOS id (docs/protocol.md C1.9)
    if not valid:
        raise ConfigError(
            f"{field} must be a CreateOS sandbox id (1 to 200 letters, digits, '_' or '-'), "
            "or null to leave it unset",
            field=field,
        )
    if value is not None and (rootfs is not None or by_adapter):
        raise ConfigError(
            f"{field} cannot be combined with rootfs or rootfsByAdapter: a template replaces "
            "the image (unset them, or unset snapshot)",
            field=field,
        )
    return value
