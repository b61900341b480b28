"""Host-call scenarios of the fault matrix: set up a lease, make the call, prove the lease intact.

Every scenario runs against the in-process driver (:class:`tests.driver.conftest.Harness`) and
the real emulator. ``call`` is the host call under fault; ``succeeded`` says whether its result
is the fault-free one; ``intact`` repeats the call with no fault injected (the lease must still
serve it); ``cleanup`` destroys whatever lease the scenario still holds; ``runs`` counts how
often the command under fault ran (None: not counted).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anyio

from devtools.call_params import bash
from provider.createos.errors import APIConnectionError
from provider.driver.transfer.sync_inline import INLINE_IN_CHARS, INLINE_OUT_BYTES
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import sandbox_shell

API_KEY = "test-key"
WS = "/paperclip-workspace"
GONE = {"providerLeaseId": None, "metadata": {"expired": True}}
REMOTE_TEXT = "remote contents: " + "x" * (INLINE_OUT_BYTES + 64) + "\n"
"""Over the inline bound of a sync out, so it is downloaded with GET (the cell's endpoint)."""
UPLOAD_TEXT = "uploaded bytes\n" * (INLINE_IN_CHARS // 15)
"""Over the inline bound of a sync in (its base64 is 4/3 of it), so it is uploaded with PUT."""
RUNS_FILE = "/tmp/paperclip-matrix-runs"
COUNT_RUN = f"echo run >> {RUNS_FILE}; "
"""Prefix of a command whose runs are counted: one line per run."""


class Scenario:
    """Base: no lease, nothing to repeat."""

    reuse = False

    def __init__(self, h: Harness, workdir: Path) -> None:
        self.h = h
        self.workdir = workdir
        self.lease: dict[str, Any] | None = None

    async def setup(self) -> None:
        """Runs before the fault is injected."""

    async def call(self) -> Any:
        raise NotImplementedError

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None

    def gone(self, value: Any) -> bool:
        return False

    def unconfirmed(self, error: Exception | None) -> bool:
        """Whether the call reported a cleanup it could not confirm (the lease is poisoned)."""
        return isinstance(error, CleanupUnconfirmed)

    async def intact(self) -> bool:
        """After a surfaced failure: does the lease still serve the same call?"""
        return True

    async def runs(self) -> int | None:
        """How many times the command under fault ran, when the scenario counts it."""
        return None

    async def cleanup(self) -> None:
        if self.lease is not None:
            await self.h.methods.destroy(self.ref())
            self.lease = None
        if self.watched_creates():
            # A create whose outcome stayed open: the next call carrying this config (here an
            # acquire, as a host would retry) looks for the sandbox and deletes it.
            await self.acquire()
            await self.h.methods.destroy(self.ref())
            self.lease = None

    def watched_creates(self) -> list[str]:
        key_hash = hashlib.sha256(API_KEY.encode()).hexdigest()
        journal = self.h.methods.runtime.journal
        return journal.orphan_creates(self.h.emulator.base_url, key_hash)

    # -- helpers -----------------------------------------------------------------------------

    def ref(self) -> dict[str, Any]:
        assert self.lease is not None
        return self.h.lease_ref(self.lease, reuseLease=self.reuse)

    def with_lease(self) -> dict[str, Any]:
        assert self.lease is not None
        return self.h.with_lease(self.lease, reuseLease=self.reuse)

    async def acquire(self) -> None:
        self.lease = await self.h.acquire(reuseLease=self.reuse)

    async def sh(self, script: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.h.methods.execute(bash(self.with_lease(), script))
        return result


class Acquire(Scenario):
    async def call(self) -> Any:
        lease = await self.h.acquire()
        self.lease = lease
        return lease

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None and isinstance(value["providerLeaseId"], str)


class AcquireLostCreate(Acquire):
    """The create's response is lost, so acquire lists sandboxes to find and delete it."""

    async def setup(self) -> None:
        await self.h.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", lose_response=True)

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        # Fault-free for the list means: the create's own failure surfaces, cleanup confirmed.
        return isinstance(error, APIConnectionError) and not isinstance(error, CleanupUnconfirmed)


class ResumeRunning(Scenario):
    reuse = True

    async def setup(self) -> None:
        await self.acquire()

    async def call(self) -> Any:
        return await self.h.methods.resume(self.ref())

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        assert self.lease is not None
        return error is None and value["providerLeaseId"] == self.lease["providerLeaseId"]

    def gone(self, value: Any) -> bool:
        return bool(value == GONE)

    async def intact(self) -> bool:
        value = await self.call()
        return self.succeeded(value, None)


class ResumePaused(ResumeRunning):
    async def setup(self) -> None:
        await self.acquire()
        receipt = await self.h.methods.release(self.ref())
        assert receipt is not None and receipt["state"] == "stopped"


class Destroy(Scenario):
    async def setup(self) -> None:
        await self.acquire()

    async def call(self) -> Any:
        assert self.lease is not None
        return await self.h.methods.destroy(self.ref())

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        ok = error is None and value is not None and value["state"] == "destroyed"
        if ok:
            self.lease = None
        return ok

    async def intact(self) -> bool:
        return self.succeeded(await self.call(), None)


class ReleaseReuse(Scenario):
    reuse = True

    async def setup(self) -> None:
        await self.acquire()

    async def call(self) -> Any:
        return await self.h.methods.release(self.ref())

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None and value is not None and value["state"] == "stopped"

    async def intact(self) -> bool:
        return self.succeeded(await self.call(), None)


class Execute(Scenario):
    command: tuple[str, ...] = ("bash", "-c", COUNT_RUN + "echo hello")
    stdout = "hello\n"
    timeout_ms: int | None = None

    async def setup(self) -> None:
        await self.acquire()

    async def call(self) -> Any:
        params: dict[str, Any] = {
            **self.with_lease(),
            "command": self.command[0],
            "args": list(self.command[1:]),
        }
        if self.timeout_ms is not None:
            params["timeoutMs"] = self.timeout_ms
        return await self.h.methods.execute(params)

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return (
            error is None
            and value["exitCode"] == 0
            and value["timedOut"] is False
            and value["stdout"] == self.stdout
        )

    async def intact(self) -> bool:
        return self.succeeded(await self.call(), None)

    async def runs(self) -> int | None:
        assert self.lease is not None
        return len((await sandbox_shell(self.h, self.lease, f"cat {RUNS_FILE}; true")).split())


class ExecuteLost(Execute):
    """The command's stream is cut after one frame: the worker then kills its tree by token,
    with the buffered exec under fault. The command outlives the cut, so the kill has work."""

    command = ("bash", "-c", COUNT_RUN + "echo one; sleep 0.3; echo two; sleep 0.3; echo three")
    stdout = "one\ntwo\nthree\n"

    async def setup(self) -> None:
        await super().setup()
        # Taken by the exec stream; the cell's fault, queued behind it, by the kill.
        await self.h.emulator.admin.add_fault("POST", r"/exec$", cut_after_frames=1)


class ExecuteCancelled(Scenario):
    """A reuse release while a command runs: the release cancels the command, whose tree is
    then killed by its token with one buffered exec (the one under fault)."""

    reuse = True
    script = "(sleep 300 &); setsid sleep 301 & echo started; sleep 302"

    async def setup(self) -> None:
        await self.acquire()
        # A pass-through taken by the exec stream; the cell's fault, queued behind it, by the kill.
        await self.h.emulator.admin.add_fault("POST", r"/exec$", delay_ms=1)
        self.outcome: list[BaseException] = []

    async def call(self) -> Any:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._command)
                with anyio.fail_after(20):
                    while ("stdout", "started\n") not in self.h.live_chunks():
                        await anyio.sleep(0.02)
                return await self.h.methods.release(self.ref())
        except BaseExceptionGroup as group:  # the release's own error, for the classification
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _command(self) -> None:
        try:
            await self.sh(self.script)
        except ProviderError as exc:
            self.outcome.append(exc)

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        assert self.lease is not None
        receipt = {"providerLeaseId": self.lease["providerLeaseId"], "state": "stopped"}
        cancelled = len(self.outcome) == 1 and "cancelled" in str(self.outcome[0])
        return error is None and value == receipt and cancelled

    def unconfirmed(self, error: Exception | None) -> bool:
        # The command reports the unconfirmed kill; the release then refuses to keep the lease.
        killed = [exc for exc in self.outcome if isinstance(exc, CleanupUnconfirmed)]
        return isinstance(error, RequestRefused) and len(killed) == len(self.outcome) == 1


class SyncIn(Scenario):
    async def setup(self) -> None:
        await self.acquire()
        self.source = self.workdir / "upload.txt"
        self.source.write_text(UPLOAD_TEXT)

    async def call(self) -> Any:
        op = {
            "operationId": "up",
            "files": [
                {"sourcePath": str(self.source), "targetPath": f"{WS}/up.txt", "kind": "file"}
            ],
        }
        return await self.h.methods.sync_in({**self.with_lease(), "operations": [op]})

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None and value["operations"][0]["filesTransferred"] == 1

    async def intact(self) -> bool:
        if not self.succeeded(await self.call(), None):
            return False
        return bool((await self.sh(f"cat {WS}/up.txt"))["stdout"] == UPLOAD_TEXT)


class SyncOut(Scenario):
    async def setup(self) -> None:
        await self.acquire()
        xs = len(REMOTE_TEXT) - len("remote contents: \n")
        await self.sh(
            f"{{ printf 'remote contents: '; head -c {xs} /dev/zero | tr '\\0' x; echo; }}"
            f" > {WS}/down.txt"
        )
        self.target = self.workdir / "out" / "down.txt"
        self.target.parent.mkdir()
        self.target.write_text("old host contents\n")

    async def call(self) -> Any:
        op = {
            "operationId": "down",
            "files": [
                {"sourcePath": f"{WS}/down.txt", "targetPath": str(self.target), "kind": "file"}
            ],
        }
        return await self.h.methods.sync_out({**self.with_lease(), "operations": [op]})

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None and self.target.read_text() == REMOTE_TEXT

    def leftovers(self) -> list[str]:
        return [p.name for p in self.target.parent.iterdir() if p.name != self.target.name]

    async def intact(self) -> bool:
        # A failed download leaves the old target and no temp folder (5.6); a repeat works.
        untouched = self.target.read_text() == "old host contents\n" and not self.leftovers()
        return untouched and self.succeeded(await self.call(), None)


class Probe(Scenario):
    async def call(self) -> Any:
        return await self.h.methods.probe(self.h.call())

    def succeeded(self, value: Any, error: Exception | None) -> bool:
        return error is None and value["ok"] is True


SCENARIOS: dict[str, type[Scenario]] = {
    "acquire": Acquire,
    "acquire-lost-create": AcquireLostCreate,
    "resume-running": ResumeRunning,
    "resume-paused": ResumePaused,
    "destroy": Destroy,
    "release-reuse": ReleaseReuse,
    "execute": Execute,
    "execute-lost": ExecuteLost,
    "execute-cancelled": ExecuteCancelled,
    "sync-in": SyncIn,
    "sync-out": SyncOut,
    "probe": Probe,
}
