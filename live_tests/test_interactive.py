"""Live smoke: a duplex channel and a login terminal on one sandbox through the worker.

Same opt-in as test_smoke.py (``CREATEOS_LIVE_TEST``). These run under the Python stdio host
(the ``live_routes`` fixture says why), which hands every ``duplexChannel.*`` and ``loginPty.*``
notification to the test. The sandbox is destroyed in ``finally``; a failed destroy fails the
test.
"""

from __future__ import annotations

import os
import uuid

import pytest

from devtools.peer_sessions import PeerCallError
from live_tests.session import LiveSession, RouteLog

pytestmark = pytest.mark.anyio

CHANNEL_ROUTE = "duplex-route-1"
# One host write at its cap (262,144 raw bytes), after a few bytes that text paths would mangle.
ODD_BYTES = b"\x00\xff\x80\n\r\x1b[0m\x00"
BIG_WRITE = os.urandom(262_144)
FAKE_CODEX = "#!/bin/sh\nstty size\nexit 0\n"


def routes_of(live: LiveSession) -> RouteLog:
    assert live.routes is not None, "use the live_routes fixture"
    return live.routes


async def test_duplex_channel_echoes_bytes_then_stops_and_closes(live_routes: LiveSession) -> None:
    live, routes = live_routes, routes_of(live_routes)
    async with live.reusable_lease() as lease:
        opened = await live.open_channel(lease, CHANNEL_ROUTE, ["cat"])
        assert set(opened) == {"hostRouteId", "workerSessionId"}, opened
        assert opened["hostRouteId"] == CHANNEL_ROUTE
        session = opened["workerSessionId"]
        assert isinstance(session, str) and session.startswith("duplex-")

        # Bytes in through /input, out through the output stream, exactly and in order.
        assert await live.write_channel(CHANNEL_ROUTE, session, ODD_BYTES) is None
        await routes.until(
            lambda: routes.channel_bytes(CHANNEL_ROUTE) == ODD_BYTES, "the odd bytes' echo"
        )
        assert await live.write_channel(CHANNEL_ROUTE, session, BIG_WRITE) is None
        expected = ODD_BYTES + BIG_WRITE
        await routes.until(
            lambda: len(routes.channel_bytes(CHANNEL_ROUTE)) >= len(expected), "the 256 KiB echo"
        )
        assert routes.channel_bytes(CHANNEL_ROUTE) == expected
        for chunk in routes.of(CHANNEL_ROUTE, "duplexChannel.data"):
            assert chunk["workerSessionId"] == session and chunk["chunk"]
        assert routes.of(CHANNEL_ROUTE, "duplexChannel.exit") == []

        # Stop: the child is killed and the one exit says null (stopped, not its own code).
        assert (
            await live.call(
                "duplexChannelStop", {"hostRouteId": CHANNEL_ROUTE, "workerSessionId": session}
            )
            is None
        )
        await routes.until(
            lambda: bool(routes.of(CHANNEL_ROUTE, "duplexChannel.exit")), "the channel's exit"
        )
        (exit_note,) = routes.of(CHANNEL_ROUTE, "duplexChannel.exit")
        assert exit_note["hostRouteId"] == CHANNEL_ROUTE
        assert exit_note["workerSessionId"] == session
        assert exit_note["exitCode"] is None
        assert not exit_note.get("transportClosed")
        assert routes.methods(CHANNEL_ROUTE)[-1] == "duplexChannel.exit"
        with pytest.raises(PeerCallError):
            await live.write_channel(CHANNEL_ROUTE, session, b"after the stop")

        # Close answers the bound pair, also after the stop, and sends nothing more.
        answer = await live.call("duplexChannelClose", {"hostRouteId": CHANNEL_ROUTE})
        assert answer == {"hostRouteId": CHANNEL_ROUTE, "workerSessionId": session}
        assert routes.methods(CHANNEL_ROUTE).count("duplexChannel.exit") == 1
        assert routes.channel_bytes(CHANNEL_ROUTE) == expected
    assert routes.unrouted == []


async def test_login_pty_is_a_120x30_terminal(live_routes: LiveSession) -> None:
    live, routes = live_routes, routes_of(live_routes)
    route = str(uuid.uuid4())
    session_home = f"/tmp/paperclip-adapter-login/{uuid.uuid4()}"
    async with live.reusable_lease() as lease:
        installed = await live.execute(
            lease,
            "mkdir -p ~/.local/bin && cat > ~/.local/bin/codex && chmod +x ~/.local/bin/codex",
            stdin=FAKE_CODEX,
        )
        assert installed.result["exitCode"] == 0, installed.result["stderr"]
        # The worker runs `command -v codex` in a login shell: it must find this fake, not a
        # real codex that would wait for a device login.
        found = await live.execute(lease, "bash -lc 'command -v codex'; echo ~/.local/bin/codex")
        lines = found.result["stdout"].split()
        assert len(lines) == 2 and lines[0] == lines[1], found.result

        opened = await live.open_login(lease, route, "codex", session_home)
        assert set(opened) == {"workerSessionId"}, opened
        session = opened["workerSessionId"]
        assert isinstance(session, str) and session.startswith("pty-")
        await routes.until(lambda: bool(routes.of(route, "loginPty.exit")), "the login's exit")
        assert "30 120" in routes.pty_text(route), routes.pty_text(route)
        assert routes.of(route, "loginPty.exit") == [
            {"hostRouteId": route, "workerSessionId": session, "exitCode": 0}
        ]
        for chunk in routes.of(route, "loginPty.output"):
            assert chunk["workerSessionId"] == session and chunk["chunk"]
        assert routes.methods(route)[-1] == "loginPty.exit"

        answer = await live.call("loginPtyClose", {"hostRouteId": route})
        assert answer == {"hostRouteId": route}
    assert routes.unrouted == []
