"""Login terminals against the emulator: a fake agent CLI in a real PTY (docs/protocol.md 6,
checklist 70-74)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from provider.driver.interactive.login import login_script
from provider.errors import RequestRefused
from tests.driver.conftest import Harness
from tests.driver.session_helpers import answered, notes, open_params, until

pytestmark = pytest.mark.anyio
ROUTE = "7d1f3c9e-0000-4000-8000-000000000001"

FAKE_CODEX = r"""#!/bin/bash
if [ -e /paperclip-workspace/raw-input ]; then
  stty raw -echo
  echo ready
  head -c "$(cat /paperclip-workspace/raw-input)" > /paperclip-workspace/received
  echo received
  exit 0
fi
echo "home=$HOME codex_home=$CODEX_HOME term=$TERM args=$*"
echo "size=$(stty size)"
printf '\xe2'; sleep 0.3; printf '\x82\xac\n'
exit 5
"""


def home() -> str:
    return f"/tmp/paperclip-adapter-login/{uuid.uuid4()}"


async def install_fake(h: Harness, lease: dict[str, Any], name: str = "codex") -> None:
    result = await h.methods.execute(
        {
            **h.with_lease(lease),
            "command": "bash",
            "args": [
                "-c",
                f"mkdir -p ~/.local/bin && cat > ~/.local/bin/{name} && "
                f"chmod +x ~/.local/bin/{name}",
            ],
            "stdin": FAKE_CODEX,
        }
    )
    assert result["exitCode"] == 0, result


async def open_login(
    h: Harness,
    lease: dict[str, Any],
    *,
    key: str = "codex",
    session_home: str | None = None,
    route: str = ROUTE,
) -> str:
    reply = await h.methods.login_open(
        open_params(h, lease, route, loginCommandKey=key, sessionHome=session_home or home())
    )
    result = await answered(reply)
    assert set(result) == {"workerSessionId"} and result["workerSessionId"].startswith("pty-")
    return str(result["workerSessionId"])


def output(h: Harness, route: str = ROUTE) -> str:
    return "".join(p["chunk"] for p in notes(h, "loginPty.output", route))


async def test_codex_login_runs_in_a_120x30_terminal_with_the_session_home(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    await install_fake(h, lease)
    session_home = home()
    before = len(await h.emulator.admin.process_history())
    count = await h.request_count()
    session = await open_login(h, lease, session_home=session_home)
    await until(lambda: bool(notes(h, "loginPty.exit", ROUTE)))
    # the open is the create and the connect: the home is made by the login's own script
    opened = [
        (r["method"], r["path"].rsplit("/", 1)[-1])
        for r in (await h.emulator.admin.requests())[count:]
    ]
    assert opened == [("POST", "processes"), ("GET", "connect")]
    text = output(h).replace("\r", "")
    assert (
        f"home={session_home} codex_home={session_home} term=xterm-256color "
        "args=login --device-auth" in text
    )
    assert "size=30 120" in text and "€" in text
    (exit_note,) = notes(h, "loginPty.exit", ROUTE)
    assert exit_note == {"hostRouteId": ROUTE, "workerSessionId": session, "exitCode": 5}
    for chunk in notes(h, "loginPty.output", ROUTE):
        assert chunk["chunk"] and chunk["workerSessionId"] == session
    ours = [m for m, p in h.notifications if p.get("hostRouteId") == ROUTE]
    assert ours[-1] == "loginPty.exit" and ours.count("loginPty.exit") == 1
    started = (await h.emulator.admin.process_history())[before:]
    assert len(started) == 1 and started[0]["cwd"] == "/paperclip-workspace"
    assert started[0]["args"][0] == "-lc"
    made = await h.methods.execute(
        {**h.with_lease(lease), "command": "stat", "args": ["-c", "%a", session_home]}
    )
    assert made["stdout"].strip() == "700"


async def test_a_missing_program_exits_127_after_its_output(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    reply = await h.methods.login_open(
        open_params(h, lease, ROUTE, loginCommandKey="grok", sessionHome=home())
    )
    await anyio.sleep(0.8)  # the shell has long exited: nothing may precede the answer
    assert not [p for _, p in h.notifications if p.get("hostRouteId") == ROUTE]
    session = (await answered(reply))["workerSessionId"]
    await until(lambda: bool(notes(h, "loginPty.exit", ROUTE)))
    assert notes(h, "loginPty.exit", ROUTE) == [
        {"hostRouteId": ROUTE, "workerSessionId": session, "exitCode": 127}
    ]


async def test_long_input_is_three_ordered_requests_and_inputs_never_interleave(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    await install_fake(h, lease)
    size = 600 * 1024
    await h.methods.execute(
        {
            **h.with_lease(lease),
            "command": "bash",
            "args": ["-c", f"echo {2 * size} > /paperclip-workspace/raw-input"],
        }
    )
    session = await open_login(h, lease)
    await until(lambda: "ready" in output(h))
    before = len(await h.emulator.admin.requests())
    async with anyio.create_task_group() as group:
        for letter in "ab":
            group.start_soon(
                h.methods.login_input, {"workerSessionId": session, "data": letter * size}
            )
    inputs = [
        r for r in (await h.emulator.admin.requests())[before:] if r["path"].endswith("/input")
    ]
    assert len(inputs) == 6
    await until(lambda: "received" in output(h), timeout=60)
    got = await h.methods.execute(
        {
            **h.with_lease(lease),
            "command": "bash",
            "args": ["-c", "tr -s ab < received; echo; wc -c < received"],
            "cwd": "/paperclip-workspace",
        }
    )
    first, count = got["stdout"].split()
    assert first in ("ab", "ba") and int(count) == 2 * size


async def test_stop_close_and_release_end_the_terminal(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    await install_fake(h, lease)
    await h.methods.execute(
        {
            **h.with_lease(lease),
            "command": "bash",
            "args": ["-c", "echo 1000000 > /paperclip-workspace/raw-input"],
        }
    )
    session = await open_login(h, lease)
    await until(lambda: "ready" in output(h))
    before = await h.request_count()
    await h.methods.login_stop({"workerSessionId": session})
    calls = [(r["method"], r["query"]) for r in (await h.emulator.admin.requests())[before:]]
    assert len(calls) == 1 and calls[0][0] == "DELETE" and "grace_ms=1000" in calls[0][1]
    assert notes(h, "loginPty.exit", ROUTE)[0]["exitCode"] is None
    with pytest.raises(RequestRefused):
        await h.methods.login_input({"workerSessionId": session, "data": "late"})
    for route in (ROUTE, ROUTE, "never-seen"):  # ended, repeated and unknown
        assert await h.methods.login_close({"hostRouteId": route}) == {"hostRouteId": route}
    # a live terminal closed, and one ended by the release of its lease
    second = "7d1f3c9e-0000-4000-8000-000000000002"
    await open_login(h, lease, route=second)
    await until(lambda: "ready" in output(h, second))
    assert await h.methods.login_close({"hostRouteId": second}) == {"hostRouteId": second}
    assert notes(h, "loginPty.exit", second)[0]["exitCode"] is None
    third = "7d1f3c9e-0000-4000-8000-000000000003"
    await open_login(h, lease, route=third)
    await until(lambda: "ready" in output(h, third))
    await h.methods.release(h.lease_ref(lease))
    assert notes(h, "loginPty.exit", third)[0]["exitCode"] is None
    assert await h.emulator.admin.live_process_count() == 0


async def test_an_unconfirmed_close_is_still_acknowledged_and_poisons_the_lease(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    await install_fake(h, lease)
    await h.methods.execute(
        {
            **h.with_lease(lease),
            "command": "bash",
            "args": ["-c", "echo 1000000 > /paperclip-workspace/raw-input"],
        }
    )
    await open_login(h, lease)
    await until(lambda: "ready" in output(h))
    await h.emulator.admin.add_fault("DELETE", r"/processes/[^/]+$", status=503, times=20)
    assert await h.methods.login_close({"hostRouteId": ROUTE}) == {"hostRouteId": ROUTE}
    with pytest.raises(RequestRefused, match=r"(?i)destroy"):
        await h.methods.execute({**h.with_lease(lease), "command": "true"})
    await h.emulator.admin.clear_faults()
    assert await h.methods.destroy(h.lease_ref(lease)) == {
        "providerLeaseId": lease["providerLeaseId"],
        "state": "destroyed",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loginCommandKey": "bash"}, "loginCommandKey"),
        ({"sessionHome": "/tmp/paperclip-adapter-login/../etc"}, "sessionHome"),
        (
            {"sessionHome": f"/tmp/paperclip-adapter-login/{str(uuid.uuid4()).upper()}"},
            "sessionHome",
        ),
        ({"sessionHome": f"/tmp/paperclip-adapter-login/{uuid.uuid4()}/x"}, "sessionHome"),
        ({"driverKey": "daytona"}, "createos"),
        ({"providerLeaseId": "sb-unknown"}, "no such lease"),
    ],
)
async def test_bad_opens_are_refused_before_any_request(
    harness: Harness, change: dict[str, Any], message: str
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    count = await h.request_count()
    params = {**open_params(h, lease, ROUTE, loginCommandKey="codex", sessionHome=home()), **change}
    with pytest.raises(RequestRefused, match=message):
        await h.methods.login_open(params)
    assert await h.request_count() == count


def test_the_login_script_quotes_the_home_and_keeps_the_closed_map() -> None:
    script = login_script("codex", "/tmp/paperclip-adapter-login/x'y")
    assert "HOME='/tmp/paperclip-adapter-login/x'\"'\"'y'" in script
    assert "CODEX_HOME=" in script and "'login' '--device-auth'" in script
    assert "GROK_HOME" not in login_script("claude", "/h") and "'setup-token'" in login_script(
        "claude", "/h"
    )
