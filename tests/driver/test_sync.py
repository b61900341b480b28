"""Native file sync against the emulator: exact bytes, modes, links, confinement, faults."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider.createos.errors import CreateOSError
from provider.driver.transfer.sync_inline import INLINE_OUT_BYTES
from provider.errors import ProviderError, RequestRefused, TransferError
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import WS, host_temp_leftovers, mapping, op, sh, sync_in, sync_out

pytestmark = pytest.mark.anyio


async def test_binary_file_arrives_exact_with_its_mode(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    source = tmp_path / "bin"
    source.write_bytes(bytes([0x00, 0xFF, 0x80, 0x0A, 0x0D]))
    source.chmod(0o600)
    result = await sync_in(h, lease, op(mapping(source, f"{WS}/sub/bin")))
    assert result == {
        "operations": [{"operationId": "op-1", "filesTransferred": 1, "bytesTransferred": 5}]
    }
    check = await sh(h, lease, f"od -An -tx1 {WS}/sub/bin | tr -s ' '; stat -c %a {WS}/sub/bin")
    assert check["stdout"] == " 00 ff 80 0a 0d\n600\n"
    leftovers = await sh(h, lease, "ls /tmp | grep paperclip-createos || true")
    assert leftovers["stdout"] == ""


async def test_binary_round_trip_is_byte_exact(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    every_byte = bytes(range(256)) * 4
    big = os.urandom(5 * 1024 * 1024)
    (tmp_path / "all").write_bytes(every_byte)
    (tmp_path / "big").write_bytes(big)
    await sync_in(
        h,
        lease,
        op(
            mapping(tmp_path / "all", f"{WS}/all"),
            mapping(tmp_path / "big", f"{WS}/big", mode=0o640),
        ),
    )
    out = tmp_path / "out"
    result = await sync_out(
        h,
        lease,
        op(mapping(f"{WS}/all", out / "all"), mapping(f"{WS}/big", out / "big", mode=0o644)),
    )
    assert result["operations"][0]["bytesTransferred"] == len(every_byte) + len(big)
    assert (out / "all").read_bytes() == every_byte
    assert (out / "big").read_bytes() == big
    assert stat.S_IMODE((out / "all").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "big").stat().st_mode) == 0o644
    assert host_temp_leftovers(out) == []
    requests = await h.emulator.admin.requests()
    assert not any(r["path"].endswith("/input") for r in requests)


async def test_broken_download_leaves_the_old_file_untouched(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    # Over the inline bound, so it is downloaded with GET (smaller ones travel inline).
    await sh(h, lease, f"head -c {INLINE_OUT_BYTES + 1} /dev/urandom > {WS}/data")
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    await h.emulator.admin.add_fault("GET", r"/files$", cut_after_bytes=2)
    with pytest.raises(ProviderError):
        await sync_out(h, lease, op(mapping(f"{WS}/data", target)))
    assert target.read_bytes() == b"precious"
    assert host_temp_leftovers(tmp_path) == []


async def test_directory_round_trip_with_exclusions_and_internal_link(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    src = tmp_path / "src"
    (src / "node_modules" / "dep").mkdir(parents=True)
    (src / "node_modules" / "dep" / "index.js").write_text("x")
    (src / "keep").write_text("keep me")
    (src / "keep").chmod(0o600)
    (src / "link").symlink_to("keep")
    result = await sync_in(
        h, lease, op(mapping(src, f"{WS}/proj", "directory", exclude=["node_modules"]))
    )
    assert result["operations"][0]["filesTransferred"] == 1
    listing = await sh(
        h, lease, f"cd {WS}/proj && find . | sort && readlink link && stat -c %a keep ."
    )
    assert listing["stdout"] == ".\n./keep\n./link\nkeep\n600\n755\n"

    back = tmp_path / "back"
    result = await sync_out(h, lease, op(mapping(f"{WS}/proj", back, "directory")))
    assert result["operations"][0]["filesTransferred"] == 1
    assert sorted(p.name for p in back.iterdir()) == ["keep", "link"]
    assert (back / "keep").read_text() == "keep me"
    assert stat.S_IMODE((back / "keep").stat().st_mode) == 0o600
    assert os.readlink(back / "link") == "keep"


async def test_outbound_directory_target_that_is_a_symlink_is_refused(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, f"mkdir -p {WS}/d && echo hi > {WS}/d/f")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    with pytest.raises(ProviderError):
        await sync_out(h, lease, op(mapping(f"{WS}/d", tmp_path / "alias", "directory")))
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "directory"])
async def test_an_outbound_target_below_a_regular_file_fails_with_a_named_host_error(
    harness: Harness, tmp_path: Path, kind: str
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, f"mkdir -p {WS}/d && echo hi > {WS}/d/f && echo one > {WS}/one")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    source = f"{WS}/d" if kind == "directory" else f"{WS}/one"
    target = blocker / "sub" / "t"
    with pytest.raises(TransferError) as caught:
        await sync_out(h, lease, op(mapping(source, target, kind)))
    assert str(caught.value) == (
        f"Writing {target} failed on the host: Not a directory ({blocker / 'sub'})."
    )
    assert blocker.read_text() == "x"
    assert host_temp_leftovers(tmp_path) == []
    listed = await sh(h, lease, "ls -A /tmp | grep -c paperclip-createos || true")
    assert listed["stdout"].strip() == "0"  # the packed scratch was removed


async def test_post_upload_commands_run_verbatim_in_order_and_fail_fast(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    (tmp_path / "f").write_text("payload")
    post = [
        {"command": "echo first >> order.log", "cwd": WS},
        {"command": 'echo "second $(cat f)" >> order.log', "cwd": WS},
        {"command": "exit 3"},
        {"command": "echo never >> order.log"},
    ]
    with pytest.raises(ProviderError, match="exit 3"):
        await sync_in(
            h,
            lease,
            op(mapping(tmp_path / "f", f"{WS}/f"), post=post),
            op(mapping(tmp_path / "f", f"{WS}/g"), op_id="op-2"),
        )
    log = await sh(h, lease, f"cat {WS}/order.log; ls {WS}")
    assert log["stdout"] == "first\nsecond payload\nf\norder.log\n"  # op-2 never ran


@pytest.mark.parametrize(
    "target",
    ["/etc/passwd", f"{WS}/../secret", "relative", f"{WS}-other/file", f"{WS}/a/../../etc"],
)
async def test_unconfined_sandbox_paths_are_refused_without_http(
    harness: Harness, tmp_path: Path, target: str
) -> None:
    h = harness
    lease = await h.acquire()
    (tmp_path / "f").write_text("x")
    before = await h.request_count()
    with pytest.raises(RequestRefused):
        await sync_in(h, lease, op(mapping(tmp_path / "f", target)))
    with pytest.raises(RequestRefused):
        await sync_out(h, lease, op(mapping(target, tmp_path / "out")))
    assert await h.request_count() == before


async def test_outbound_post_upload_commands_are_refused(harness: Harness, tmp_path: Path) -> None:
    lease = await harness.acquire()
    before = await harness.request_count()
    with pytest.raises(RequestRefused):
        await sync_out(
            harness, lease, op(mapping(f"{WS}/x", tmp_path / "x"), post=[{"command": "true"}])
        )
    assert await harness.request_count() == before


async def test_follow_symlinks_dereferences_links_inside_the_source(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    src = tmp_path / "src"
    src.mkdir()
    (src / "real.txt").write_text("inside")
    (src / "alias.txt").symlink_to("real.txt")
    await sync_in(h, lease, op(mapping(src, f"{WS}/p", "directory", followSymlinks=True)))
    check = await sh(h, lease, f"test -L {WS}/p/alias.txt && echo link; cat {WS}/p/alias.txt")
    assert check["stdout"] == "inside"


async def test_follow_symlinks_escape_fails_the_whole_batch(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    (tmp_path / "secret").write_text("host secret")
    (tmp_path / "safe").write_text("safe")
    src = tmp_path / "src"
    src.mkdir()
    (src / "escape").symlink_to(tmp_path / "secret")
    before = await h.request_count()
    with pytest.raises(RequestRefused, match=r"(?i)link"):
        await sync_in(
            h,
            lease,
            op(mapping(tmp_path / "safe", f"{WS}/safe")),
            op(mapping(src, f"{WS}/p", "directory", followSymlinks=True), op_id="op-2"),
        )
    assert await h.request_count() == before  # the earlier safe mapping was not uploaded


async def test_links_are_archived_without_opening_their_targets(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block forever
    src = tmp_path / "src"
    src.mkdir()
    (src / "to-fifo").symlink_to(fifo)
    with anyio.fail_after(30):
        await sync_in(h, lease, op(mapping(src, f"{WS}/p", "directory")))
    check = await sh(h, lease, f"readlink {WS}/p/to-fifo")
    assert check["stdout"] == f"{fifo}\n"


async def test_failed_large_upload_raises_its_own_error(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(65 * 1024 * 1024)  # over the progress threshold: reported while it uploads
    await h.emulator.admin.add_fault("PUT", r"/files$", status=400, times=5)
    with pytest.raises(CreateOSError):  # the client's own error, never an ExceptionGroup
        await sync_in(h, lease, op(mapping(big, f"{WS}/big")))


async def _sync_requests(h: Harness, lease: dict[str, Any], *ops: dict[str, Any]) -> Any:
    seen = max([0, *(r["seq"] for r in await h.emulator.admin.requests())])
    result = await sync_in(h, lease, *ops)
    made = [(r["method"], r["path"]) for r in await h.emulator.admin.requests(since=seen)]
    return result, made


async def test_a_small_directory_sync_with_its_extract_command_costs_one_request(
    harness: Harness, tmp_path: Path
) -> None:
    """The heartbeat's shape: one archive upload, then the host's extract command: the archive
    travels in the command's stdin, so the whole operation is one streaming exec."""
    h = harness
    lease = await h.acquire()
    source = tmp_path / "assets"
    source.mkdir()
    (source / "a.txt").write_text("alpha")
    archive = tmp_path / "assets.tar"
    import tarfile

    with tarfile.open(archive, "w") as tar:
        tar.add(source, arcname=".")
    remote_tar = f"{WS}/.paperclip-runtime/assets-upload.tar"
    extract = (
        f"mkdir -p {WS}/.paperclip-runtime/assets && tar -xf {remote_tar} "
        f"-C {WS}/.paperclip-runtime/assets && rm -f {remote_tar}"
    )
    result, made = await _sync_requests(
        h, lease, op(mapping(archive, remote_tar), post=[{"command": extract, "cwd": WS}])
    )
    assert result["operations"][0]["filesTransferred"] == 1
    assert [m for m, _ in made] == ["POST"] and made[0][1].endswith("/exec"), made
    check = await sh(h, lease, f"cat {WS}/.paperclip-runtime/assets/a.txt; ls -a /tmp")
    assert check["stdout"].startswith("alpha")
    assert "paperclip-createos-transfer-" not in check["stdout"]  # the trap removed the scratch

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "x").write_text("x")
    result, made = await _sync_requests(h, lease, op(mapping(tree, f"{WS}/tree", "directory")))
    assert [m for m, _ in made] == ["POST"]
    leftovers = await sh(h, lease, f"cat {WS}/tree/x; ls -a /tmp")
    assert leftovers["stdout"].startswith("x") and "transfer-" not in leftovers["stdout"]


async def test_a_failing_step_is_named_and_its_stderr_reported(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    (tmp_path / "f").write_text("payload")
    with pytest.raises(ProviderError, match=r"A post-upload command failed .*exit 4.*: boom$"):
        await sync_in(
            h,
            lease,
            op(
                mapping(tmp_path / "f", f"{WS}/f"),
                post=[{"command": "echo noise >&2; true"}, {"command": "echo boom >&2; exit 4"}],
            ),
        )
    await sh(h, lease, f"ln -s /etc {WS}/out")  # lexically inside, really outside
    with pytest.raises(ProviderError, match=r"post-upload cwd check failed .*outside"):
        await sync_in(
            h,
            lease,
            op(mapping(tmp_path / "f", f"{WS}/g"), post=[{"command": "true", "cwd": f"{WS}/out"}]),
        )
    with pytest.raises(ProviderError, match="A post-upload command timed out"):
        await sync_in(
            h,
            lease,
            op(
                mapping(tmp_path / "f", f"{WS}/h"),
                post=[{"command": "sleep 30", "timeoutMs": 1000}],
            ),
        )
    scratch = await sh(h, lease, "ls -a /tmp")
    assert "paperclip-createos-transfer-" not in scratch["stdout"]
