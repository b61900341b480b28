"""What duplex channels and login terminals cost on the wire, request by request, against the
emulator (issue 22, item 5): a login opens with the process create and its output stream's
connect (it makes its session home in its own script), a channel with those and its start
gate's ``/input``; a write is one ``/input``, a stop one DELETE, a channel's close a
``stdin/close`` and that DELETE."""

from __future__ import annotations

import hashlib

import pytest

from tests.driver.conftest import Harness
from tests.driver.session_helpers import (
    channel_bytes,
    notes,
    open_channel,
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


async def test_a_channel_opens_in_three_requests_writes_in_one_and_closes_in_two(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    before = await h.request_count()
    session = await open_channel(h, lease, ["bash", "-c", "printf ready; exec cat"])
    opened = [("POST", "processes"), ("GET", "connect"), ("POST", "input")]
    assert await calls_since(h, before) == opened
    await until(lambda: channel_bytes(h, ROUTE) == b"ready")
    before = await h.request_count()
    await write(h, ROUTE, session, b"ping")
    await until(lambda: channel_bytes(h, ROUTE) == b"readyping")
    assert await calls_since(h, before) == [("POST", "input")]
    # a child that outlives its stdin's EOF (as the host's gateway does, it keeps serving)
    before = await h.request_count()
    answer = await h.methods.channel_close({"hostRouteId": ROUTE})
    assert answer == {"hostRouteId": ROUTE, "workerSessionId": session}
    (close_stdin, kill) = await calls_since(h, before)
    assert close_stdin == ("POST", "close") and kill[0] == "DELETE" and is_process(kill[1])
    assert notes(h, "duplexChannel.exit", ROUTE)[0]["exitCode"] is None
    assert await h.emulator.admin.live_process_count() == 0


async def test_a_child_that_floods_from_its_first_instant_loses_nothing(
    harness: Harness,
) -> None:
    """Why the gate stays: 3 MB printed at once, with the connect held back 1.5 s, would
    overrun the ~1 MiB journal before the attach (the connect then answers 410 and the open
    fails); behind the gate every byte arrives, in order, before what follows."""
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", delay_ms=1500)
    script = "head -c 3000000 /dev/zero | tr '\\0' 'x'; printf '#'; exec cat"
    session = await open_channel(h, lease, ["bash", "-c", script])
    await write(h, ROUTE, session, b"after")
    expected = b"x" * 3_000_000 + b"#after"
    await until(lambda: len(channel_bytes(h, ROUTE)) >= len(expected), timeout=60)
    got = channel_bytes(h, ROUTE)
    assert hashlib.sha256(got).digest() == hashlib.sha256(expected).digest()
    await h.methods.channel_close({"hostRouteId": ROUTE})


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
