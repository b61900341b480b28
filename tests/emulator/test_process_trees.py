"""Process trees: every descendant of a managed process, whatever its session or group.

Checklist 86 (docs/protocol.md 9) and docs/protocol.md C8.6: ``tree_exited`` stays false
while a ``setsid`` or double-forked descendant lives, DELETE kills them all and answers
``tree_exited: true`` only once none is left, and never touches another process's tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator
from provider.emulator.hostscan import scan_host

from .helpers import api, create_sandbox, data, sh, start_process

pytestmark = pytest.mark.anyio

# Every /proc/<pid>/stat line of the guest: "pid (comm) state ppid pgrp session ...".
PS = 'for d in /proc/[0-9]*; do read -r line < "$d/stat" 2>/dev/null && echo "$line"; done'
CHECKLIST_86 = "setsid sleep 1000 & ( (exec sleep 1000) & ) ; echo started"


@dataclass(frozen=True)
class GuestProc:
    pid: int
    comm: str
    ppid: int
    session: int


async def guest_procs(client: httpx.AsyncClient, sandbox_id: str) -> dict[int, GuestProc]:
    """Live guest processes, read from the guest's /proc by an exec (zombies left out)."""
    found = {}
    for line in (await sh(client, sandbox_id, PS))["stdout"].splitlines():
        head, _, rest = line.rpartition(")")
        pid, _, comm = head.partition(" (")
        fields = rest.split()
        if fields and fields[0] not in ("Z", "X"):
            found[int(pid)] = GuestProc(int(pid), comm, int(fields[1]), int(fields[3]))
    return found


async def sleepers(client: httpx.AsyncClient, sandbox_id: str) -> dict[int, GuestProc]:
    return {p.pid: p for p in (await guest_procs(client, sandbox_id)).values() if p.comm == "sleep"}


async def wait_sleepers(client: httpx.AsyncClient, sandbox_id: str, count: int) -> dict[int, Any]:
    with anyio.fail_after(10):
        while len(found := await sleepers(client, sandbox_id)) < count:
            await anyio.sleep(0.02)
    return found


def host_guest_pids(emu: Emulator, sandbox_id: str) -> set[int]:
    """Guest pids alive in the sandbox's PID namespace, seen from the host."""
    assert emu.core is not None
    guest = emu.core.sandboxes[sandbox_id].guest
    assert guest is not None and guest.pid_ns is not None
    return {p.guest_pid for p in scan_host({guest.pid_ns: None}).get(guest.pid_ns, [])}


def url(sandbox_id: str, process_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{sandbox_id}/processes/{process_id}{tail}"


async def leader_done(
    client: httpx.AsyncClient, sandbox_id: str, process_id: str
) -> dict[str, Any]:
    """The view once the leader has exited (``wait?scope=leader``)."""
    view = dict(data(await client.get(url(sandbox_id, process_id, "/wait"))))
    assert view["leader_exited"] is True
    return view


async def tree_wait_times_out(client: httpx.AsyncClient, sandbox_id: str, process_id: str) -> bool:
    params: dict[str, str | int] = {"scope": "tree", "timeout_ms": 100}
    return (
        await client.get(url(sandbox_id, process_id, "/wait"), params=params)
    ).status_code == 408


async def test_checklist_86_setsid_and_double_fork(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        proc = await start_process(client, sandbox_id, CHECKLIST_86)
        pid = proc["process_id"]
        view = await leader_done(client, sandbox_id, pid)
        assert view["exit_code"] == 0
        left = await wait_sleepers(client, sandbox_id, 2)
        assert len(left) == 2
        # One left the leader's session, the other was orphaned (its parent is gone).
        assert {p.session == proc["pid"] for p in left.values()} == {True, False}
        assert all(p.ppid != proc["pid"] for p in left.values())
        await anyio.sleep(0.2)  # and no late flip to true either
        view = dict(data(await client.get(url(sandbox_id, pid))))
        assert view["tree_exited"] is False and view["state"] == "exited"
        listed = data(await client.get(f"/v1/sandboxes/{sandbox_id}/processes"))["processes"]
        assert [p["tree_exited"] for p in listed] == [False]
        assert await tree_wait_times_out(client, sandbox_id, pid)
        deleted = data(await client.delete(url(sandbox_id, pid), params={"grace_ms": 200}))
        assert deleted["tree_exited"] is True and deleted["exit_code"] == 0
        assert await sleepers(client, sandbox_id) == {}
        assert not set(left) & host_guest_pids(emulator, sandbox_id)
        tree = await client.get(url(sandbox_id, pid, "/wait"), params={"scope": "tree"})
        assert data(tree)["tree_exited"] is True


async def test_setsid_grandchild_keeps_the_tree_until_delete(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        script = "(setsid bash -c 'exec sleep 300' &) ; echo leader-done"
        proc = await start_process(client, sandbox_id, script)
        pid = proc["process_id"]
        await leader_done(client, sandbox_id, pid)
        (grandchild,) = (await wait_sleepers(client, sandbox_id, 1)).values()
        assert grandchild.session == grandchild.pid != proc["pid"]
        assert grandchild.pid in host_guest_pids(emulator, sandbox_id)
        assert data(await client.get(url(sandbox_id, pid)))["tree_exited"] is False
        assert await tree_wait_times_out(client, sandbox_id, pid)
        deleted = data(await client.delete(url(sandbox_id, pid), params={"grace_ms": 100}))
        assert deleted["tree_exited"] is True
        assert grandchild.pid not in await guest_procs(client, sandbox_id)
        assert grandchild.pid not in host_guest_pids(emulator, sandbox_id)


async def test_delete_of_a_running_leader_kills_setsid_and_stubborn_descendants(
    emulator: Emulator,
) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        # A setsid'd child that double-forks in turn, one that ignores SIGTERM in a new
        # process group, and the leader still running: all of it goes within the grace.
        script = (
            "setsid bash -c '(sleep 1000 &) ; exec sleep 1000' & "
            "setsid -f bash -c \"trap '' TERM; exec sleep 1000\"; "
            "echo started; exec sleep 1000"
        )
        proc = await start_process(client, sandbox_id, script)
        pid = proc["process_id"]
        left = await wait_sleepers(client, sandbox_id, 4)
        assert len({p.session for p in left.values()}) >= 3
        deleted = data(await client.delete(url(sandbox_id, pid), params={"grace_ms": 300}))
        assert deleted["tree_exited"] is True and deleted["signal"] == "SIGTERM"
        assert await sleepers(client, sandbox_id) == {}
        assert not set(left) & host_guest_pids(emulator, sandbox_id)


async def test_delete_never_touches_another_process_or_exec_tree(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        keep_script = (
            "nohup sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/keep.pid; "
            "setsid sleep 1000 & echo $! > /tmp/keep-setsid.pid"
        )
        keep = await start_process(client, sandbox_id, keep_script)
        doomed = await start_process(client, sandbox_id, CHECKLIST_86)
        await leader_done(client, sandbox_id, keep["process_id"])
        await leader_done(client, sandbox_id, doomed["process_id"])
        # A background server started by a buffered exec outlives the exec, as before.
        served = await sh(client, sandbox_id, "setsid sleep 1000 & echo $!")
        server = int(served["stdout"])
        before = await wait_sleepers(client, sandbox_id, 5)
        keep_pids = [
            int((await sh(client, sandbox_id, f"cat /tmp/{name}.pid"))["stdout"])
            for name in ("keep", "keep-setsid")
        ]
        assert set(keep_pids) | {server} <= set(before)
        await anyio.sleep(0.3)  # normal leader exits never kill trees
        assert set(keep_pids) | {server} <= set(await sleepers(client, sandbox_id))
        view = data(await client.get(url(sandbox_id, keep["process_id"])))
        assert view["leader_exited"] is True and view["tree_exited"] is False
        deleted = await client.delete(url(sandbox_id, doomed["process_id"]), params={"grace_ms": 0})
        assert data(deleted)["tree_exited"] is True
        alive = await sh(client, sandbox_id, f"kill -0 {' '.join(map(str, keep_pids))} {server}")
        assert alive["exit_code"] == 0
        assert set(await sleepers(client, sandbox_id)) == set(keep_pids) | {server}
        view = data(await client.get(url(sandbox_id, keep["process_id"])))
        assert view["tree_exited"] is False
        assert data(await client.delete(url(sandbox_id, keep["process_id"])))["tree_exited"]
        assert set(await sleepers(client, sandbox_id)) == {server}


async def test_a_tree_whose_reaper_was_killed_is_still_tracked(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        other = await start_process(client, sandbox_id, "setsid sleep 1000 & echo other")
        # $PPID is the leader's reaper; SIGKILL is the one signal it cannot ignore.
        script = "setsid sleep 1000 & kill -9 $PPID; sleep 0.2; echo leader-done"
        proc = await start_process(client, sandbox_id, script)
        pid = proc["process_id"]
        view = await leader_done(client, sandbox_id, pid)
        assert view["exit_code"] == 0
        left = await wait_sleepers(client, sandbox_id, 2)
        await anyio.sleep(0.2)  # the test: no late flip to true either
        assert data(await client.get(url(sandbox_id, pid)))["tree_exited"] is False
        deleted = data(await client.delete(url(sandbox_id, pid), params={"grace_ms": 100}))
        assert deleted["tree_exited"] is True
        survivors = await sleepers(client, sandbox_id)
        assert len(survivors) == 1 and set(survivors) < set(left)
        assert data(await client.get(url(sandbox_id, other["process_id"])))["tree_exited"] is False
