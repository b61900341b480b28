"""A sync out that fails on the host, through the real dispatcher and the emulator: the target
is left exactly as it was, the error names the step and the path, and the worker logs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from provider.rpc.dispatcher import Dispatcher
from tests.driver.archive_helpers import snapshot
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import WS, host_temp_leftovers, mapping, op, sh
from tests.rpc.harness import serving

pytestmark = pytest.mark.anyio


async def test_a_sync_out_failing_midway_leaves_the_target_as_it_was_and_is_logged(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(
        h,
        lease,
        f"mkdir -p {WS}/proj/a {WS}/proj/b/c && echo new > {WS}/proj/a/f "
        f"&& echo new > {WS}/proj/a/g && echo deep > {WS}/proj/b/c/x",
    )
    target = tmp_path / "target"
    (target / "a").mkdir(parents=True)
    (target / "a" / "f").write_text("old")  # replaced before the failure, then put back
    (target / "b").mkdir()
    (target / "b" / "c").write_text("a file where the sandbox has a directory")
    before = snapshot(target)
    params = {
        **h.with_lease(lease),
        "operations": [op(mapping(f"{WS}/proj", target, "directory"))],
    }
    async with serving(Dispatcher(h.methods.table())) as host:
        await host.initialize()
        reply = await host.request("environmentSyncOut", params)
    message = reply["error"]["message"]
    assert message == (
        f"Installing into {target} failed on the host: a file or symbolic link is where the "
        f"archive has a directory ({target / 'b' / 'c'}); the target was left as it was."
    )
    assert snapshot(target) == before
    assert host_temp_leftovers(tmp_path) == []
    logs = [n["params"] for n in host.notifications if n["method"] == "log"]
    assert logs == [{"level": "error", "message": f"environmentSyncOut: {message}"}]
    listed = await sh(h, lease, "ls -A /tmp | grep -c paperclip-createos || true")
    assert listed["stdout"].strip() == "0"  # the packed scratch was removed
