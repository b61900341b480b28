"""The lease registry (docs/protocol.md 2.12): what an interactive open needs to find.

A login-terminal or duplex-channel open names a lease by ``(companyId, environmentId,
providerLeaseId)`` and carries no config or key. Every owned call on a lease (acquire, resume,
realize, execute, sync) therefore (re)registers its bound call here, the latest winning;
release, destroy and shutdown remove it. It lives in memory only: after a worker restart an
open on a lease that no later call re-registered fails closed, and the host starts over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class LeaseRef:
    """How an open names its lease."""

    company_id: str
    environment_id: str
    lease_id: str


class LeaseRegistry(Generic[T]):
    """``LeaseRef`` -> the latest owned call's binding (config and key)."""

    def __init__(self) -> None:
        self._entries: dict[LeaseRef, T] = {}

    def register(self, ref: LeaseRef, binding: T) -> None:
        self._entries.pop(ref, None)  # re-insert: the newest registration is the last one
        self._entries[ref] = binding

    def lookup(self, ref: LeaseRef) -> T | None:
        return self._entries.get(ref)

    def remove(self, ref: LeaseRef) -> None:
        self._entries.pop(ref, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
