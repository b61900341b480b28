"""The in-guest agent check: a sandbox pauses itself on request (``POST /self/pause`` to
``http://127.0.0.1:1029`` from inside), and the API then shows it ``paused``.

The worker's expiry guard (leases with ``requestedExpiresAt``) relies on that agent to delete a
sandbox at its deadline; pausing proves the same agent without ending the doctor's sandbox,
which is resumed afterwards for the checks that follow. The request is sent by bash over
``/dev/tcp`` (as the guard does: the image may have no curl) from a detached process, so the
exec answers at once; the agent's status line is written to a file and read back after the
resume.
"""

from __future__ import annotations

from typing import Final

import anyio

from provider.createos.errors import Conflict
from provider.doctor.checks_sandbox import POLL_S, wait_status
from provider.doctor.checks_streams import Target
from provider.doctor.report import Finding, ok, violated

ANSWER_PATH: Final = "/tmp/pc-doctor-agent-answer"
ASK_PAUSE: Final = (
    "( ( exec 3<>/dev/tcp/127.0.0.1/1029 && printf 'POST /self/pause?reason=paperclip-doctor "
    "HTTP/1.1\\r\\nHost: 127.0.0.1:1029\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n'"
    f" >&3 && IFS= read -r -t 5 line <&3 && printf '%s' \"$line\" > {ANSWER_PATH} ) || "
    f"printf 'no answer (connection refused or closed)' > {ANSWER_PATH} ) "
    "</dev/null >/dev/null 2>&1 &"
)


async def guest_agent_pause(target: Target) -> Finding:
    """Ask the agent to pause the sandbox; it must show ``paused``, then it is resumed."""
    key = "guest_agent_pause"
    client, sandbox_id = target.wire.client, target.sandbox_id
    await client.exec(sandbox_id, "/bin/bash", ["-c", ASK_PAUSE])
    while (view := await client.get_sandbox(sandbox_id)).status == "running":
        try:
            refused = await client.exec(sandbox_id, "/bin/cat", [ANSWER_PATH])
        except Conflict:
            continue  # it paused between the read and the exec: the next read says so
        answered = refused.exit_code == 0 and refused.stdout  # else: not written yet
        if answered and not refused.stdout.startswith("HTTP/1.1 202"):
            return violated(key, f"the agent answered {refused.stdout.strip()!r}")
        await anyio.sleep(POLL_S)  # until paused, or the caller's deadline
    view = await wait_status(target.wire, sandbox_id, ("paused",))
    if view.status != "paused":
        return violated(key, f"the sandbox went {view.status} after /self/pause")
    await client.resume_sandbox(sandbox_id)
    view = await wait_status(target.wire, sandbox_id, ("running",))
    answer = (await client.exec(sandbox_id, "/bin/cat", [ANSWER_PATH])).stdout.strip()
    observed = f"the agent answered {answer!r}; the API showed paused, then it resumed"
    if view.status != "running" or not answer.startswith("HTTP/1.1 202"):
        return violated(key, f"{observed} ({view.status} after the resume)")
    return ok(key, observed)
