"""A sandbox create whose answer never arrives may land after its name lookup found nothing.

docs/protocol.md 2.3 looks the sandbox up by its name token once; a create that timed out on
our side can still be served afterwards. The worker hands such a token to recovery (journal
``abandon_create``), and the next call with the same origin and key deletes the late sandbox.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from provider.createos.errors import APITimeout
from provider.driver.core.journal import LeaseJournal
from provider.emulator import Emulator
from tests.reliability.fault_runner import find_leaks, matrix_harness
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

KEY_HASH = hashlib.sha256(b"test-key").hexdigest()
ORIGIN = "http://127.0.0.1:1"


async def test_a_create_that_lands_after_its_lookup_is_deleted_by_the_next_call(
    emulator: Emulator, tmp_path: Path
) -> None:
    async with matrix_harness(emulator, tmp_path) as h:
        h.plan.set("POST", r"^/v1/sandboxes$", 0.5)
        await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", delay_ms=3000)
        with pytest.raises(APITimeout):
            await h.acquire()
        h.plan.clear()
        assert h.journal is not None
        assert len(h.journal.orphan_creates(emulator.base_url, KEY_HASH)) == 1

        early = await h.acquire()  # before the late create lands: nothing found, still watched
        assert len(h.journal.orphan_creates(emulator.base_url, KEY_HASH)) == 1
        await h.methods.destroy(h.lease_ref(early))

        async def create_served() -> bool:
            rows = (await emulator.admin.state())["sandboxes"]
            return any(row["id"] != early["providerLeaseId"] for row in rows)

        await wait_until(create_served)
        late = (await emulator.admin.state())["sandboxes"]
        assert len(late) == 1  # the create was served after the worker gave up on it

        lease = await h.acquire()  # the next call carrying the config deletes it
        live = [s["id"] for s in (await emulator.admin.state())["sandboxes"]]
        assert live == [lease["providerLeaseId"]]
        assert h.journal.orphan_creates(emulator.base_url, KEY_HASH) == []
        await h.methods.destroy(h.lease_ref(lease))
        assert await find_leaks(h) == []


def test_an_abandoned_create_is_an_orphan_while_it_is_watched(tmp_path: Path) -> None:
    journal = LeaseJournal(tmp_path / "j.sqlite3")
    journal.add_create(ORIGIN, KEY_HASH, "pc-open")
    journal.add_create(ORIGIN, KEY_HASH, "pc-running")
    assert journal.orphan_creates(ORIGIN, KEY_HASH) == []  # both owned by this live process

    journal.abandon_create("pc-open")
    assert journal.orphan_creates(ORIGIN, KEY_HASH) == ["pc-open"]
    assert journal.watching_create("pc-open")
    assert not journal.watching_create("pc-running")

    journal.abandon_create("pc-running", watch_seconds=0)
    assert sorted(journal.orphan_creates(ORIGIN, KEY_HASH)) == ["pc-open", "pc-running"]
    assert not journal.watching_create("pc-running")  # found or not, the next lookup settles it
