"""What every driver call shares: the lease tracker, the client factory, the call's binding.

``DriverRuntime`` is built once per worker by the composition root; its ``background``
tasks live as long as the worker (the composition root runs them, shutdown cancels them).
``bind_call`` turns a request's common params into a :class:`BoundCall` (parsed config,
resolved key) and ``owned_scope`` applies the ownership rule of docs/protocol.md 2.1
(:mod:`provider.driver.core.ownership`) before any HTTP request.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from provider.config import EnvironmentConfig, parse_config, resolve_api_key
from provider.createos.client import CreateOSClient
from provider.createos.pacer import pacer_for
from provider.createos.pool import ConnectionPool
from provider.createos.wire import Wire
from provider.driver.core.background import BackgroundTasks
from provider.driver.core.budget import CleanupBound, host_bound
from provider.driver.core.gone import GoneLeases
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.keepalive import default_interval
from provider.driver.core.names import scope_tag
from provider.driver.core.ownership import LEASE, check_owned
from provider.driver.core.params import CallParams
from provider.driver.core.process_records import JournaledProcesses
from provider.driver.core.tracker import LeaseTracker, ScopeKey
from provider.errors import ProviderError, RateLimitQueued

ROOT = "/paperclip-workspace"

ClientFactory = Callable[[EnvironmentConfig, str], CreateOSClient]


def default_client_factory(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
    """The default: replaced in each runtime by a client on the runtime's shared pool."""
    return CreateOSClient(config.api_url, api_key, pacer=pacer_for(config.api_url))


@dataclass
class DriverRuntime:
    tracker: LeaseTracker = field(default_factory=LeaseTracker)
    client_factory: ClientFactory = default_client_factory
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    journal: LeaseJournal = field(default_factory=lambda: LeaseJournal(None))
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    pool: ConnectionPool = field(default_factory=ConnectionPool)
    #: seconds between keepalive reads of a warm lease, from its window (tests shorten it)
    keepalive_interval: Callable[[int], float] = default_interval
    #: (origin, key hash) pairs whose open creates a background job is looking for
    create_watches: set[tuple[str, str]] = field(default_factory=set)
    #: leases with a deadline this worker deletes when it comes (provider.driver.leases.expiry)
    expiry_lines: set[str] = field(default_factory=set)
    #: sandboxes known to be gone (deleted or 404), backed by the journal
    gone: GoneLeases = field(init=False)

    def __post_init__(self) -> None:
        self.gone = GoneLeases(self.journal)
        if self.client_factory is default_client_factory:  # keep-alive connections per key
            pool = self.pool
            self.client_factory = lambda config, api_key: pool.client(config.api_url, api_key)

    async def load_poison(self, scope: ScopeKey) -> None:
        """Take over a poison mark a previous (crashed) worker left in the journal."""
        if not self.tracker.is_unconfirmed(scope) and await anyio.to_thread.run_sync(
            self.journal.is_unconfirmed, scope
        ):
            self.tracker.mark_unconfirmed(scope)

    async def poison(self, scope: ScopeKey) -> None:
        self.tracker.mark_unconfirmed(scope)
        await anyio.to_thread.run_sync(self.journal.mark_unconfirmed, scope)

    async def clear_poison(self, scope: ScopeKey) -> None:
        self.tracker.clear_unconfirmed(scope)
        await anyio.to_thread.run_sync(self.journal.clear_unconfirmed, scope)


@dataclass(frozen=True)
class BoundCall:
    """One call's parsed config, resolved key and identity; ``received``: when the worker got
    the call (anyio time), from which the host's budget for it counts."""

    config: EnvironmentConfig
    api_key: str
    company_id: str
    environment_id: str
    received: float = -math.inf

    def scope(self, lease_id: str) -> ScopeKey:
        return ScopeKey.build(
            company_id=self.company_id,
            environment_id=self.environment_id,
            api_url=self.config.api_url,
            api_key=self.api_key,
            lease_id=lease_id,
        )

    @property
    def timeout(self) -> float:
        return self.config.timeout_ms / 1000

    def cleanup_bound(self, cap: float) -> CleanupBound:
        """Cleanup of this call: ``cap`` seconds, never past the host's budget for a verb whose
        budget counts from ``config.timeoutMs`` (acquire, release, destroy, sync)."""
        if math.isinf(self.received):
            return CleanupBound(cap)
        return host_bound(cap, self.timeout, since=self.received)

    @property
    def scope_tag(self) -> str:
        """This environment's tag in sandbox names and the kept-fork ledger (2.13)."""
        return scope_tag(self.company_id, self.environment_id, self.config.api_url)


@dataclass(frozen=True)
class LeasedCall:
    """A call on an existing lease while it works (``provider.driver.leased``): its binding,
    the claimed lease's scope and an open client; ``records`` journals its processes."""

    runtime: DriverRuntime
    call: BoundCall
    scope: ScopeKey
    client: CreateOSClient

    @property
    def records(self) -> JournaledProcesses:
        return JournaledProcesses(self.runtime.journal, self.scope)


def bind_call(runtime: DriverRuntime, params: CallParams) -> BoundCall:
    config = parse_config(params.config)
    api_key = resolve_api_key(config, runtime.environ)
    return BoundCall(
        config, api_key, params.companyId, params.environmentId, received=anyio.current_time()
    )


def owned_scope(
    call: BoundCall, lease_id: str | None, metadata: Mapping[str, Any] | None
) -> ScopeKey:
    """Refuse (before any HTTP request) a missing, malformed or foreign lease."""
    sandbox_id, _ = check_owned(
        LEASE,
        lease_id,
        metadata,
        (
            ("company", "companyId", call.company_id),
            ("environment", "environmentId", call.environment_id),
            ("API endpoint", "apiUrl", call.config.api_url),
        ),
    )
    return call.scope(sandbox_id)


@contextmanager
def deadline(seconds: float, what: str, *, wire: Wire | None = None) -> Iterator[None]:
    """A deadline as an anyio cancel scope; expiry becomes a clear :class:`ProviderError`, or
    :class:`RateLimitQueued` when it came while ``wire``'s request waited for its turn."""
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError as exc:
        if wire is not None and wire.queued and not wire.sent:
            raise RateLimitQueued(
                f"{what} did not finish within {seconds:g} s: its request was still waiting "
                "for its turn in the CreateOS rate-limit queue (the API allows 300 requests a "
                "minute per address), so nothing was sent. Try again later or with a longer "
                "timeoutMs."
            ) from exc
        raise ProviderError(f"{what} did not finish within {seconds:g} s.") from exc
