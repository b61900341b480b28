"""Lone UTF-16 surrogates in decoded JSON: find them, or replace them with U+FFFD.

A JSON string may spell half of a surrogate pair (``"\\ud83d"``: Node writes one for an emoji
cut in two). Decoded by the standard library it becomes a lone surrogate code point, which no
UTF-8 encoder accepts. Shared by :mod:`provider.rpc.wire` (which finds such requests) and
:mod:`provider.driver.core.text_params` (which decides, per param, what to do with them).
"""

from __future__ import annotations

import re
from typing import Any, Final

LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def holds_lone_surrogate(value: object) -> bool:
    """True when a string anywhere in ``value`` (keys too) holds a lone surrogate code point."""
    if isinstance(value, str):
        return LONE_SURROGATE.search(value) is not None
    if isinstance(value, list):
        return any(holds_lone_surrogate(item) for item in value)
    if isinstance(value, dict):
        return any(holds_lone_surrogate(k) or holds_lone_surrogate(v) for k, v in value.items())
    return False


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD, which is what Node's own UTF-8
    encoder writes for one (a child's argv and environment, a pipe, a file)."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {replace_lone_surrogates(k): replace_lone_surrogates(v) for k, v in value.items()}
    return value
