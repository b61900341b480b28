"""Interactive setup sessions (docs/protocol.md 8.1-8.2, docs/protocol.md H10.4): start, get
and cancel. Capture and template deletion live in :mod:`provider.driver.setup.template_capture`.

A setup session is a sandbox the operator prepares by hand; capturing it pauses it and makes it
a *snapshot template* that leases fork (8.4). Start creates the sandbox (``pc-setup-<uuid>``, the
config's ``rootfs``, the base egress list, no idle pause) or forks the session's source template
(then disarms the idle pause it inherited), prepares the workspace and a fresh marker, and
answers ``waiting_for_user`` with a ``createos_shell`` connection: a command the operator runs
(``python3 -m provider shell --api-url '<origin>' '<sandbox id>'``), which takes the API key
from the operator's own ``CREATEOS_API_KEY``; the key is never in the payload.

The session's metadata binds it to this company, environment and endpoint (a digest, since the
host redacts every key that looks like a URL, a host, a lease or a sandbox id, see
:data:`SETUP_METADATA_KEYS`); get, capture and cancel refuse before any HTTP request unless it
matches the call.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

from provider.config import DEFAULT_API_URL, EnvironmentConfig
from provider.createos.errors import NotFound
from provider.createos.models import is_valid_id
from provider.driver.commands.sandbox_ops import delete_sandbox_confirmed, read_status, transition
from provider.driver.core.ownership import PROVIDER_NAME, SETUP_SESSION, check_owned
from provider.driver.core.params import CancelSetupParams, GetSetupParams, StartSetupParams
from provider.driver.core.runtime import BoundCall, DriverRuntime, bind_call, deadline
from provider.driver.leases.acquire import provision_sandbox
from provider.driver.leases.placement import Placement, merge_egress
from provider.driver.leases.recovery import recover_orphans
from provider.errors import RequestRefused

CONNECTION_TYPE: Final = "createos_shell"
TEMPLATE_KIND: Final = "snapshot"
SETUP_NAME_PREFIX: Final = "pc-setup-"
#: What start answers as metadata. None of these keys (nor any value) matches the host's
#: redaction rules (docs/protocol.md H10.4), so the host hands them back unchanged.
SETUP_METADATA_KEYS: Final = (
    "provider",
    "companyId",
    "environmentId",
    "endpointDigest",
    "setupMarker",
    "expiresAt",
)
MISSING_STATES: Final = frozenset({"destroying", "destroyed", "failed"})
_MARKER_RE: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def endpoint_digest(api_url: str) -> str:
    """sha256 hex of the normalized API origin: names the endpoint without a URL-like value."""
    return hashlib.sha256(api_url.encode("utf-8")).hexdigest()


def setup_name() -> str:
    return f"{SETUP_NAME_PREFIX}{uuid.uuid4()}"


def _quote(text: str) -> str:
    """POSIX single quotes (always, so the command reads the same for every origin and id)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def connection_payload(api_url: str, sandbox_id: str, expires_at: str | None) -> dict[str, Any]:
    """The operator's way in (8.1): our attach helper, and for the official endpoint the
    official CLI's equivalent too. The key is never part of it."""
    payload: dict[str, Any] = {
        "type": CONNECTION_TYPE,
        "command": f"python3 -m provider shell --api-url {_quote(api_url)} {_quote(sandbox_id)}",
        "expiresAt": expires_at,
    }
    if api_url == DEFAULT_API_URL:
        # the official CLI (for operators who have it); an id needs no quoting (docs/protocol.md
        # C1.9)
        payload["alternativeCommand"] = f"createos sandbox shell {sandbox_id}"
    return payload


def setup_placement(config: EnvironmentConfig, source: str | None) -> Placement:
    """A setup sandbox: the config's rootfs (none when forking a template), the base egress
    list, never reusable, no idle pause (a fork's inherited one is disarmed by PATCH)."""
    return Placement(
        rootfs=None if source is not None else config.rootfs,
        adapter_type=None,
        base_egress=config.egress_allowlist,
        effective_egress=merge_egress(config.egress_allowlist, ()),
        reusable=False,
        window=None,
        snapshot=source,
    )


def session_answer(
    call: BoundCall,
    sandbox_id: str,
    metadata: dict[str, Any],
    *,
    include_payload: bool,
) -> dict[str, Any]:
    expires_at = metadata.get("expiresAt")
    answer: dict[str, Any] = {
        "providerLeaseId": sandbox_id,
        "status": "waiting_for_user",
        "expiresAt": expires_at,
        "connectionSummary": {
            "type": CONNECTION_TYPE,
            "hostRedacted": True,
            "portRedacted": True,
            "expiresAt": expires_at,
        },
    }
    if include_payload:
        answer["connectionPayload"] = connection_payload(
            call.config.api_url, sandbox_id, expires_at
        )
    answer["metadata"] = metadata
    return answer


def _missing(sandbox_id: str | None, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "providerLeaseId": sandbox_id,
        "status": "missing",
        "connectionSummary": None,
    }
    if metadata is not None:
        answer["metadata"] = metadata
    return answer


def _source_template(params: StartSetupParams) -> str | None:
    kind, ref = params.sourceTemplateKind, params.sourceTemplateRef
    if kind is not None and kind != TEMPLATE_KIND:
        raise RequestRefused(
            f"CreateOS setup sessions can start only from a {TEMPLATE_KIND} template (a paused "
            "CreateOS sandbox), not from another kind of template."
        )
    if ref is None:
        return None
    if not is_valid_id(ref):
        raise RequestRefused("The source template is not a valid CreateOS sandbox id.")
    return ref


def check_setup(
    call: BoundCall, lease_id: str | None, metadata: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """Refuse (before any HTTP request) a malformed id or setup metadata that this call did not
    start; returns the sandbox id and our part of the metadata."""
    sandbox_id, meta = check_owned(
        SETUP_SESSION,
        lease_id,
        metadata,
        (
            ("company", "companyId", call.company_id),
            ("environment", "environmentId", call.environment_id),
            ("API endpoint", "endpointDigest", endpoint_digest(call.config.api_url)),
        ),
    )
    marker = meta.get("setupMarker")
    if not isinstance(marker, str) or not _MARKER_RE.fullmatch(marker):
        raise RequestRefused("This setup session's metadata has no valid setupMarker.")
    expires_at = meta.get("expiresAt")
    ours = {key: meta[key] for key in SETUP_METADATA_KEYS if key in meta}
    ours["expiresAt"] = expires_at if isinstance(expires_at, str) else None
    return sandbox_id, ours


# -- start / get / cancel ------------------------------------------------------------------


async def start_setup(runtime: DriverRuntime, params: StartSetupParams) -> dict[str, Any]:
    call = bind_call(runtime, params)
    source = _source_template(params)
    expires_at = params.expiresAt or None
    placement = setup_placement(call.config, source)
    await recover_orphans(runtime, call)
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(call.timeout, "Starting the CreateOS setup sandbox"):
            sandbox_id, marker = await provision_sandbox(
                client,
                call,
                runtime.journal,
                placement,
                name=None if source is not None else setup_name(),
            )
    metadata = {
        "provider": PROVIDER_NAME,
        "companyId": call.company_id,
        "environmentId": call.environment_id,
        "endpointDigest": endpoint_digest(call.config.api_url),
        "setupMarker": marker,
        "expiresAt": expires_at,
    }
    return session_answer(call, sandbox_id, metadata, include_payload=True)


async def get_setup(runtime: DriverRuntime, params: GetSetupParams) -> dict[str, Any]:
    if not params.providerLeaseId:
        return _missing(None)
    call = bind_call(runtime, params)
    sandbox_id, metadata = check_setup(call, params.providerLeaseId, params.setupMetadata)
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(call.timeout, "Reading the CreateOS setup sandbox"):
            try:
                status = await read_status(client, sandbox_id)
                if status in MISSING_STATES:
                    return _missing(sandbox_id, metadata)
                if status != "running":  # paused by hand or by CreateOS: bring it back
                    await transition(client, sandbox_id, "running")
            except NotFound:
                return _missing(sandbox_id, metadata)
    return session_answer(
        call, sandbox_id, metadata, include_payload=bool(params.includeConnectionPayload)
    )


async def cancel_setup(runtime: DriverRuntime, params: CancelSetupParams) -> dict[str, Any]:
    if not params.providerLeaseId:
        return {"status": "missing"}
    call = bind_call(runtime, params)
    sandbox_id, _metadata = check_setup(call, params.providerLeaseId, params.setupMetadata)
    if params.reason == "promoted":  # the sandbox now *is* the template: keep it
        return {
            "status": "cancelled",
            "metadata": {"provider": PROVIDER_NAME, "templateKept": True},
        }
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(call.timeout, "Deleting the CreateOS setup sandbox"):
            try:
                if (await client.get_sandbox(sandbox_id)).status == "destroyed":
                    return {"status": "missing"}
            except NotFound:
                return {"status": "missing"}
            await delete_sandbox_confirmed(client, sandbox_id)
    return {"status": "timed_out" if params.reason == "timed_out" else "cancelled"}
