"""Sandbox checks: idle auto-pause and the keepalive read, the ``status=paused`` list filter,
``PUT /files`` parents, a paused sandbox's answers, another key's view, ``Retry-After``.

docs/protocol.md C9 (questions 5, 6, 10, 12), C1.2, C3.3. Each check talks to the
doctor's one sandbox through the worker's client (:class:`~provider.createos.client.CreateOSClient`)
and turns what came back into :class:`~provider.doctor.report.Finding` rows; only the 429 check
reads the wire record (:attr:`provider.doctor.wire.Wire.seen`).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Final

import anyio

from provider.createos.errors import APIStatusError, NotFound
from provider.createos.models import SandboxView
from provider.doctor.checks_streams import Target
from provider.doctor.report import Finding, ok, skipped, violated
from provider.doctor.wire import Seen, Wire
from provider.driver.core.keepalive import default_interval

POLL_S: Final = 0.5
TERMINAL: Final = frozenset({"error", "failed", "destroying", "destroyed"})


async def wait_status(wire: Wire, sandbox_id: str, wanted: Collection[str]) -> SandboxView:
    """Read the sandbox until its status is one of ``wanted`` or terminal (caller's deadline)."""
    while True:
        view = await wire.client.get_sandbox(sandbox_id)
        if view.status in wanted or view.status in TERMINAL:
            return view
        await anyio.sleep(POLL_S)


async def idle_pause(target: Target, window: int) -> list[Finding]:
    """Arms the idle pause (``PATCH``, as the worker does for forks), then reads every
    ``min(window/2, 240)`` s (the worker's keepalive) for two windows: it must stay running.
    Then no request for two windows: it must have paused itself (which also shows that the
    reads were what kept it running). Ends with the sandbox paused when it paused."""
    client, sandbox_id = target.wire.client, target.sandbox_id
    interval = default_interval(window)
    await client.patch_sandbox(sandbox_id, auto_pause_after_seconds=window)
    started = anyio.current_time()
    reads = 0
    while (elapsed := anyio.current_time() - started) < 2 * window:
        await anyio.sleep(interval)
        view = await client.get_sandbox(sandbox_id)
        reads += 1
        if view.status != "running":
            return [
                ok("idle_pause", f"{view.status} during the keepalive reads"),
                violated(
                    "get_resets_idle",
                    f"{view.status} {elapsed + interval:.0f} s after arming although read "
                    f"every {interval:g} s (window {window} s)",
                ),
            ]
    kept = f"still running after {reads} reads, one every {interval:g} s, over {elapsed:.0f} s"
    await anyio.sleep(2 * window)
    view = await client.get_sandbox(sandbox_id)
    if view.status not in ("pausing", "paused"):
        return [
            violated("idle_pause", f"{view.status} {2 * window} s after the last request"),
            skipped("get_resets_idle", f"cannot tell: it did not pause on its own ({kept})"),
        ]
    view = await wait_status(target.wire, sandbox_id, ("paused",))
    return [
        ok("idle_pause", f"{view.status} at most {2 * window} s after the last request"),
        ok("get_resets_idle", kept),
    ]


async def paused_filter_while_running(target: Target) -> Finding | None:
    """First half of the list-filter check: the running sandbox must not come back."""
    key = "list_paused_filter"
    try:
        views = await target.wire.client.list_sandboxes(status="paused")
    except APIStatusError as exc:
        return violated(key, f"refused: HTTP {exc.status}")
    if any(view.id == target.sandbox_id for view in views):
        return violated(key, "ignored: the running sandbox came back under status=paused")
    return None


async def paused_filter_while_paused(target: Target) -> Finding:
    """Second half, with the sandbox paused: it must come back, and nothing unpaused."""
    key = "list_paused_filter"
    try:
        views = await target.wire.client.list_sandboxes(status="paused")
    except APIStatusError as exc:
        return violated(key, f"refused: HTTP {exc.status}")
    others = sorted({view.status for view in views} - {"paused"})
    if not any(view.id == target.sandbox_id for view in views):
        return violated(key, f"the paused sandbox is missing from {len(views)} listed")
    if others:
        return violated(key, f"listed sandboxes in {', '.join(others)} too")
    return ok(key, f"accepted: {len(views)} paused listed, the running sandbox was left out")


async def put_creates_parents(target: Target) -> Finding:
    """Upload into a folder that does not exist, then read the file back."""
    key = "put_creates_parents"
    client = target.wire.client
    path = f"/tmp/pc-doctor-{secrets.token_hex(4)}/a/b/probe.txt"
    data = b"paperclip-plugin-createos doctor\n"
    try:
        await client.put_file(target.sandbox_id, path, data)
    except APIStatusError as exc:
        return violated(key, f"the upload to a missing folder answered HTTP {exc.status}")
    async with client.get_file(target.sandbox_id, path) as body:
        back = b"".join([chunk async for chunk in body])
    if back != data:
        return violated(key, f"the upload succeeded but {len(back)} other bytes came back")
    return ok(key, "the upload created two missing folders; the file read back byte-exact")


async def paused_sandbox(target: Target) -> Finding:
    """A buffered exec, an upload and a download on the paused sandbox, then its status."""
    key = "paused_sandbox"
    client, sandbox_id = target.wire.client, target.sandbox_id
    answers: list[str] = []

    async def attempt(what: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except APIStatusError as exc:
            answers.append(f"{what} HTTP {exc.status}")
        else:
            answers.append(f"{what} succeeded")

    async def download() -> None:
        async with client.get_file(sandbox_id, "/etc/hostname") as body:
            async for _ in body:
                pass

    await attempt("exec", lambda: client.exec(sandbox_id, "/bin/true", []))
    await attempt("upload", lambda: client.put_file(sandbox_id, "/tmp/pc-doctor-paused", b"x"))
    await attempt("download", download)
    status = (await client.get_sandbox(sandbox_id)).status
    observed = f"{', '.join(answers)}; the sandbox is {status} afterwards"
    if all(answer.endswith("HTTP 409") for answer in answers) and status == "paused":
        return ok(key, observed)
    return violated(key, observed)


async def foreign_sandbox(target: Target, other: Wire | None) -> Finding:
    """``GET`` of the doctor's sandbox with the second key."""
    key = "foreign_sandbox"
    if other is None:
        return skipped(key, "no --second-api-key-file given")
    try:
        await other.client.get_sandbox(target.sandbox_id)
    except NotFound:
        return ok(key, "HTTP 404")
    except APIStatusError as exc:
        if exc.status == 401:
            return skipped(key, "the second key was refused (HTTP 401)")
        return violated(key, f"HTTP {exc.status}")
    return violated(key, "the second key could read the sandbox")


def retry_after(seen: Sequence[Seen]) -> Finding:
    """Passive: the 429s that happened during the run, if any (none is provoked)."""
    key = "retry_after"
    limited = [s for s in seen if s.status == 429]
    if not limited:
        return skipped(
            key,
            f"not observed in {len(seen)} responses (the doctor does not provoke a 429: it "
            "would spend the per-IP request budget every client at this address shares)",
        )
    missing = [s for s in limited if not s.retry_after]
    if missing:
        return violated(key, f"{len(missing)} of {len(limited)} 429 answers had no Retry-After")
    return ok(
        key, f"{len(limited)} 429 answers, each with Retry-After (first: {limited[0].retry_after})"
    )
