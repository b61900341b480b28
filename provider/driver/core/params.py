"""Typed request params of the environment-driver methods, decoded strictly with msgspec.

Every environment call carries ``{driverKey, companyId, environmentId, issueId?, config}``; the
lease-bearing calls add either ``providerLeaseId`` + ``leaseMetadata`` (resume, release,
destroy) or a ``lease`` object (realize, execute, sync). Unknown keys are tolerated (the host
adds new ones over time); wrong types are refused with :class:`InvalidParams` naming the field.
``config`` stays a raw mapping here: ``provider.config.parse_config`` owns its rules. The
interactive-setup and template calls (docs/protocol.md H10.4) carry ``providerLeaseId`` +
``setupMetadata`` (get, capture, cancel) or ``templateRef`` + ``metadata`` (delete). The login
terminal and duplex channel calls (docs/protocol.md 6 and 7) name a lease or a session by
route. Every verb's params type is here; :mod:`provider.driver.verb_table` says which verb
decodes into which.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from provider.errors import InvalidParams


class ValidateConfigParams(msgspec.Struct, kw_only=True):
    """environmentValidateConfig: the raw config is the host's contract here (any JSON value;
    :func:`provider.config.validate_config` answers its problems as a result, not an error), so
    only its presence is checked (``UNSET`` when the params have none)."""

    config: Any = msgspec.UNSET


class CallParams(msgspec.Struct, kw_only=True):
    companyId: str
    environmentId: str
    config: dict[str, Any]
    driverKey: str | None = None
    issueId: str | None = None


class AcquireParams(CallParams, kw_only=True):
    runId: str | None = None
    requestedExpiresAt: Any = None
    # Tolerant on purpose: only a non-empty string counts
    # (provider.driver.leases.reuse.is_reusable); anything else (null, a number) just makes the
    # lease disposable.
    agentId: Any = None
    executionWorkspaceId: Any = None
    # Checked by provider.driver.leases.placement: adapterType picks a rootfs, networkEgress grants
    # widen the egress allowlist (a malformed one is refused there, by field and position).
    adapterType: Any = None
    executionWorkspaceSettings: Any = None


class LeaseIdParams(CallParams, kw_only=True):
    """resume / release / destroy."""

    providerLeaseId: str | None = None
    leaseMetadata: dict[str, Any] | None = None
    cancelActiveWork: bool | None = None


class Lease(msgspec.Struct, kw_only=True):
    providerLeaseId: str | None = None
    metadata: dict[str, Any] | None = None
    expiresAt: str | None = None


class LeaseParams(CallParams, kw_only=True):
    """realize (and the base of execute / sync)."""

    lease: Lease


class ExecuteParams(LeaseParams, kw_only=True):
    command: str
    args: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin: str | None = None
    timeoutMs: int | float | None = None


class SyncMapping(msgspec.Struct, kw_only=True):
    sourcePath: str
    targetPath: str
    kind: str
    mode: int | None = None
    exclude: list[str] | None = None
    followSymlinks: bool | None = None


class PostUploadCommand(msgspec.Struct, kw_only=True):
    command: str
    cwd: str | None = None
    timeoutMs: int | float | None = None


class SyncOperation(msgspec.Struct, kw_only=True):
    operationId: str | None = None
    files: list[SyncMapping] = msgspec.field(default_factory=list)
    postUploadCommands: list[PostUploadCommand] | None = None


class SyncParams(LeaseParams, kw_only=True):
    operations: list[SyncOperation]


class StartSetupParams(CallParams, kw_only=True):
    """environmentStartInteractiveSetup (docs/protocol.md H10.4)."""

    sessionId: str | None = None
    sourceTemplateRef: str | None = None
    sourceTemplateKind: str | None = None
    connectionExpiresInMinutes: int | float | None = None
    expiresAt: str | None = None


class SetupParams(CallParams, kw_only=True):
    """The calls on a running setup session: get, capture, cancel."""

    providerLeaseId: str | None = None
    setupMetadata: dict[str, Any] | None = None


class GetSetupParams(SetupParams, kw_only=True):
    includeConnectionPayload: bool | None = None
    connectionExpiresInMinutes: int | float | None = None


class CaptureParams(SetupParams, kw_only=True):
    sourceTemplateRef: str | None = None
    previousTemplateRef: str | None = None
    templateLabel: str | None = None
    timeoutMs: int | float | None = None


class CancelSetupParams(SetupParams, kw_only=True):
    reason: str | None = None


class DeleteTemplateParams(CallParams, kw_only=True):
    templateRef: str
    templateKind: str | None = None
    metadata: dict[str, Any] | None = None
    reason: str | None = None


class RouteOpenParams(msgspec.Struct, kw_only=True):
    """loginPtyOpen and duplexChannelOpen: a host route onto a lease this worker holds."""

    hostRouteId: str
    companyId: str
    environmentId: str
    providerLeaseId: str
    driverKey: str | None = None


class LoginOpenParams(RouteOpenParams, kw_only=True):
    loginCommandKey: str
    sessionHome: str


class LoginInputParams(msgspec.Struct, kw_only=True):
    workerSessionId: str
    data: str


class LoginStopParams(msgspec.Struct, kw_only=True):
    workerSessionId: str


class RouteCloseParams(msgspec.Struct, kw_only=True):
    """loginPtyClose and duplexChannelClose."""

    hostRouteId: str
    workerSessionId: str | None = None


class ChannelOpenParams(RouteOpenParams, kw_only=True):
    command: list[str]


class ChannelPairParams(msgspec.Struct, kw_only=True):
    """duplexChannelStop (and the base of write)."""

    hostRouteId: str
    workerSessionId: str


class ChannelWriteParams(ChannelPairParams, kw_only=True):
    data: str


P = TypeVar("P", bound=msgspec.Struct)


def decode_params(params: dict[str, Any], kind: type[P], method: str) -> P:
    """Convert raw params into ``kind``; a type error names the field, never its value."""
    try:
        return msgspec.convert(params, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidParams(f"Invalid params for {method}: {exc}") from exc
