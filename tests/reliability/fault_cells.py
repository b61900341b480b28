"""The fault matrix as data: CreateOS endpoints the worker uses, faults, specified outcomes.

A *site* is one endpoint reached through one host call (the sandbox ``DELETE`` through
``environmentDestroyLease``, the command's exec stream through ``environmentExecute``...). A *cell*
is a site with one fault injected on the first matching request. :func:`expected` derives the
outcome from docs/protocol.md, never from the code:

- docs/protocol.md C1.8: ``GET``, ``DELETE`` and replayable ``PUT`` are retried on transport errors,
  408 and 5xx (at most twice); ``POST`` on 429 and 503 (the server did not process it, as both
  official SDKs read them), honouring ``Retry-After``.
- docs/protocol.md 2.3: an unknown sandbox-create outcome is cleaned up by its name token and
  surfaced; 2.4.6: resume re-raises transient failures and answers "gone" only on 404.
- 3.9: a command is one ``POST /exec?stream=true``. Refused (a status below 500, or 429/503 after
  retries): nothing ran. Anything else that leaves it unfinished (a 502, a transport error, a read
  timeout, a cut or malformed stream) is a lost stream: one buffered ``POST /exec`` kills the
  command's tree by its token; confirmed -> a clear error, the lease usable; unconfirmed (that
  kill not answered, or refused for good) -> the lease is poisoned. A cancellation (a reuse
  release mid-command) kills the same way: confirmed -> the release goes on; unconfirmed ->
  poisoned, and the release refuses to keep the lease.
- 5.6: a download cut mid-body fails the sync and leaves the target untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "retried", "surfaced", "lost", "expired", "poisoned"]
Kind = Literal[
    "idempotent", "post", "create-sandbox", "exec-stream", "kill-exec", "cancel-kill", "download"
]

READ_TIMEOUT = 0.5
"""Client read timeout (seconds) for requests matching a ``timeout`` fault."""
DELAY_MS = 1200
"""How long the emulator holds such a request before performing it."""


@dataclass(frozen=True)
class FaultSpec:
    """One fault column: what the emulator does to the first ``times`` matching requests."""

    name: str
    label: str
    action: dict[str, Any] = field(default_factory=dict)
    times: int = 1
    read_timeout: float | None = None


FAULTS: dict[str, FaultSpec] = {
    f.name: f
    for f in (
        FaultSpec("none", "no fault (control)"),
        FaultSpec("503", "HTTP 503", {"status": 503}),
        FaultSpec("502", "HTTP 502", {"status": 502}),
        FaultSpec("429", "HTTP 429, Retry-After: 1", {"status": 429, "retry_after": "1"}),
        FaultSpec("drop", "connection dropped (not performed)", {"drop": True}),
        FaultSpec("lost", "response lost (performed)", {"lose_response": True}),
        FaultSpec("timeout", "read timeout", {"delay_ms": DELAY_MS}, read_timeout=READ_TIMEOUT),
        FaultSpec("truncated", "truncated body", {"cut_after_bytes": 12}),
        FaultSpec("cut", "stream cut after 1 frame", {"cut_after_frames": 1}),
        FaultSpec("404", "HTTP 404", {"status": 404}),
        FaultSpec("503x4", "HTTP 503, 4 times (retries exhausted)", {"status": 503}, times=4),
    )
}

COMMON = ("none", "503", "502", "429", "drop", "lost", "timeout", "truncated")
STREAM = "stream=true"


@dataclass(frozen=True)
class Site:
    """An endpoint reached through one host call; ``normal_count`` = matching requests when
    nothing is injected (the control column checks it). ``query``: the query string a matching
    request has (None: any); the emulator's faults match the path only, so a fault meant for
    the second ``/exec`` of a call is queued behind one the scenario sets up for the first.
    ``cleanup_execs``: buffered execs, other than a kill, that follow a failed command (sync in
    removes its scratch file with one)."""

    id: str
    endpoint: str
    method: str
    path_regex: str
    call: str
    scenario: str
    kind: Kind
    normal_count: int
    faults: tuple[str, ...] = COMMON
    query: str | None = None
    cleanup_execs: int = 0


SITES: tuple[Site, ...] = (
    Site("acquire.create", "POST /v1/sandboxes", "POST", r"^/v1/sandboxes$",
         "acquire", "acquire", "create-sandbox", 1),
    Site("acquire.list", "GET /v1/sandboxes", "GET", r"^/v1/sandboxes$",
         "acquire (create response lost)", "acquire-lost-create", "idempotent", 1),
    Site("resume.get", "GET /v1/sandboxes/{id}", "GET", r"^/v1/sandboxes/[^/]+$",
         "resume", "resume-running", "idempotent", 1, (*COMMON, "404", "503x4")),
    Site("destroy.delete", "DELETE /v1/sandboxes/{id}", "DELETE", r"^/v1/sandboxes/[^/]+$",
         "destroy", "destroy", "idempotent", 1, (*COMMON, "503x4")),
    Site("release.pause", "POST /v1/sandboxes/{id}/pause", "POST", r"/pause$",
         "release (reuse)", "release-reuse", "post", 1),
    Site("resume.resume", "POST /v1/sandboxes/{id}/resume", "POST", r"/resume$",
         "resume (paused)", "resume-paused", "post", 1, (*COMMON, "404")),
    Site("resume.exec", "POST /v1/sandboxes/{id}/exec", "POST", r"/exec$",
         "resume", "resume-running", "post", 1, (*COMMON, "404"), query=""),
    Site("acquire.exec", "POST /v1/sandboxes/{id}/exec", "POST", r"/exec$",
         "acquire", "acquire", "post", 1, query=""),
    Site("syncIn.files-put", "PUT /v1/sandboxes/{id}/files", "PUT", r"/files$",
         "syncIn", "sync-in", "idempotent", 1, (*COMMON, "503x4")),
    Site("syncOut.files-get", "GET /v1/sandboxes/{id}/files", "GET", r"/files$",
         "syncOut", "sync-out", "download", 1, (*COMMON, "503x4")),
    Site("execute.exec-stream", "POST .../exec?stream=true", "POST", r"/exec$",
         "execute", "execute", "exec-stream", 1, (*COMMON, "cut", "503x4"), query=STREAM),
    Site("syncIn.exec-stream", "POST .../exec?stream=true", "POST", r"/exec$",
         "syncIn", "sync-in", "exec-stream", 1, (*COMMON, "cut", "503x4"), query=STREAM,
         cleanup_execs=1),
    Site("execute.kill-exec", "POST .../exec (kill by token)", "POST", r"/exec$",
         "execute (stream cut)", "execute-lost", "kill-exec", 1, (*COMMON, "503x4"), query=""),
    Site("release.kill-exec", "POST .../exec (kill by token)", "POST", r"/exec$",
         "release (reuse) mid-command", "execute-cancelled", "cancel-kill", 1, (*COMMON, "503x4"),
         query=""),
    Site("probe.create", "POST /v1/sandboxes", "POST", r"^/v1/sandboxes$",
         "probe", "probe", "create-sandbox", 1),
    Site("probe.delete", "DELETE /v1/sandboxes/{id}", "DELETE", r"^/v1/sandboxes/[^/]+$",
         "probe", "probe", "idempotent", 1),
)  # fmt: skip

KILL_EXEC = Site("kill", "POST .../exec", "POST", r"/exec$", "", "", "kill-exec", 0, query="")
"""Every buffered exec (no query): after a command's exec stream, its kill by token."""

KNOWN_EMULATOR_BUGS: dict[str, str] = {}
"""Cells that cannot run until the emulator is fixed (reported; not a worker outcome)."""

UNUSED_ENDPOINTS = {
    ".../processes...": "not called by execute or sync: a command is one exec stream (3.9); "
    "managed processes serve only an origin without the stream, channels and login terminals "
    "(their own tests: tests/driver/test_execute_managed.py, test_channels.py, test_login.py)",
}


@dataclass(frozen=True)
class Cell:
    site: Site
    fault: FaultSpec

    @property
    def id(self) -> str:
        return f"{self.site.id}.{self.fault.name}"

    @property
    def expected(self) -> Outcome:
        return expected(self.site, self.fault)


def expected(site: Site, fault: FaultSpec) -> Outcome:
    """The specified outcome of ``fault`` at ``site`` (see the module docstring)."""
    if site.kind == "kill-exec":  # the stream is lost either way: is its kill confirmed?
        return "lost" if fault.name in ("none", "429", "503") else "poisoned"
    if site.kind == "cancel-kill" and fault.name not in ("none", "429", "503"):
        return "poisoned"  # 3.9: a cancellation whose kill is not confirmed
    if fault.name == "none":
        return "ok"
    if fault.name == "404":
        return "expired"  # 2.4.6: a 404 at any step of resume means gone
    if fault.name in ("429", "503"):
        return "retried"  # C1.8: every request, POST included, is retried on 429 and 503
    if fault.name == "503x4":
        return "surfaced"  # refused for good: a POST ran nothing
    if site.kind == "idempotent":
        return "retried"
    if site.kind == "download":
        return "surfaced" if fault.name == "truncated" else "retried"
    if site.kind == "exec-stream":
        return "lost"  # 3.9: the exec may have run; its tree is killed by token, confirmed
    return "surfaced"  # post, create-sandbox: never repeated, the failure reaches the caller


CELLS: tuple[Cell, ...] = tuple(Cell(site, FAULTS[name]) for site in SITES for name in site.faults)
