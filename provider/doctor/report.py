"""The doctor's findings and the table it prints.

Every check has a fixed key and assumption text, known before anything runs, so a check that
was never reached (an earlier failure, Ctrl-C, the deadline) still gets its row: ``skipped``
with the reason. ``violated`` means the endpoint did not behave as the worker assumes
(docs/protocol.md C9); ``observed`` says what it did instead, in words built by the doctor itself
(statuses, counts, timings), never a response body.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

Outcome = Literal["ok", "violated", "skipped"]

HEARTBEAT_LIMIT_S: Final = 30.0
"""The longest silence a stream may keep while its command prints nothing: the worker's stream
reader takes a longer one for a dead connection (docs/protocol.md C5 and C6.3: about 5 s)."""

ASSUMPTIONS: Final[dict[str, str]] = {
    "idle_pause": "an armed sandbox pauses itself once idle auto_pause_after_seconds",
    "get_resets_idle": "a GET /v1/sandboxes/{id} every min(window/2, 240) s keeps it running",
    "connect_heartbeat": (
        f"connect sends a heartbeat at least every {HEARTBEAT_LIMIT_S:.0f} s while silent"
    ),
    "exec_heartbeat": (
        f"the exec stream sends a heartbeat at least every {HEARTBEAT_LIMIT_S:.0f} s while silent"
    ),
    "exec_stream_end": "the exec stream ends, at the leader's exit or at stdio EOF",
    "command_status": "a streamed command's exit code and signal come back told apart",
    "command_daemon": "a streamed command returns at its leader's exit, a child holding stdout",
    "command_kill": "a dropped command is found by its token in /proc and its kill confirmed",
    "list_paused_filter": "GET /v1/sandboxes?status=paused is accepted and filters",
    "put_creates_parents": "PUT /files creates missing parent folders",
    "paused_sandbox": "exec and files on a paused sandbox answer 409 (no auto-resume)",
    "foreign_sandbox": "another key's sandbox answers 404, not 403",
    "guest_agent_pause": "POST /self/pause to 127.0.0.1:1029 from inside pauses the sandbox",
    "retry_after": "a 429 carries Retry-After",
}


@dataclass(frozen=True)
class Finding:
    """One row: the check's key, what came back, and whether the assumption held."""

    key: str
    outcome: Outcome
    observed: str

    @property
    def assumption(self) -> str:
        return ASSUMPTIONS[self.key]


def ok(key: str, observed: str) -> Finding:
    return Finding(key, "ok", observed)


def violated(key: str, observed: str) -> Finding:
    return Finding(key, "violated", observed)


def skipped(key: str, reason: str) -> Finding:
    return Finding(key, "skipped", reason)


def complete(found: Iterable[Finding], reason: str) -> list[Finding]:
    """One row per assumption, in table order: the first finding of each key, else skipped
    with ``reason`` (the check was not reached)."""
    by_key: dict[str, Finding] = {}
    for finding in found:
        by_key.setdefault(finding.key, finding)
    return [by_key.get(key) or skipped(key, reason) for key in ASSUMPTIONS]


def render(findings: Sequence[Finding], secrets: Sequence[str] = ()) -> str:
    """The table as text, one row per finding; any of ``secrets`` is masked (defence in depth:
    the texts are built from statuses and counts, never from a body or the key)."""
    header = ("result", "assumption", "observed")
    rows = [header] + [(f.outcome, f.assumption, f.observed) for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip() for row in rows]
    lines.insert(1, f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * len(header[2])}")
    text = "\n".join(lines) + "\n"
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
