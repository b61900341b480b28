"""environmentProbe: create a sandbox, run one command in it, delete it (provider-behavior 2.7).

A probe answers ``ok: false`` with a sanitized summary for every ordinary failure (bad config,
create refused, command failed), but a sandbox it could not delete fails the RPC itself: a
leaked, billable sandbox must never look like a clean probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from provider.driver.commands.execute import CommandSpec, run_command
from provider.driver.commands.sandbox_ops import delete_sandbox_confirmed
from provider.driver.core.params import CallParams
from provider.driver.core.runtime import ROOT, DriverRuntime, bind_call, deadline
from provider.driver.leases.acquire import disposable_placement, provision_sandbox
from provider.driver.leases.recovery import recover_orphans
from provider.errors import CleanupUnconfirmed, ProviderError

READY_TOKEN = "paperclip-createos-ready"  # noqa: S105 - a marker word, not a secret
PROBE_DEADLINE_CAP = 90.0
DELETE_DEADLINE_CAP = 25.0


@dataclass(frozen=True)
class ProbeOutcome:
    """The probe's answer; ``summary`` is public text (never a secret)."""

    ok: bool
    summary: str

    def wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary}


async def probe(runtime: DriverRuntime, params: CallParams) -> ProbeOutcome:
    try:
        call = bind_call(runtime, params)
    except ProviderError as exc:
        return ProbeOutcome(ok=False, summary=str(exc))
    await recover_orphans(runtime, call)
    sandbox_id: str | None = None
    async with runtime.client_factory(call.config, call.api_key) as client:
        try:
            budget = min(call.timeout, PROBE_DEADLINE_CAP)
            with deadline(budget, "The CreateOS probe"):
                sandbox_id, _marker = await provision_sandbox(
                    client, call, runtime.journal, disposable_placement(call)
                )
                result = await run_command(
                    client,
                    sandbox_id,
                    CommandSpec(command="/bin/echo", args=[READY_TOKEN], cwd=ROOT, timeout=budget),
                    on_output=None,
                    cleanup_timeout=min(call.timeout, DELETE_DEADLINE_CAP),
                )
            if result.timed_out or result.exit_code != 0 or READY_TOKEN not in result.stdout:
                outcome = ProbeOutcome(
                    ok=False,
                    summary="A CreateOS sandbox was created but the test command did not "
                    f"succeed (exit code {result.exit_code}, timed out: {result.timed_out}).",
                )
            else:
                outcome = ProbeOutcome(
                    ok=True,
                    summary=f"Created a {call.config.shape} CreateOS sandbox at "
                    f"{call.config.api_url}, ran a command in {ROOT} and deleted the sandbox.",
                )
        except CleanupUnconfirmed:
            if sandbox_id is None:
                raise  # the half-made sandbox may be left behind: never a clean "ok: false"
            # The command's tree kill was not confirmed; deleting the sandbox below ends it.
            outcome = ProbeOutcome(
                ok=False,
                summary="The probe command could not be stopped cleanly; its sandbox is "
                "being deleted.",
            )
        except ProviderError as exc:
            outcome = ProbeOutcome(ok=False, summary=str(exc))
        finally:
            if sandbox_id is not None:
                with anyio.CancelScope(shield=True):
                    try:
                        with deadline(min(call.timeout, DELETE_DEADLINE_CAP), "Deleting"):
                            await delete_sandbox_confirmed(client, sandbox_id)
                    except ProviderError as exc:
                        raise ProviderError(
                            f"The probe could not delete its sandbox {sandbox_id} ({exc}); it may "
                            f"be left behind. Delete {sandbox_id} in CreateOS."
                        ) from exc
    return outcome
