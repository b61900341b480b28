"""Small syncs in one request each (issue 22, item 2): the bytes ride in the one command.

Request counts are read at the emulator: a small file or tree goes in as one streaming exec
(its bytes base64 in the exec's stdin) and comes out as one (in the pack command's output);
what is too large for that keeps the files API, raw. Checked each time: the bytes and modes,
no scratch left in the sandbox or on the host, no base64 in a log or a notification.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from provider.driver.transfer.sync_inline import INLINE_IN_CHARS, INLINE_OUT_BYTES, encode
from provider.errors import ProviderError
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import last_seq, requests_since, use_managed_processes
from tests.driver.sync_helpers import (
    WS,
    host_temp_leftovers,
    mapping,
    no_scratch,
    op,
    sh,
    sync_in,
    sync_out,
)

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
EXEC = ("POST", "/exec")
PUT = ("PUT", "/files")
GET = ("GET", "/files")
LARGEST_INLINE_IN = INLINE_IN_CHARS // 4 * 3  # bytes whose base64 is exactly the bound


async def counted(h: Harness, lease: dict[str, Any], call: Any) -> tuple[Any, list[Any]]:
    """Run ``call`` (a sync coroutine); its result and its requests as (method, path tail)."""
    seen = await last_seq(h)
    result = await call
    return result, await requests_since(h, lease, seen)


async def sandbox_digest(h: Harness, lease: dict[str, Any], path: str) -> str:
    result = await sh(h, lease, f"stat -c %a {path}; sha256sum < {path}")
    assert result["exitCode"] == 0, result["stderr"]
    return str(result["stdout"])


def digest(data: bytes, mode: int) -> str:
    return f"{mode:o}\n{hashlib.sha256(data).hexdigest()}  -\n"


def no_base64_logged(h: Harness, payload: bytes) -> None:
    text = encode(payload)[:64]
    assert all(text not in message for _, message in h.logs)
    assert all(text not in str(params) for _, params in h.notifications)


def make_tree(root: Path) -> dict[str, bytes]:
    (root / "sub").mkdir(parents=True)
    files = {"a.txt": b"alpha\n", "sub/bin": bytes(range(256)) * 3, "sub/empty": b""}
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "sub" / "bin").chmod(0o640)
    (root / "link").symlink_to("a.txt")
    return files


async def test_small_syncs_cost_one_request_each_way(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    tree = tmp_path / "tree"
    files = make_tree(tree)
    result, made = await counted(
        h, lease, sync_in(h, lease, op(mapping(tree, f"{WS}/t", "directory")))
    )
    assert made == [EXEC]
    assert result["operations"][0]["filesTransferred"] == 3
    check = await sh(h, lease, f"cd {WS}/t && cat a.txt && readlink link && stat -c %a sub/bin .")
    assert check["stdout"] == "alpha\na.txt\n640\n755\n"
    assert await sandbox_digest(h, lease, f"{WS}/t/sub/bin") == digest(files["sub/bin"], 0o640)

    blob = bytes([0x00, 0xFF, 0x80, 0x0A, 0x0D]) * 1000
    source = tmp_path / "blob"
    source.write_bytes(blob)
    source.chmod(0o604)
    result, made = await counted(h, lease, sync_in(h, lease, op(mapping(source, f"{WS}/f/blob"))))
    assert made == [EXEC]
    assert result["operations"][0]["bytesTransferred"] == len(blob)
    assert await sandbox_digest(h, lease, f"{WS}/f/blob") == digest(blob, 0o604)

    back = tmp_path / "back"
    result, made = await counted(
        h, lease, sync_out(h, lease, op(mapping(f"{WS}/t", back, "directory")))
    )
    assert made == [EXEC]
    assert result["operations"][0]["filesTransferred"] == 3
    assert {n: (back / n).read_bytes() for n in files} == files
    assert os.readlink(back / "link") == "a.txt"

    out = tmp_path / "out" / "blob"
    result, made = await counted(h, lease, sync_out(h, lease, op(mapping(f"{WS}/f/blob", out))))
    assert made == [EXEC]
    assert result["operations"][0]["bytesTransferred"] == len(blob)
    assert out.read_bytes() == blob and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert host_temp_leftovers(tmp_path, out.parent) == []
    await no_scratch(h, lease)
    no_base64_logged(h, blob)


async def test_a_5_mib_file_keeps_the_files_api(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    blob = os.urandom(5 * MIB)
    source = tmp_path / "big"
    source.write_bytes(blob)
    source.chmod(0o600)
    _, made = await counted(h, lease, sync_in(h, lease, op(mapping(source, f"{WS}/big"))))
    assert made == [PUT, EXEC]
    out = tmp_path / "big-back"
    _, made = await counted(h, lease, sync_out(h, lease, op(mapping(f"{WS}/big", out))))
    assert made == [EXEC, GET, EXEC]  # pack, download, scratch removal
    assert out.read_bytes() == blob
    await no_scratch(h, lease)


async def test_the_inline_bounds_are_exact(harness: Harness, tmp_path: Path) -> None:
    h = harness
    lease = await h.acquire()
    fits, over = tmp_path / "fits", tmp_path / "over"
    fits.write_bytes(os.urandom(LARGEST_INLINE_IN))
    over.write_bytes(os.urandom(LARGEST_INLINE_IN + 1))
    _, made = await counted(h, lease, sync_in(h, lease, op(mapping(fits, f"{WS}/fits"))))
    assert made == [EXEC]
    _, made = await counted(h, lease, sync_in(h, lease, op(mapping(over, f"{WS}/over"))))
    assert made == [PUT, EXEC]

    await sh(h, lease, f"head -c {INLINE_OUT_BYTES} /dev/urandom > {WS}/at")
    await sh(h, lease, f"head -c {INLINE_OUT_BYTES + 1} /dev/urandom > {WS}/past")
    for name, expected in (("at", [EXEC]), ("past", [EXEC, GET, EXEC])):
        back = tmp_path / f"{name}-back"
        result, made = await counted(
            h, lease, sync_out(h, lease, op(mapping(f"{WS}/{name}", back)))
        )
        assert made == expected, name
        assert await sandbox_digest(h, lease, f"{WS}/{name}") == digest(back.read_bytes(), 0o644)
        assert result["operations"][0]["bytesTransferred"] == back.stat().st_size
    await no_scratch(h, lease)


async def test_mappings_share_the_stdin_in_order_and_the_rest_is_uploaded(
    harness: Harness, tmp_path: Path
) -> None:
    """Three small files and one that no longer fits what is left: the small ones are each
    decoded from their own run of the stdin, the other is PUT; the post-upload command sees
    an empty stdin and runs after everything landed."""
    h = harness
    lease = await h.acquire()
    sources = []
    for index, size in enumerate((0, 1, LARGEST_INLINE_IN - 6, 5)):
        path = tmp_path / f"m{index}"
        path.write_bytes(os.urandom(size))
        sources.append(path)
    post = {"command": f"wc -c < /dev/stdin > {WS}/seen; ls {WS}/m > {WS}/listing"}
    files = [mapping(path, f"{WS}/m/{path.name}") for path in sources]
    result, made = await counted(h, lease, sync_in(h, lease, op(*files, post=[post])))
    assert made == [PUT, EXEC]  # m3 (5 bytes) no longer fits after m2: uploaded
    assert result["operations"][0]["filesTransferred"] == 4
    for path in sources:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert await sandbox_digest(h, lease, f"{WS}/m/{path.name}") == digest(
            path.read_bytes(), mode
        )
    check = await sh(h, lease, f"cat {WS}/seen {WS}/listing")
    assert check["stdout"] == "0\nm0\nm1\nm2\nm3\n"
    await no_scratch(h, lease)


async def test_a_failing_placement_is_named_and_leaves_no_scratch(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, f"echo file > {WS}/plain")
    source = tmp_path / "f"
    source.write_bytes(b"payload")
    with pytest.raises(ProviderError, match=rf"Placing {WS}/plain/x failed in the sandbox"):
        await sync_in(h, lease, op(mapping(source, f"{WS}/plain/x")))
    await no_scratch(h, lease)
    check = await sh(h, lease, f"cat {WS}/plain")
    assert check["stdout"] == "file\n"

    target = tmp_path / "target"
    target.write_bytes(b"precious")
    with pytest.raises(ProviderError, match="not a regular file"):
        await sync_out(h, lease, op(mapping(f"{WS}", target)))
    assert target.read_bytes() == b"precious" and host_temp_leftovers(tmp_path) == []
    await no_scratch(h, lease)


async def test_the_managed_process_fallback_takes_stdin_inline_but_downloads(
    harness: Harness, tmp_path: Path
) -> None:
    """On an older CreateOS (no exec stream) a sync in still sends its bytes as the command's
    stdin, which that path stages exactly; a sync out fetches with GET, keeping the bytes out of
    a managed process's 1 MiB output journal."""
    h = harness
    lease = await h.acquire()
    seen = await use_managed_processes(h, lease)
    tree = tmp_path / "tree"
    files = make_tree(tree)
    await sync_in(h, lease, op(mapping(tree, f"{WS}/t", "directory")))
    made = await requests_since(h, lease, seen)
    assert [m for m, _ in made] == ["POST", "GET", "POST"]  # create, connect, the stdin
    assert made[0][1] == "/processes" and made[2][1].endswith("/input"), made
    back = tmp_path / "back"
    _, made = await counted(h, lease, sync_out(h, lease, op(mapping(f"{WS}/t", back, "directory"))))
    assert made[-2:] == [GET, EXEC], made  # the download, the scratch removal
    assert made[0][1] == "/processes", made
    assert {n: (back / n).read_bytes() for n in files} == files
    await no_scratch(h, lease)
