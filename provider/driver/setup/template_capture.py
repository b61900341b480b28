"""Capturing a setup sandbox as a snapshot template, and deleting a template
(docs/protocol.md 8.3, docs/protocol.md H10.4).

Capture proves the sandbox is the session's (its marker file holds the session's
``setupMarker``), stops every process tree left in it (the operator's shell included, so forks
inherit none), and pauses it: the paused sandbox *is* the template, ``templateRef`` its id. The
capture metadata names the environment and the endpoint (by digest) so that a later delete can
refuse a template this environment did not capture. Delete never touches a sandbox that is not
paused (a live lease is never a template); forks made from a template are independent of it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from provider.createos.errors import NotFound
from provider.driver.commands.execute import timeout_seconds
from provider.driver.commands.sandbox_ops import (
    delete_sandbox_confirmed,
    read_status,
    stop_every_tree,
    transition,
)
from provider.driver.core.ownership import PROVIDER_NAME, TEMPLATE, check_owned
from provider.driver.core.params import CaptureParams, DeleteTemplateParams
from provider.driver.core.runtime import BoundCall, DriverRuntime, bind_call, deadline
from provider.driver.leases.acquire import MARKER_PATH
from provider.driver.setup.templates import TEMPLATE_KIND, check_setup, endpoint_digest
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused

#: States in which a sandbox may be in use by a lease (or on its way there): never deleted as
#: a template. Everything else (paused, error, failed, destroying) goes through the delete
#: routine; destroyed and 404 are already deleted.
LIVE_STATES: Final = frozenset({"running", "creating", "forking", "pausing", "resuming"})


def capture_metadata(call: BoundCall) -> dict[str, Any]:
    """What capture answers; the host stores it with the template and hands it to delete."""
    return {
        "provider": PROVIDER_NAME,
        "environmentId": call.environment_id,
        "endpointDigest": endpoint_digest(call.config.api_url),
        "capturedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


async def capture_template(runtime: DriverRuntime, params: CaptureParams) -> dict[str, Any]:
    call = bind_call(runtime, params)
    if not params.providerLeaseId:
        raise RequestRefused("Capturing a template needs the setup session's providerLeaseId.")
    sandbox_id, metadata = check_setup(call, params.providerLeaseId, params.setupMetadata)
    timeout = (
        call.timeout
        if params.timeoutMs is None
        else timeout_seconds(params.timeoutMs, "The capture's timeoutMs")
    )
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(timeout, "Capturing the CreateOS template"):
            try:
                await transition(client, sandbox_id, "running")
                check = await client.exec(sandbox_id, "/bin/cat", [MARKER_PATH])
                if check.exit_code != 0 or check.stdout != metadata["setupMarker"]:
                    raise ProviderError(
                        f"Sandbox {sandbox_id} is not the sandbox this setup session prepared "
                        "(its marker file does not match), so it was not captured."
                    )
                if not await stop_every_tree(client, sandbox_id):
                    raise CleanupUnconfirmed(
                        f"A process in setup sandbox {sandbox_id} could not be stopped, so it "
                        "was not captured (every fork would inherit it). Try again, or cancel "
                        "the session."
                    )
                await transition(client, sandbox_id, "paused")
            except NotFound:
                raise ProviderError(
                    f"The setup sandbox {sandbox_id} no longer exists; start a new setup session."
                ) from None
    return {
        "templateRef": sandbox_id,
        "templateKind": TEMPLATE_KIND,
        "metadata": capture_metadata(call),
    }


def _check_template(call: BoundCall, params: DeleteTemplateParams) -> str:
    """Refuse (before any HTTP request) another kind, a malformed ref, or a template this
    environment and endpoint did not capture."""
    if params.templateKind is not None and params.templateKind != TEMPLATE_KIND:
        raise RequestRefused(
            f"CreateOS templates are {TEMPLATE_KIND}s; this template is of another kind."
        )
    ref, _ = check_owned(
        TEMPLATE,
        params.templateRef,
        params.metadata,
        (
            ("environment", "environmentId", call.environment_id),
            ("API endpoint", "endpointDigest", endpoint_digest(call.config.api_url)),
        ),
    )
    return ref


async def delete_template(runtime: DriverRuntime, params: DeleteTemplateParams) -> dict[str, Any]:
    call = bind_call(runtime, params)
    ref = _check_template(call, params)
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(call.timeout, "Deleting the CreateOS template"):
            try:
                status = await read_status(client, ref)
                if status == "destroyed":
                    return {"deleted": True}
                if status in LIVE_STATES:
                    raise ProviderError(
                        f"Sandbox {ref} is {status}, not a paused template: it may be in use, "
                        "so it was not deleted."
                    )
                await delete_sandbox_confirmed(client, ref)
            except NotFound:
                pass  # already gone
    return {"deleted": True}
