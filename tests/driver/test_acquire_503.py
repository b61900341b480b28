"""Acquire under a 503 on create: not an unknown outcome (the server did not process it)."""

from __future__ import annotations

import hashlib

import pytest

from provider.createos.errors import ServerError
from provider.errors import CleanupUnconfirmed
from tests.driver.conftest import Harness
from tests.driver.test_leases import live_sandboxes

pytestmark = pytest.mark.anyio


def calls(log: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(r["method"], r["path"], r["status"]) for r in log]


async def test_a_create_answered_503_once_is_retried_into_one_lease(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", status=503)

    lease = await h.acquire()

    log = calls(await h.emulator.admin.requests())
    assert [c for c in log if c[1] == "/v1/sandboxes"] == [
        ("POST", "/v1/sandboxes", 503),
        ("POST", "/v1/sandboxes", 200),
    ]  # and no list by name token: the outcome was never unknown
    assert [s["id"] for s in await live_sandboxes(h)] == [lease["providerLeaseId"]]
    await h.methods.destroy(h.lease_ref(lease))


async def test_a_create_refused_503_after_its_retries_fails_without_a_lookup(
    harness: Harness,
) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", status=503, times=3)

    with pytest.raises(ServerError, match="503") as caught:
        await h.acquire()

    assert not isinstance(caught.value, CleanupUnconfirmed)
    log = calls(await h.emulator.admin.requests())
    assert log == [("POST", "/v1/sandboxes", 503)] * 3  # no list, no delete
    assert await live_sandboxes(h) == []
    key_hash = hashlib.sha256(b"test-key").hexdigest()
    assert h.methods.runtime.journal.orphan_creates(h.emulator.base_url, key_hash) == []
