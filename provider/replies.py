"""A result whose follow-up notifications must not overtake it on the wire.

Opening a login terminal or a duplex channel answers with a session id, and the session's output
notifications name that id: the host must read the answer first (host-protocol.md 10.2-10.3).
A handler returns :class:`AfterReply` around its result; the dispatcher writes the result and
then calls ``written`` once the reply line is on its way (or could not be written at all), and
the session holds its notifications until then. Shared by :mod:`provider.rpc` (which writes
replies) and :mod:`provider.driver` (which waits), it knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AfterReply:
    """``result`` is the reply; ``written()`` runs right after it was written (never twice)."""

    result: Any
    written: Callable[[], None]
