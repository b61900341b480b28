"""The Paperclip environment-driver methods: raw params in, JSON-ready results out.

``DriverService`` is what ``provider.driver.methods`` hands every call to: it decodes each
request's params into typed structs, applies the per-call guards and hands off to the lease,
execute and sync logic. It knows nothing of JSON-RPC framing; the functions it is given
(``notify``, ``log``) send host notifications for it. Its :class:`Reaper` sweeps kept sandboxes
in the runtime's background tasks after reusable acquires and kept releases.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from provider.config import validate_config
from provider.createos.client import CreateOSClient
from provider.driver.commands.execute import (
    CommandSpec,
    prepare_command,
    run_command,
    timeout_seconds,
)
from provider.driver.commands.live import LiveRelay
from provider.driver.core.budget import host_bound
from provider.driver.core.keepalive import keepalive, warm_window
from provider.driver.core.params import (
    AcquireParams,
    CallParams,
    CancelSetupParams,
    CaptureParams,
    DeleteTemplateParams,
    ExecuteParams,
    GetSetupParams,
    LeaseIdParams,
    LeaseParams,
    P,
    StartSetupParams,
    SyncParams,
    decode_params,
)
from provider.driver.core.process_records import JournaledProcesses
from provider.driver.core.runtime import BoundCall, DriverRuntime, bind_call, deadline, owned_scope
from provider.driver.core.tracker import ScopeKey
from provider.driver.interactive.channels import DuplexChannels
from provider.driver.interactive.hub import Interactive
from provider.driver.interactive.login import LoginTerminals
from provider.driver.interactive.registry import LeaseRef
from provider.driver.leases import acquire, lifecycle
from provider.driver.leases.probe import probe
from provider.driver.leases.reaper import Reaper
from provider.driver.leases.recovery import claim_lease
from provider.driver.setup import template_capture, templates
from provider.driver.transfer.sync import SyncSession
from provider.driver.transfer.sync_plan import Direction, plan_sync
from provider.driver.transfer.sync_size import check_sync_sizes
from provider.errors import CleanupUnconfirmed, InvalidParams

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
DecodingHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]
SHUTDOWN_BUDGET = 8.0


class DriverService:
    def __init__(
        self, runtime: DriverRuntime, *, notify: Notify, log: Log, reaper: Reaper | None = None
    ) -> None:
        self.runtime = runtime
        self.notify = notify
        self.log = log
        self.reaper = reaper if reaper is not None else Reaper(runtime, log)
        self.interactive = Interactive(runtime, notify=notify, log=log)
        self.login = LoginTerminals(self.interactive)
        self.channels = DuplexChannels(self.interactive)
        self.start_setup = self._decoding(
            "environmentStartInteractiveSetup", StartSetupParams, templates.start_setup
        )
        self.get_setup = self._decoding(
            "environmentGetInteractiveSetup", GetSetupParams, templates.get_setup
        )
        self.capture_template = self._decoding(
            "environmentCaptureTemplate", CaptureParams, template_capture.capture_template
        )
        self.cancel_setup = self._decoding(
            "environmentCancelInteractiveSetup", CancelSetupParams, templates.cancel_setup
        )
        self.delete_template = self._decoding(
            "environmentDeleteTemplate", DeleteTemplateParams, template_capture.delete_template
        )

    def table(self) -> dict[str, Handler]:
        return {
            "environmentValidateConfig": self.validate_config,
            "environmentProbe": self.probe,
            "environmentAcquireLease": self.acquire,
            "environmentResumeLease": self.resume,
            "environmentReleaseLease": self.release,
            "environmentDestroyLease": self.destroy,
            "environmentRealizeWorkspace": self.realize,
            "environmentExecute": self.execute,
            "environmentSyncIn": self.sync_in,
            "environmentSyncOut": self.sync_out,
            "environmentStartInteractiveSetup": self.start_setup,
            "environmentGetInteractiveSetup": self.get_setup,
            "environmentCaptureTemplate": self.capture_template,
            "environmentCancelInteractiveSetup": self.cancel_setup,
            "environmentDeleteTemplate": self.delete_template,
            "loginPtyOpen": self.login.open,
            "loginPtyInput": self.login.input,
            "loginPtyStop": self.login.stop,
            "loginPtyClose": self.login.close,
            "duplexChannelOpen": self.channels.open,
            "duplexChannelWrite": self.channels.write,
            "duplexChannelStop": self.channels.stop,
            "duplexChannelClose": self.channels.close,
        }

    async def shutdown(self) -> None:
        """Cancel tracked work and close every terminal and channel, within one budget."""
        self.runtime.tracker.shutting_down = True  # opens refuse from here on
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: self.runtime.tracker.shutdown(budget=SHUTDOWN_BUDGET))
            with anyio.move_on_after(SHUTDOWN_BUDGET):
                await self.interactive.close_all()
        self.interactive.registry.clear()
        self.runtime.background.cancel()  # a sweep in flight is housekeeping: drop it
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await self.runtime.pool.aclose()  # the work is over: close the shared connections

    # -- leases ------------------------------------------------------------------------------

    async def validate_config(self, params: dict[str, Any]) -> dict[str, Any]:
        if "config" not in params:
            raise InvalidParams("environmentValidateConfig needs a config object.")
        return validate_config(params["config"])

    async def probe(self, params: dict[str, Any]) -> dict[str, Any]:
        """A failed probe is a result (``ok: false``), not an error reply, so it is logged here
        (warn: mostly config or credentials; the summary is public text)."""
        result = await probe(self.runtime, decode_params(params, CallParams, "environmentProbe"))
        if not result.get("ok"):
            await self.log("warn", f"environmentProbe: {result.get('summary')}", None)
        return result

    async def acquire(self, params: dict[str, Any]) -> dict[str, Any]:
        decoded = decode_params(params, AcquireParams, "environmentAcquireLease")
        lease = await acquire.acquire(self.runtime, decoded, on_reusable=self.reaper.after_acquire)
        self._register(decoded, lease.get("providerLeaseId"), lease.get("metadata"))
        return lease

    async def resume(self, params: dict[str, Any]) -> dict[str, Any]:
        decoded = decode_params(params, LeaseIdParams, "environmentResumeLease")
        with self.reaper.in_use(decoded.providerLeaseId):
            lease = await lifecycle.resume(self.runtime, decoded)
        self._register(decoded, lease.get("providerLeaseId"), lease.get("metadata"))
        return lease

    async def release(self, params: dict[str, Any]) -> dict[str, Any] | None:
        decoded = decode_params(params, LeaseIdParams, "environmentReleaseLease")
        return await lifecycle.release(
            self.runtime,
            decoded,
            destroy=False,
            on_kept=self.reaper.after_keep,
            before_teardown=self._close_sessions,
        )

    async def destroy(self, params: dict[str, Any]) -> dict[str, Any] | None:
        decoded = decode_params(params, LeaseIdParams, "environmentDestroyLease")
        return await lifecycle.release(
            self.runtime, decoded, destroy=True, before_teardown=self._close_sessions
        )

    async def realize(self, params: dict[str, Any]) -> dict[str, Any]:
        decoded = decode_params(params, LeaseParams, "environmentRealizeWorkspace")
        result = await lifecycle.realize(self.runtime, decoded)
        self._register(decoded, decoded.lease.providerLeaseId, decoded.lease.metadata)
        return result

    def _register(self, params: CallParams, lease_id: Any, metadata: Any) -> None:
        """2.12: an owned call (re)registers its lease for terminal and channel opens."""
        if isinstance(lease_id, str) and lease_id:
            window = warm_window(metadata if isinstance(metadata, dict) else None)
            self.interactive.register(bind_call(self.runtime, params), lease_id, window)

    async def _close_sessions(self, call: BoundCall, lease_id: str) -> None:
        """Release and destroy: forget the lease, then close its terminals and channels."""
        self.interactive.forget(call, lease_id)
        await self.interactive.close_lease(LeaseRef(call.company_id, call.environment_id, lease_id))

    # -- interactive setup and templates (8) -------------------------------------------------

    # Each decodes its params and hands them to templates / template_capture; assigned in
    # __init__ (through _decoding) so the five share one shape.
    start_setup: DecodingHandler
    get_setup: DecodingHandler
    capture_template: DecodingHandler
    cancel_setup: DecodingHandler
    delete_template: DecodingHandler

    def _decoding(
        self,
        method: str,
        kind: type[P],
        handler: Callable[[DriverRuntime, P], Awaitable[dict[str, Any]]],
    ) -> DecodingHandler:
        async def handle(params: dict[str, Any]) -> dict[str, Any]:
            return await handler(self.runtime, decode_params(params, kind, method))

        return handle

    # -- execute -----------------------------------------------------------------------------

    async def execute(self, params: dict[str, Any]) -> dict[str, Any]:
        p = decode_params(params, ExecuteParams, "environmentExecute")
        call = bind_call(self.runtime, p)
        timeout = (
            call.timeout
            if p.timeoutMs is None
            else timeout_seconds(p.timeoutMs, "The command's timeoutMs")
        )
        spec = CommandSpec(
            command=p.command,
            args=p.args or [],
            cwd=p.cwd,
            env=p.env or {},
            stdin=p.stdin,
            timeout=timeout,
        )
        prepare_command(spec)  # refuses bad or oversized values before any request
        scope = await self._claim(call, p.lease.providerLeaseId, p.lease.metadata)
        self.interactive.register(call, scope.lease_id, warm_window(p.lease.metadata))
        relay = LiveRelay(self.notify)
        failure: Exception | None = None
        async with (
            self.runtime.tracker.track(scope, "command"),
            self.runtime.client_factory(call.config, call.api_key) as client,
            self._keepalive(client, scope, p.lease.metadata),
            self._poison_on_unconfirmed(scope),
            self.runtime.gone.on_not_found(scope),
        ):
            # The relay's writer runs beside the command; the result is answered once it has
            # sent every live chunk. A failure is re-raised outside the task group so that it
            # keeps its own type (never an ExceptionGroup); cancellation passes through.
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run)
                try:
                    result = await run_command(
                        client,
                        scope.lease_id,
                        spec,
                        on_output=relay.put,
                        cleanup_timeout=host_bound(call.timeout, timeout, since=call.received),
                        record=JournaledProcesses(self.runtime.journal, scope),
                        log=self.log,
                    )
                except Exception as exc:
                    failure = exc
                finally:
                    relay.close()
            if failure is not None:
                raise failure
            return result

    # -- sync --------------------------------------------------------------------------------

    async def sync_in(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._sync(params, "in")

    async def sync_out(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._sync(params, "out")

    async def _sync(self, params: dict[str, Any], direction: Direction) -> dict[str, Any]:
        method = "environmentSyncIn" if direction == "in" else "environmentSyncOut"
        p = decode_params(params, SyncParams, method)
        call = bind_call(self.runtime, p)
        scope = await self._claim(call, p.lease.providerLeaseId, p.lease.metadata)
        self.interactive.register(call, scope.lease_id, warm_window(p.lease.metadata))
        self.runtime.tracker.check_usable(scope, "sync files")
        planned = await plan_sync(p.operations, direction)
        check_sync_sizes(planned, direction)
        async with (
            self.runtime.tracker.track(scope, "file sync"),
            self.runtime.client_factory(call.config, call.api_key) as client,
            self._keepalive(client, scope, p.lease.metadata),
        ):
            records = JournaledProcesses(self.runtime.journal, scope)
            session = SyncSession(
                client,
                scope.lease_id,
                cleanup_timeout=call.cleanup_bound(call.timeout),
                log=self.log,
                journal=self.runtime.journal,
                record=records,
                scratches=records,
            )
            async with self._poison_on_unconfirmed(scope), self.runtime.gone.on_not_found(scope):
                with deadline(call.timeout, "The file sync"):
                    if direction == "in":
                        results = await session.sync_in(planned)
                    else:
                        results = await session.sync_out(planned)
        return {"operations": results}

    def _keepalive(
        self, client: CreateOSClient, scope: ScopeKey, metadata: dict[str, Any] | None
    ) -> AbstractAsyncContextManager[None]:
        """Keepalive reads while the work runs, on a warm lease only (2.10.6)."""
        return keepalive(
            self.runtime.background,
            client,
            scope.lease_id,
            warm_window(metadata),
            self.runtime.keepalive_interval,
        )

    async def _claim(
        self, call: BoundCall, lease_id: str | None, metadata: dict[str, Any] | None
    ) -> ScopeKey:
        """:func:`claim_lease`, refusing first (without a request) a lease known to be gone."""
        await self.runtime.gone.refuse(owned_scope(call, lease_id, metadata))
        return await claim_lease(self.runtime, call, lease_id, metadata)

    @asynccontextmanager
    async def _poison_on_unconfirmed(self, scope: ScopeKey) -> AsyncIterator[None]:
        """Poison the lease (memory and journal) when CleanupUnconfirmed leaves the block."""
        try:
            yield
        except CleanupUnconfirmed:
            with anyio.CancelScope(shield=True):
                await self.runtime.poison(scope)
            raise
