"""What a command is and what it gives back, shared by both ways of running one.

:class:`CommandSpec` is what :func:`provider.driver.commands.execute.run_command` is asked to
run; :class:`CommandResult` is what it answers, the same from the streamed path
(:mod:`provider.driver.commands.streamed`) and the managed one
(:mod:`provider.driver.commands.managed_command`). Inside the driver a result is read by
attribute; :meth:`CommandResult.wire` is its ``environmentExecute`` answer, built only at the
verb edge. :class:`ProcessRecord` is where started processes are recorded (the journal).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

LogSink = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]


@dataclass(frozen=True)
class CommandSpec:
    command: str
    args: Sequence[str] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None
    timeout: float = 300.0


@dataclass(frozen=True)
class CommandResult:
    """How a command ended: ``exit_code`` (None when a signal ended it, ``signal`` then names
    it, or when it timed out), the bounded tails of its output, and its ``metadata``
    (``outputTruncated``; the managed path adds ``processId``)."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    metadata: dict[str, Any]
    signal: str | None = None

    def wire(self) -> dict[str, Any]:
        """The ``environmentExecute`` result: no ``signal`` key on a timeout."""
        result: dict[str, Any] = {"exitCode": self.exit_code}
        if not self.timed_out:
            result["signal"] = self.signal
        result.update(
            timedOut=self.timed_out, stdout=self.stdout, stderr=self.stderr, metadata=self.metadata
        )
        return result


class ProcessRecord(Protocol):
    """Where started processes are recorded until they are known to have ended (the journal)."""

    async def started(self, process_id: str) -> None: ...

    async def ended(self, process_id: str) -> None: ...
