"""A result whose follow-up notifications must not overtake it on the wire.

Opening a login terminal or a duplex channel answers with a session id, and the session's output
notifications name that id: the host must read the answer first (docs/protocol.md H10.2-H10.3).
A handler returns :class:`AfterReply` around its result; the dispatcher writes the result and
then calls ``written(True)`` once the reply line is on its way, or ``written(False)`` when it was
not written as given (it could not be encoded and an error went instead, or the output is gone):
the host then never learned the session, and nothing may ever be sent for it. The session holds
its notifications until then. Shared by :mod:`provider.rpc` (which writes replies) and
:mod:`provider.driver` (which waits), it knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AfterReply:
    """``result`` is the reply; ``written(delivered)`` runs once, right after the reply was
    written (``True``) or replaced by an error or lost (``False``)."""

    result: Any
    written: Callable[[bool], None]
