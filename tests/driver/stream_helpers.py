"""Helpers of the execute tests: run a command, see what it sent, look into the sandbox."""

from __future__ import annotations

from typing import Any

import httpx

from tests.driver.conftest import Harness

TREE_SCAN = (
    "for d in /proc/[0-9]*; do "
    "tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -q '^PAPERCLIP_CMD=' && "
    "echo \"${d#/proc/} $(tr '\\0' ' ' < $d/cmdline)\"; done; true"
)
"""Every process carrying a command token, with its command line (run without one itself)."""


async def run(h: Harness, lease: dict[str, Any], command: str, *args: str, **extra: Any) -> Any:
    return await h.methods.execute(
        {**h.with_lease(lease), "command": command, "args": list(args), **extra}
    )


async def requests_of(
    h: Harness, lease: dict[str, Any], *args: str, **extra: Any
) -> tuple[Any, list[tuple[str, str]]]:
    """Run one command; answer its result and the (method, path tail) of every request made."""
    seen = max([0, *(r["seq"] for r in await h.emulator.admin.requests())])
    result = await run(h, lease, *args, **extra)
    return result, await requests_since(h, lease, seen)


async def requests_since(h: Harness, lease: dict[str, Any], seen: int) -> list[tuple[str, str]]:
    prefix = f"/v1/sandboxes/{lease['providerLeaseId']}"
    return [
        (r["method"], r["path"].removeprefix(prefix))
        for r in await h.emulator.admin.requests(since=seen)
    ]


async def last_seq(h: Harness) -> int:
    return int(max([0, *(r["seq"] for r in await h.emulator.admin.requests())]))


async def sandbox_shell(h: Harness, lease: dict[str, Any], script: str) -> str:
    """``bash -c script`` by a plain buffered exec, straight to the emulator (no token, not
    through the worker): what the sandbox looks like from outside the command."""
    return await shell_at(h.emulator.base_url, lease["providerLeaseId"], script)


async def shell_at(base_url: str, sandbox_id: str, script: str) -> str:
    """:func:`sandbox_shell` for any emulator and sandbox (key ``test-key``)."""
    async with httpx.AsyncClient(base_url=base_url) as http:
        answer = await http.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            headers={"X-Api-Key": "test-key"},
            json={"cmd": "/bin/bash", "args": ["-c", script]},
        )
    answer.raise_for_status()
    return str(answer.json()["data"]["result"]["stdout"])


async def token_carriers(h: Harness, lease: dict[str, Any]) -> list[str]:
    """``"<pid> <cmdline>"`` of every live process carrying a command token."""
    return (await sandbox_shell(h, lease, TREE_SCAN)).splitlines()


async def carriers_at(base_url: str, sandbox_id: str) -> list[str]:
    """:func:`token_carriers` for any emulator and sandbox."""
    return (await shell_at(base_url, sandbox_id, TREE_SCAN)).splitlines()


async def use_managed_processes(h: Harness, lease: dict[str, Any]) -> int:
    """Make the emulator's origin look like an older CreateOS (its exec stream answers 404
    once), so this worker runs commands there as managed processes from now on. Answers the
    request log's position after that first command."""
    await h.emulator.admin.add_fault("POST", r"/exec$", status=404)
    result = await run(h, lease, "true")
    assert result["exitCode"] == 0
    return await last_seq(h)
