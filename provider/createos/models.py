"""msgspec types for the CreateOS payloads we read, and identifier validation.

Only the fields the provider uses are declared; unknown fields are ignored. Conversion from a
JSend ``data`` value is strict (no string-to-int coercion, booleans are not integers) and any
mismatch becomes an :class:`~provider.createos.errors.APIProtocolError` naming the operation.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal, TypeVar

import msgspec

from provider.createos.errors import APIProtocolError, InvalidIdentifier

SANDBOX_STATES: Final[frozenset[str]] = frozenset(
    {
        "creating",
        "running",
        "pausing",
        "paused",
        "resuming",
        "forking",
        "error",
        "destroying",
        "destroyed",
        "failed",
    }
)
"""The ten sandbox states of docs/protocol.md C4."""

_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")


def is_valid_id(value: object) -> bool:
    """True when ``value`` is a string matching ``^[A-Za-z0-9_-]{1,200}$``."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def require_id(value: str, what: str) -> str:
    """Return ``value`` if it is a valid id, else raise :class:`InvalidIdentifier`."""
    if not is_valid_id(value):
        raise InvalidIdentifier(f"Refusing to use an invalid CreateOS {what} id in a request.")
    return value


class SandboxView(msgspec.Struct, frozen=True):
    """The parts of a sandbox view the provider reads."""

    id: str
    status: str
    name: str | None = None
    shape: str | None = None
    rootfs: str | None = None
    region: str | None = None
    # Timestamps (ISO 8601 text) are read by the reaper only; typed loosely so that an odd
    # value never fails a whole listing (the create-recovery lookup reads the same views).
    created_at: Any = None
    paused_at: Any = None
    # Key names of the sandbox's envs (values are never shown), and the template a fork came
    # from: how a fork, which takes no name, is found again (provider.driver.leases.forks).
    envs: Any = None
    forked_from: Any = None
    # The outbound allowlist as CreateOS holds it: resume skips its PUT when it already
    # equals the lease's stored list (provider.driver.leases.lifecycle).
    egress: Any = None

    @property
    def env_keys(self) -> frozenset[str]:
        """The env key names the view lists (a list of names, or an object's keys)."""
        names = list(self.envs) if isinstance(self.envs, dict | list) else []
        return frozenset(name for name in names if isinstance(name, str))


class ExecResult(msgspec.Struct, frozen=True):
    """A buffered exec's outcome. ``error`` is set when the command could not be launched."""

    stdout: str
    stderr: str
    exit_code: int
    error: str | None = None


class ProcessView(msgspec.Struct, frozen=True):
    """The parts of a managed process the provider reads."""

    process_id: str
    state: str
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    leader_exited: bool = False
    tree_exited: bool = False
    output: Any = None  # {"oldest_seq", "newest_seq", "bytes"}; read leniently (newest_seq)

    @property
    def newest_seq(self) -> int | None:
        """The ``seq`` of the newest output frame, when the view says (a non-negative int)."""
        seq = self.output.get("newest_seq") if isinstance(self.output, dict) else None
        return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None

    @property
    def running(self) -> bool:
        """The leader has not exited yet (``starting``, ``running`` or ``terminating``)."""
        return self.state in ("starting", "running", "terminating") and not self.leader_exited


class DataFrame(msgspec.Struct, frozen=True, gc=False):
    """One validated output chunk: its sequence number, stream and raw bytes (``pty``: the
    terminal of a process created with one)."""

    seq: int
    stream: Literal["stdout", "stderr", "pty"]
    data: bytes


class ExitFrame(msgspec.Struct, frozen=True, gc=False):
    """The process's end: an exit code, a ``SIG*`` name, or both."""

    exit_code: int | None
    signal: str | None


class _ExecPayload(msgspec.Struct):
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: str | None = None


T = TypeVar("T")


def convert(data: Any, kind: type[T], operation: str) -> T:
    """Convert a JSend ``data`` value into ``kind``, or raise :class:`APIProtocolError`."""
    try:
        return msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise APIProtocolError(
            f"CreateOS {operation} answered with an unexpected payload shape."
        ) from exc


def sandbox_view(data: Any, operation: str) -> SandboxView:
    """A :class:`SandboxView` whose id is valid."""
    view = convert(data, SandboxView, operation)
    if not is_valid_id(view.id):
        raise APIProtocolError(f"CreateOS {operation} answered with an invalid sandbox id.")
    return view


def process_view(data: Any, operation: str) -> ProcessView:
    """A :class:`ProcessView` whose process id is valid."""
    view = convert(data, ProcessView, operation)
    if not is_valid_id(view.process_id):
        raise APIProtocolError(f"CreateOS {operation} answered with an invalid process id.")
    return view


def exec_result(data: Any, operation: str) -> ExecResult:
    """The buffered exec answer: ``data.result`` (or, from older servers, ``data`` itself).

    A launch failure may omit ``exit_code``; it then reads as -1 when ``error`` is set.
    """
    payload = data.get("result", data) if isinstance(data, dict) else data
    parsed = convert(payload, _ExecPayload, operation)
    exit_code = parsed.exit_code
    if exit_code is None:
        if parsed.error is None:
            raise APIProtocolError(f"CreateOS {operation} answered without an exit code.")
        exit_code = -1
    return ExecResult(parsed.stdout, parsed.stderr, exit_code, parsed.error)
