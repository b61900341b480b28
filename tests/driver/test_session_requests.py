"""What duplex channels and login terminals cost on the wire, request by request, against the
emulator (issue 22, item 5): an open is the process create and its output stream's connect (no
start gate: the journal replays from ``after=0``; a login makes its session home in its own
script), a write one ``/input``, a stop one DELETE, a channel's close a ``stdin/close`` and that
DELETE."""

from __future__ import annotations

import hashlib

import pytest

from provider.errors import ProviderError
from tests.driver.conftest import Harness
from tests.driver.session_helpers import (
    channel_bytes,
    notes,
    open_channel,
    open_params,
    until,
    write,
)
from tests.driver.test_login import home, install_fake, open_login, output

pytestmark = pytest.mark.anyio
ROUTE = "duplex-route-1"
LOGIN_ROUTE = "7d1f3c9e-0000-4000-8000-0000000000aa"


async def calls_since(h: Harness, before: int) -> list[tuple[str, str]]:
    """(method, last path segment) of every request the emulator saw since ``before``."""
    return [
        (r["method"], r["path"].rsplit("/", 1)[-1])
        for r in (await h.emulator.admin.requests())[before:]
    ]


def is_process(segment: str) -> bool:
    return segment.startswith("proc_")


async def test_a_channel_opens_in_two_requests_writes_in_one_and_closes_in_two(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    before = await h.request_count()
    session = await open_channel(h, lease, ["bash", "-c", "printf ready; exec cat"])
    assert await calls_since(h, before) == [("POST", "processes"), ("GET", "connect")]
    await until(lambda: channel_bytes(h, ROUTE) == b"ready")
    before = await h.request_count()
    await write(h, ROUTE, session, b"ping")
    await until(lambda: channel_bytes(h, ROUTE) == b"readyping")
    assert await calls_since(h, before) == [("POST", "input")]
    # a child that outlives its stdin's EOF (as the host's gateway does, it keeps serving)
    before = await h.request_count()
    answer = await h.methods.channels.close({"hostRouteId": ROUTE})
    assert answer == {"hostRouteId": ROUTE, "workerSessionId": session}
    (close_stdin, kill) = await calls_since(h, before)
    assert close_stdin == ("POST", "close") and kill[0] == "DELETE" and is_process(kill[1])
    assert notes(h, "duplexChannel.exit", ROUTE)[0]["exitCode"] is None
    assert await h.emulator.admin.live_process_count() == 0


async def test_what_a_channel_prints_before_its_stream_is_attached_is_replayed_exactly(
    harness: Harness,
) -> None:
    """Without a gate the child starts before the reader connects: 600 KiB printed while the
    connect is held back still arrive whole, in order, before what follows."""
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", delay_ms=1500)
    script = "head -c 614400 /dev/zero | tr '\\0' 'x'; printf '#'; exec cat"
    session = await open_channel(h, lease, ["bash", "-c", script])
    await write(h, ROUTE, session, b"after")
    expected = b"x" * 614_400 + b"#after"
    await until(lambda: len(channel_bytes(h, ROUTE)) >= len(expected))
    got = channel_bytes(h, ROUTE)
    assert hashlib.sha256(got).digest() == hashlib.sha256(expected).digest()
    await h.methods.channels.close({"hostRouteId": ROUTE})


async def test_a_child_that_fills_the_journal_before_the_attach_fails_the_open_and_dies(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", delay_ms=3000)
    script = "head -c 3000000 /dev/zero; exec sleep 1000"
    with pytest.raises(ProviderError, match="410"):
        await h.methods.channels.open(open_params(h, lease, ROUTE, command=["bash", "-c", script]))
    assert await h.emulator.admin.live_process_count() == 0
    assert not notes(h, "duplexChannel.exit", ROUTE)


async def test_a_session_home_that_cannot_be_made_is_shown_and_exits_125_before_the_cli(
    harness: Harness,
) -> None:
    """The home's parent is a file: mkdir fails, the terminal says so, the CLI never runs."""
    h = harness
    lease = await h.acquire(workspace=False)
    await install_fake(h, lease)
    blocked = await h.methods.execute(
        {**h.with_lease(lease), "command": "touch", "args": ["/tmp/paperclip-adapter-login"]}
    )
    assert blocked["exitCode"] == 0
    session_home = home()
    session = await open_login(h, lease, session_home=session_home, route=LOGIN_ROUTE)
    await until(lambda: bool(notes(h, "loginPty.exit", LOGIN_ROUTE)))
    assert notes(h, "loginPty.exit", LOGIN_ROUTE) == [
        {"hostRouteId": LOGIN_ROUTE, "workerSessionId": session, "exitCode": 125}
    ]
    text = output(h, LOGIN_ROUTE)
    assert f"Creating the login's session home {session_home} failed." in text
    assert "home=" not in text  # the fake CLI never started
