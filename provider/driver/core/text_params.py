"""Lone UTF-16 surrogates in a request's params: which are repaired, which refuse the call.

Node writes a string that holds half of a surrogate pair (an emoji cut in two, typically by a
length limit on a prompt or a log line) as a lone ``\\ud83d`` escape; :mod:`provider.rpc.wire`
keeps such a request and the dispatcher hands its params to :func:`lone_surrogate_policy`
(given by the composition root), which answers, per param:

- **replaced by U+FFFD** in the text a command reads: ``environmentExecute``'s ``args``, ``env``
  values and ``stdin``. That is the very text the host would have produced itself: Node writes
  a lone surrogate as U+FFFD whenever it encodes a string as UTF-8 (a child process's argv and
  environment, a pipe, a file), so a command started by the host directly would have received
  the same bytes, and an agent's prompt cut mid-emoji still runs.
- **refused** (``-32602`` under the call's id, naming the param, never its value) everywhere
  else, and above all where a string names something: the ``command`` (a program), ``cwd``, a
  sync's ``sourcePath`` / ``targetPath``, ``exclude`` patterns and post-upload commands (shell
  text that names files), env variable names, lease ids and metadata, the config. A character
  replaced there would silently name another file (or stop excluding one, so a file meant to
  stay on the host would be synced): the caller has to send the name whole.
"""

from __future__ import annotations

import re
from typing import Any, Final

from provider.errors import InvalidParams
from provider.surrogates import holds_lone_surrogate, replace_lone_surrogates

#: Per method, the top-level params whose strings are text a command reads (module docstring).
REPLACEABLE: Final[dict[str, frozenset[str]]] = {
    "environmentExecute": frozenset({"args", "env", "stdin"}),
}
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def lone_surrogate_policy(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with lone surrogates replaced where that is safe; InvalidParams otherwise."""
    replaceable = REPLACEABLE.get(method, frozenset())
    served: dict[str, Any] = {}
    for key, value in params.items():
        if not holds_lone_surrogate(key) and not holds_lone_surrogate(value):
            served[key] = value
        elif key in replaceable and not _names_hold_one(value):
            served[key] = replace_lone_surrogates(value)
        else:
            where = _first_path(key, value, "params")
            raise InvalidParams(
                f"Invalid params for {method}: {where} holds a lone UTF-16 surrogate (half of a "
                "character, such as an emoji cut in two). It is refused rather than repaired "
                "because it names something (a file, a program, a lease): send it whole."
            )
    return served


def _names_hold_one(value: object) -> bool:
    """True when a key of ``value`` (an env variable name) holds a lone surrogate."""
    return isinstance(value, dict) and holds_lone_surrogate(list(value))


def _first_path(key: object, value: object, prefix: str) -> str:
    """Where the first lone surrogate is, as ``params.operations[0].files[1].sourcePath``; a
    key that holds one (or is not a plain name) shows as ``[...]``, never as itself."""
    here = _step(prefix, key)
    if holds_lone_surrogate(key) or isinstance(value, str):
        return here
    if isinstance(value, list):
        for index, item in enumerate(value):
            if holds_lone_surrogate(item):
                return _first_path(index, item, here)
    if isinstance(value, dict):
        for inner, item in value.items():
            if holds_lone_surrogate(inner) or holds_lone_surrogate(item):
                return _first_path(inner, item, here)
    return here


def _step(prefix: str, key: object) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    if isinstance(key, str) and _NAME.match(key):
        return f"{prefix}.{key}"
    return f"{prefix}[...]"
