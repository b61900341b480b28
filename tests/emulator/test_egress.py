"""Egress (checklist 87): the rule grammar on create, fork and PUT, the stored normalized list,
and the coarse enforcement (a restrictive list = own network namespace, loopback only)."""

from __future__ import annotations

from typing import Any

import pytest

from provider.egress_rules import ACCEPTED_FORMS
from provider.emulator import Emulator

from .helpers import (
    OPEN_NETWORK,
    api,
    create_sandbox,
    data,
    host_listener,
    network_mode,
    reaches_host,
    sh,
    wait_status,
)

pytestmark = pytest.mark.anyio


async def test_checklist_87_restricted_sandbox_cannot_reach_the_host(emulator: Emulator) -> None:
    async with api(emulator) as client, host_listener() as port:
        restricted = await create_sandbox(client, egress=["example.com"])
        open_ids = [
            await create_sandbox(client),
            await create_sandbox(client, egress=["*"]),
            await create_sandbox(client, egress=[]),
            await create_sandbox(client, egress=None),
        ]
        assert not await reaches_host(client, restricted, port)
        interfaces = await sh(client, restricted, "tail -n +3 /proc/net/dev | cut -d: -f1")
        assert interfaces["stdout"].split() == ["lo"]
        assert await network_mode(emulator, restricted) == "loopback-only"
        for sandbox_id in open_ids:
            assert await reaches_host(client, sandbox_id, port), sandbox_id
            assert await network_mode(emulator, sandbox_id) == OPEN_NETWORK
        # Loopback inside the restricted sandbox still works (its own).
        own = await sh(
            client,
            restricted,
            'python3 -c \'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); '
            's.listen(); c=socket.create_connection(s.getsockname(), timeout=2); print("ok")\'',
        )
        assert own["stdout"] == "ok\n", own


async def test_put_then_get_returns_the_new_list_and_keeps_the_network_mode(
    emulator: Emulator,
) -> None:
    async with api(emulator) as client, host_listener() as port:
        restricted = await create_sandbox(client, egress=["example.com"])
        allowed = await create_sandbox(client)
        base = f"/v1/sandboxes/{restricted}/egress"
        put = await client.put(base, json={"egress": ["GitHub.com", "10.0.0.0/8", "*"]})
        assert put.status_code == 200
        assert data(put) == {"id": restricted, "egress": ["github.com", "10.0.0.0/8", "*"]}
        assert data(await client.get(base))["egress"] == ["github.com", "10.0.0.0/8", "*"]
        view = data(await client.get(f"/v1/sandboxes/{restricted}"))
        assert view["egress"] == ["github.com", "10.0.0.0/8", "*"]
        # The mode was chosen at create: an allow-all list later does not open the network...
        assert not await reaches_host(client, restricted, port)
        assert data(await client.put(base, json={"egress": None}))["egress"] == []
        assert not await reaches_host(client, restricted, port)
        # ... and a restrictive list does not close it.
        other = f"/v1/sandboxes/{allowed}/egress"
        assert data(await client.put(other, json={"egress": ["example.com"]}))["egress"] == [
            "example.com"
        ]
        assert await reaches_host(client, allowed, port)


async def test_put_works_in_every_live_state(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, egress=["example.com"])
        base = f"/v1/sandboxes/{sandbox_id}"
        await client.post(f"{base}/pause")
        await wait_status(client, sandbox_id, "paused")
        put = await client.put(f"{base}/egress", json={"egress": ["a.example.com"]})
        assert data(put)["egress"] == ["a.example.com"]
        await emulator.admin.force_state(sandbox_id, "error")
        put = await client.put(f"{base}/egress", json={"egress": ["b.example.com:443"]})
        assert data(put)["egress"] == ["b.example.com:443"]
        assert data(await client.get(f"{base}/egress"))["egress"] == ["b.example.com:443"]
        await client.delete(base)
        gone = await client.put(f"{base}/egress", json={"egress": ["c.example.com"]})
        assert gone.status_code in (404, 409)


async def test_restricted_mode_survives_pause_and_resume(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client, host_listener() as port:
        for egress, reachable in ((["example.com"], False), (None, True)):
            sandbox_id = await create_sandbox(client, egress=egress)
            base = f"/v1/sandboxes/{sandbox_id}"
            for _ in range(2):
                await client.post(f"{base}/pause")
                await wait_status(client, sandbox_id, "paused")
                await client.put(f"{base}/egress", json={"egress": ["*"]})
                await client.post(f"{base}/resume")
                await wait_status(client, sandbox_id, "running")
                assert await reaches_host(client, sandbox_id, port) is reachable


VALID = [
    ("*", "*"),
    ("GitHub.com", "github.com"),
    ("  api.github.com  ", "api.github.com"),
    ("*.Example.COM", "*.example.com"),
    ("example.com:443", "example.com:443"),
    ("203.0.113.7", "203.0.113.7"),
    ("203.0.113.7:22", "203.0.113.7:22"),
    ("10.0.0.0/8", "10.0.0.0/8"),
    ("10.0.0.0/8:5432", "10.0.0.0/8:5432"),
    ("2001:DB8::1", "2001:db8::1"),
    ("2001:db8:0:0::/32", "2001:db8::/32"),
    ("[2001:db8::1]:443", "[2001:db8::1]:443"),
    ("[2001:db8::]", "2001:db8::"),
]
INVALID = [
    "",
    "   ",
    "has space.com",
    "trailing.dot.",
    "-bad.example.com",
    "bad-.example.com",
    "under_score.com",
    "a" * 64 + ".com",
    "example.com:0",
    "example.com:65536",
    "example.com:0443",
    "example.com:",
    "10.0.0.1/8",
    "10.0.0.0/33",
    "1.2.3.4.5",
    "[2001:db8::1]:99999",
    "2001:db8::g",
    "[10.0.0.1]:443",
    "fe80::1%eth0",
    "*.",
    "x" * 261,
    "tab\there.com",
]


async def test_grammar_normalizes_and_refuses_by_index(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        base = f"/v1/sandboxes/{sandbox_id}/egress"
        put = await client.put(base, json={"egress": [raw for raw, _ in VALID]})
        assert data(put)["egress"] == [normal for _, normal in VALID]
        stored = data(put)["egress"]
        for entry in INVALID:
            for rules in ([entry], ["ok.example.com", entry]):
                response = await client.put(base, json={"egress": rules})
                _assert_refused(response, f"egress[{len(rules) - 1}]", entry)
        for bad in ([3], [None], [["x"]], [{"host": "x"}]):
            _assert_refused(await client.put(base, json={"egress": bad}), "egress[0]", None)
        assert (await client.put(base, json={"egress": "github.com"})).status_code == 400
        assert data(await client.get(base))["egress"] == stored  # refusals changed nothing


async def test_create_and_fork_refuse_a_bad_rule_without_echoing_it(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0)
    secret = "sk_live_0123456789abcdef"
    async with api(emulator) as client:
        response = await client.post(
            "/v1/sandboxes",
            json={"shape": "s-1vcpu-1gb", "egress": ["github.com", "ok.example", secret]},
        )
        _assert_refused(response, "egress[2]", secret)
        assert (await emulator.admin.state())["sandboxes"] == []
        source = await create_sandbox(client)
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        forked = await client.post(f"/v1/sandboxes/{source}/fork", json={"egress": [secret]})
        _assert_refused(forked, "egress[0]", secret)
        assert len((await emulator.admin.state())["sandboxes"]) == 1


def _assert_refused(response: Any, field: str, entry: str | None) -> None:
    assert response.status_code == 400, response.text
    envelope = response.json()
    assert envelope["status"] == "fail"
    assert list(envelope["data"]) == [field], envelope
    message = envelope["data"][field]
    assert message.startswith(f"{field} is not a valid rule: ")
    assert "github.com" in message  # the accepted forms, with examples
    if entry is not None and entry.strip():
        assert entry.strip() not in response.text.replace(ACCEPTED_FORMS, "")
