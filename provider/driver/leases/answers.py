"""What the lease verbs answer, typed inside the driver and turned into the host's result
dicts only at the verb edge (:mod:`provider.driver.verb_table`), each by its own ``wire``.

Acquire, resume and realize hand back the call they bound, so the edge registers the lease
for terminal and channel opens without parsing the config again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from provider.driver.core.ownership import PROVIDER_NAME
from provider.driver.core.runtime import ROOT, BoundCall


@dataclass(frozen=True)
class LeaseAnswer:
    """Acquire's and resume's answer: the lease, or none (``lease_id`` None) once it is gone."""

    call: BoundCall
    lease_id: str | None
    metadata: dict[str, Any]
    expires_at: str | None = None  # ISO 8601: the deadline of a lease acquired with one

    @classmethod
    def gone(cls, call: BoundCall) -> LeaseAnswer:
        """The lease is gone (deleted, replaced or not ours any more): the host acquires anew."""
        return cls(call, None, {"expired": True})

    def wire(self) -> dict[str, Any]:
        if self.lease_id is None:
            return {"providerLeaseId": None, "metadata": self.metadata}
        return {
            "providerLeaseId": self.lease_id,
            "metadata": self.metadata,
            "expiresAt": self.expires_at,
        }


@dataclass(frozen=True)
class Realized:
    """Realize's answer (the workspace is the sandbox's fixed root), with the call it bound."""

    call: BoundCall

    def wire(self) -> dict[str, Any]:
        return {"cwd": ROOT, "metadata": {"provider": PROVIDER_NAME, "remoteCwd": ROOT}}


@dataclass(frozen=True)
class Released:
    """Release's and destroy's answer: the sandbox was deleted or kept (``stopped``)."""

    lease_id: str
    state: Literal["destroyed", "stopped"]

    def wire(self) -> dict[str, Any]:
        return {"providerLeaseId": self.lease_id, "state": self.state}
