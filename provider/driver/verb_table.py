"""Every host verb this worker serves, declared once: name -> params type -> handler.

Each :class:`Verb` row decodes the raw params into its type (:func:`decode_params`: a type error
names the field, never its value) and awaits its handler with the :class:`DriverContext`; the
handler answers the host's result, converting the driver's typed results (commands, syncs,
leases) to their wire dicts here and nowhere else. :mod:`provider.driver.service` builds the
method table from :data:`VERB_TABLE`; :mod:`provider.verbs` keeps the names alone, in the same
order, for the handshake (which answers before this module loads), and a test holds the two and
the manifest's capability flags together.

Every params type lives in :mod:`provider.driver.core.params`. The raw value is the host's
contract in one place only: environmentValidateConfig's ``config``, which
:func:`provider.config.validate_config` judges whole (its problems are a result, not an error).

Adding a verb:

1. its params type in :mod:`provider.driver.core.params`;
2. its handler module in its wing (its own work on typed values; a result type with a ``wire``
   method when it answers more than a dict it already has);
3. its name in :mod:`provider.verbs` (in its group, which the manifest's flags follow) and one
   row here, in the same place; a verb on an existing lease goes through
   :meth:`DriverContext.leased`;
4. its tests (tests/driver), with the request count of each path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic

import msgspec

from provider.config import validate_config
from provider.driver.commands.execute_verb import command_spec, run_relayed
from provider.driver.context import DriverContext
from provider.driver.core.params import (
    AcquireParams,
    CallParams,
    CancelSetupParams,
    CaptureParams,
    ChannelOpenParams,
    ChannelPairParams,
    ChannelWriteParams,
    DeleteTemplateParams,
    ExecuteParams,
    GetSetupParams,
    LeaseIdParams,
    LeaseParams,
    LoginInputParams,
    LoginOpenParams,
    LoginStopParams,
    P,
    RouteCloseParams,
    StartSetupParams,
    SyncParams,
    ValidateConfigParams,
    decode_params,
)
from provider.driver.core.runtime import DriverRuntime
from provider.driver.leases import acquire, lifecycle
from provider.driver.leases.answers import Released
from provider.driver.leases.probe import probe
from provider.driver.setup import template_capture, templates
from provider.driver.transfer.sync_plan import Direction
from provider.driver.transfer.sync_verb import SyncCall
from provider.errors import InvalidParams


@dataclass(frozen=True)
class Verb(Generic[P]):
    """One row: the host's ``name``, its ``params`` type, its ``handler``, and ``short``, the
    name in-process callers (tests, benches) use on :class:`~provider.driver.service.
    DriverService` (``service.execute(params)``)."""

    name: str
    params: type[P]
    handler: Callable[[DriverContext, P], Awaitable[Any]]
    short: str

    async def handle(self, context: DriverContext, params: dict[str, Any]) -> Any:
        return await self.handler(context, decode_params(params, self.params, self.name))


# -- the lease verbs ---------------------------------------------------------------------------


async def _validate_config(d: DriverContext, p: ValidateConfigParams) -> dict[str, Any]:
    if p.config is msgspec.UNSET:
        raise InvalidParams("environmentValidateConfig needs a config object.")
    return validate_config(p.config)


async def _probe(d: DriverContext, p: CallParams) -> dict[str, Any]:
    """A failed probe is a result (``ok: false``), not an error reply, so it is logged here
    (warn: mostly config or credentials; the summary is public text)."""
    outcome = await probe(d.runtime, p)
    if not outcome.ok:
        await d.log("warn", f"environmentProbe: {outcome.summary}", None)
    return outcome.wire()


async def _acquire(d: DriverContext, p: AcquireParams) -> dict[str, Any]:
    lease = await acquire.acquire(d.runtime, p, on_reusable=d.reaper.after_acquire)
    d.register(lease.call, lease.lease_id, lease.metadata)
    return lease.wire()


async def _resume(d: DriverContext, p: LeaseIdParams) -> dict[str, Any]:
    with d.reaper.in_use(p.providerLeaseId):
        lease = await lifecycle.resume(d.runtime, p)
    d.register(lease.call, lease.lease_id, lease.metadata)
    return lease.wire()


def _wire_released(released: Released | None) -> dict[str, Any] | None:
    return None if released is None else released.wire()


async def _release(d: DriverContext, p: LeaseIdParams) -> dict[str, Any] | None:
    released = await lifecycle.release(
        d.runtime,
        p,
        destroy=False,
        on_kept=d.reaper.after_keep,
        before_teardown=d.close_sessions,
    )
    return _wire_released(released)


async def _destroy(d: DriverContext, p: LeaseIdParams) -> dict[str, Any] | None:
    released = await lifecycle.release(d.runtime, p, destroy=True, before_teardown=d.close_sessions)
    return _wire_released(released)


async def _realize(d: DriverContext, p: LeaseParams) -> dict[str, Any]:
    realized = await lifecycle.realize(d.runtime, p)
    d.register(realized.call, p.lease.providerLeaseId, p.lease.metadata)
    return realized.wire()


async def _execute(d: DriverContext, p: ExecuteParams) -> dict[str, Any]:
    call = d.bind(p)
    spec = command_spec(p, call)  # refuses bad or oversized values before any request
    async with d.leased(call, p.lease, "command") as leased:
        result = await run_relayed(leased, spec, notify=d.notify, log=d.log)
    return result.wire()


def _sync(direction: Direction) -> Callable[[DriverContext, SyncParams], Awaitable[Any]]:
    async def handler(d: DriverContext, p: SyncParams) -> dict[str, Any]:
        call = d.bind(p)
        sync = SyncCall(d.runtime, p.operations, direction)
        async with d.leased(call, p.lease, "file sync", before_work=sync.plan) as leased:
            done = await sync.run(leased, log=d.log)
        return {"operations": [operation.wire() for operation in done]}

    return handler


def _on_runtime(
    handler: Callable[[DriverRuntime, P], Awaitable[dict[str, Any]]],
) -> Callable[[DriverContext, P], Awaitable[dict[str, Any]]]:
    """A handler that needs only the runtime (the setup and template verbs)."""
    return lambda d, p: handler(d.runtime, p)


# -- the table ---------------------------------------------------------------------------------

VERB_TABLE: Final[tuple[Verb[Any], ...]] = (
    Verb("environmentValidateConfig", ValidateConfigParams, _validate_config, "validate_config"),
    Verb("environmentProbe", CallParams, _probe, "probe"),
    Verb("environmentAcquireLease", AcquireParams, _acquire, "acquire"),
    Verb("environmentResumeLease", LeaseIdParams, _resume, "resume"),
    Verb("environmentReleaseLease", LeaseIdParams, _release, "release"),
    Verb("environmentDestroyLease", LeaseIdParams, _destroy, "destroy"),
    Verb("environmentRealizeWorkspace", LeaseParams, _realize, "realize"),
    Verb("environmentExecute", ExecuteParams, _execute, "execute"),
    Verb("environmentSyncIn", SyncParams, _sync("in"), "sync_in"),
    Verb("environmentSyncOut", SyncParams, _sync("out"), "sync_out"),
    # interactive setup and templates (docs/protocol.md H10.4): answers are the host's dicts
    Verb(
        "environmentStartInteractiveSetup",
        StartSetupParams,
        _on_runtime(templates.start_setup),
        "start_setup",
    ),
    Verb(
        "environmentGetInteractiveSetup",
        GetSetupParams,
        _on_runtime(templates.get_setup),
        "get_setup",
    ),
    Verb(
        "environmentCaptureTemplate",
        CaptureParams,
        _on_runtime(template_capture.capture_template),
        "capture_template",
    ),
    Verb(
        "environmentCancelInteractiveSetup",
        CancelSetupParams,
        _on_runtime(templates.cancel_setup),
        "cancel_setup",
    ),
    Verb(
        "environmentDeleteTemplate",
        DeleteTemplateParams,
        _on_runtime(template_capture.delete_template),
        "delete_template",
    ),
    # login terminals and duplex channels (docs/protocol.md 6 and 7)
    Verb("loginPtyOpen", LoginOpenParams, lambda d, p: d.login.open(p), "login_open"),
    Verb("loginPtyInput", LoginInputParams, lambda d, p: d.login.input(p), "login_input"),
    Verb("loginPtyStop", LoginStopParams, lambda d, p: d.login.stop(p), "login_stop"),
    Verb("loginPtyClose", RouteCloseParams, lambda d, p: d.login.close(p), "login_close"),
    Verb("duplexChannelOpen", ChannelOpenParams, lambda d, p: d.channels.open(p), "channel_open"),
    Verb(
        "duplexChannelWrite", ChannelWriteParams, lambda d, p: d.channels.write(p), "channel_write"
    ),
    Verb("duplexChannelStop", ChannelPairParams, lambda d, p: d.channels.stop(p), "channel_stop"),
    Verb("duplexChannelClose", RouteCloseParams, lambda d, p: d.channels.close(p), "channel_close"),
)
BY_SHORT_NAME: Final = {verb.short: verb for verb in VERB_TABLE}
