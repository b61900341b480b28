"""Large trees and files (issue 14 item 5): sync in and out as byte-range parts.

The emulator's per-file limit is lowered (``max_file_bytes``, 413 above it) and the part size
injected small (``provider.driver.transfer.sync.PART_BYTES``, which a SyncSession reads when it is
made), so a tree of about 20 MiB travels as several parts. Checked: byte-identical results both
ways, one ``PUT`` or ``GET`` per part, the same requests as before under the part size, and no
scratch left in the sandbox or on the host when a part fails. The acceptance test moves a 2 GiB
tree through a real worker process against a 500 MiB per-file limit with the default part size.
The part texts themselves run in real bash in tests/driver/test_sync_parts.py.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from devtools.call_params import environment_call, lease_ref, with_lease
from devtools.stdio_host import StdioHost
from provider.createos.upload import UploadBody
from provider.driver.transfer import sync
from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime
from provider.errors import ProviderError
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import (
    SCRATCH,
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
LIMIT = 4 * MIB
PART = 3 * MIB


@pytest.fixture
async def split_harness(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Harness:
    """The harness with a 4 MiB per-file limit, 3 MiB parts, and its own host temp folder."""
    await harness.emulator.admin.settings(max_file_bytes=LIMIT)
    monkeypatch.setattr(sync, "PART_BYTES", PART)
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    return harness


def make_tree(root: Path) -> None:
    """About 22 MiB: 150 small files, four of 2-3 MiB, one of 9 MiB, a link, varied modes."""
    rng = random.Random(14)
    (root / "bin").mkdir(parents=True)
    (root / "deep" / "er" / "est").mkdir(parents=True)
    for index in range(150):
        folder = root / ("deep/er/est" if index % 3 == 0 else "deep" if index % 3 else "")
        (folder / f"small-{index:03d}.txt").write_bytes(rng.randbytes(rng.randrange(0, 40_000)))
    for index in range(4):
        (root / f"mid-{index}.bin").write_bytes(rng.randbytes(rng.randrange(2 * MIB, 3 * MIB)))
    (root / "bin" / "big.bin").write_bytes(rng.randbytes(9 * MIB))
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "secret").write_bytes(rng.randbytes(1000))
    (root / "secret").chmod(0o600)
    (root / "mid-0.bin").chmod(0o640)
    (root / "link").symlink_to("bin/big.bin")
    (root / "empty").write_bytes(b"")


def host_manifest(root: Path, *, modes: bool = True) -> list[str]:
    """``f <path> <mode> <sha256>``, ``l <path> <target>``, ``d <path>``, sorted."""
    lines = []
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                lines.append(f"l {rel} {os.readlink(path)}")
            elif stat.S_ISDIR(st.st_mode):
                lines.append(f"d {rel}")
            else:
                mode = f"{stat.S_IMODE(st.st_mode):o} " if modes else ""
                lines.append(f"f {rel} {mode}{sha256_file(path)}")
    return sorted(lines)


SANDBOX_MANIFEST = (
    "cd {root} && find . -mindepth 1 -printf '%y %P %m %l\\n' | while read -r y p m l; do "
    'case $y in f) echo "f $p $m $(sha256sum < "$p" | cut -d" " -f1)";; '
    'l) echo "l $p $l";; d) echo "d $p";; esac; done | LC_ALL=C sort'
)


async def sandbox_manifest(h: Harness, lease: dict[str, Any], root: str) -> list[str]:
    result = await sh(h, lease, SANDBOX_MANIFEST.format(root=root))
    assert result["exitCode"] == 0, result["stderr"]
    return sorted(result["stdout"].splitlines())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(4 * MIB):
            digest.update(block)
    return digest.hexdigest()


async def requests_of(h: Harness, call: Any) -> tuple[Any, list[tuple[str, str, str]]]:
    """Run ``call`` (an awaitable); answers its result and (method, path, file path) of every
    API request it made (the file path only for /files)."""
    seen = max([0, *(r["seq"] for r in await h.emulator.admin.requests())])
    result = await call
    made = [
        (r["method"], r["path"], parse_qs(r["query"]).get("path", [""])[0])
        for r in await h.emulator.admin.requests(since=seen)
    ]
    return result, made


def file_requests(made: list[tuple[str, str, str]], method: str) -> list[str]:
    return [path for m, url, path in made if m == method and url.endswith("/files")]


def parts(count: int) -> list[str]:
    return [f".part-{index:04d}" for index in range(count)]


async def test_a_tree_over_the_file_limit_syncs_in_and_out_as_parts(
    split_harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = split_harness
    lease = await h.acquire()
    src = tmp_path / "src"
    make_tree(src)
    expected = host_manifest(src)

    # Without splitting, the same archive is refused by the files API (the limit is real).
    monkeypatch.setattr(sync, "PART_BYTES", 64 * MIB)
    with pytest.raises(ProviderError):
        await sync_in(h, lease, op(mapping(src, f"{WS}/refused", "directory")))
    statuses = [r["status"] for r in await h.emulator.admin.requests() if r["method"] == "PUT"]
    assert statuses and set(statuses) == {413}
    monkeypatch.setattr(sync, "PART_BYTES", PART)
    await no_scratch(h, lease)

    result, made = await requests_of(
        h, sync_in(h, lease, op(mapping(src, f"{WS}/proj", "directory")))
    )
    sent = result["operations"][0]["bytesTransferred"]
    assert sent > 20 * MIB and result["operations"][0]["filesTransferred"] == 158
    count = -(-sent // PART)
    puts = file_requests(made, "PUT")
    assert len(puts) == count >= 7
    assert [p[-10:] for p in puts] == parts(count)
    assert [m for m, _, _ in made] == ["PUT"] * count + ["POST"]
    assert await sandbox_manifest(h, lease, f"{WS}/proj") == expected
    await no_scratch(h, lease)
    assert host_temp_leftovers(Path(tempfile.gettempdir())) == []

    back = tmp_path / "back"
    result, made = await requests_of(
        h, sync_out(h, lease, op(mapping(f"{WS}/proj", back, "directory")))
    )
    received = result["operations"][0]["bytesTransferred"]
    assert result["operations"][0]["filesTransferred"] == 158
    count = -(-received // PART)
    gets = file_requests(made, "GET")
    assert len(gets) == count and [p[-10:] for p in gets] == parts(count)
    assert [m for m, _, _ in made] == ["POST"] + ["GET"] * count + ["POST"]
    assert host_manifest(back) == expected
    assert host_temp_leftovers(tmp_path) == []
    await no_scratch(h, lease)


async def test_a_file_over_the_file_limit_syncs_in_and_out_as_parts(
    split_harness: Harness, tmp_path: Path
) -> None:
    h = split_harness
    lease = await h.acquire()
    source = tmp_path / "blob"
    blob = os.urandom(10 * MIB)
    source.write_bytes(blob)
    source.chmod(0o640)
    result, made = await requests_of(h, sync_in(h, lease, op(mapping(source, f"{WS}/a/blob"))))
    assert result["operations"][0] == {
        "operationId": "op-1",
        "filesTransferred": 1,
        "bytesTransferred": len(blob),
    }
    assert [p[-10:] for p in file_requests(made, "PUT")] == parts(4)
    check = await sh(h, lease, f"stat -c '%a %s' {WS}/a/blob; sha256sum < {WS}/a/blob")
    assert check["stdout"] == f"640 {len(blob)}\n{hashlib.sha256(blob).hexdigest()}  -\n"
    await no_scratch(h, lease)

    out = tmp_path / "out" / "blob"
    result, made = await requests_of(
        h, sync_out(h, lease, op(mapping(f"{WS}/a/blob", out, mode=0o604)))
    )
    assert result["operations"][0]["bytesTransferred"] == len(blob)
    assert [p[-10:] for p in file_requests(made, "GET")] == parts(4)
    assert out.read_bytes() == blob
    assert stat.S_IMODE(out.stat().st_mode) == 0o604
    assert host_temp_leftovers(out.parent) == []
    await no_scratch(h, lease)


async def test_under_the_part_size_a_sync_costs_the_requests_it_always_did(
    split_harness: Harness, tmp_path: Path
) -> None:
    """Inbound: one PUT to the plain scratch path per mapping too large to travel inline, then
    the operation's command (one exec); outbound: the pack command, then for what is too large
    to come back inline one GET of part 0000 and the cleanup."""
    h = split_harness
    lease = await h.acquire()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "x").write_text("x")
    (tree / "link").symlink_to("x")
    exact = tmp_path / "exact"
    exact.write_bytes(os.urandom(PART))  # exactly one part: still the plain path
    empty = tmp_path / "empty"
    empty.write_bytes(b"")

    result, made = await requests_of(
        h,
        sync_in(
            h,
            lease,
            op(
                mapping(tree, f"{WS}/tree", "directory"),
                mapping(exact, f"{WS}/exact"),
                mapping(empty, f"{WS}/empty"),
            ),
        ),
    )
    assert [m for m, _, _ in made] == ["PUT", "POST"]  # the tree and the empty file: inline
    assert made[1][1].endswith("/exec")
    assert all(SCRATCH in p and ".part-" not in p for p in file_requests(made, "PUT"))
    assert result["operations"][0]["filesTransferred"] == 3
    await no_scratch(h, lease)

    for source, kind, target, fetched in [
        (f"{WS}/tree", "directory", tmp_path / "tree-back", False),
        (f"{WS}/exact", "file", tmp_path / "exact-back", True),
        (f"{WS}/empty", "file", tmp_path / "empty-back", False),
    ]:
        result, made = await requests_of(h, sync_out(h, lease, op(mapping(source, target, kind))))
        expected = ["POST", "GET", "POST"] if fetched else ["POST"]  # small ones come inline
        assert [m for m, _, _ in made] == expected, (source, made)
        assert made[0][1].endswith("/exec") and made[-1][1].endswith("/exec")
        assert [p[-10:] for p in file_requests(made, "GET")] == (parts(1) if fetched else [])
    assert (tmp_path / "exact-back").read_bytes() == exact.read_bytes()
    assert (tmp_path / "empty-back").read_bytes() == b""
    assert os.readlink(tmp_path / "tree-back" / "link") == "x"
    await no_scratch(h, lease)


async def test_one_byte_over_the_part_size_is_two_parts(
    split_harness: Harness, tmp_path: Path
) -> None:
    h = split_harness
    lease = await h.acquire()
    source = tmp_path / "over"
    blob = os.urandom(PART + 1)
    source.write_bytes(blob)
    _, made = await requests_of(h, sync_in(h, lease, op(mapping(source, f"{WS}/over"))))
    assert [p[-10:] for p in file_requests(made, "PUT")] == parts(2)
    back = tmp_path / "back"
    _, made = await requests_of(h, sync_out(h, lease, op(mapping(f"{WS}/over", back))))
    assert [p[-10:] for p in file_requests(made, "GET")] == parts(2)
    assert back.read_bytes() == blob


async def test_a_failing_part_upload_fails_the_sync_and_leaves_no_scratch(
    split_harness: Harness, tmp_path: Path
) -> None:
    h = split_harness
    lease = await h.acquire()
    src = tmp_path / "src"
    make_tree(src)
    await h.emulator.admin.add_fault("PUT", r"/files$", delay_ms=1)  # the 1st PUT passes
    await h.emulator.admin.add_fault("PUT", r"/files$", status=400)  # the 2nd fails
    with pytest.raises(ProviderError):
        await sync_in(
            h, lease, op(mapping(src, f"{WS}/proj", "directory"), post=[{"command": "touch ran"}])
        )
    made = [(r["method"], r["path"]) for r in await h.emulator.admin.requests()][-3:]
    assert [m for m, _ in made] == ["PUT", "PUT", "POST"] and made[2][1].endswith("/exec")
    await no_scratch(h, lease)
    check = await sh(h, lease, f"ls {WS}")
    assert "proj" not in check["stdout"] and "ran" not in check["stdout"]
    assert host_temp_leftovers(Path(tempfile.gettempdir())) == []


async def test_a_broken_part_download_leaves_the_target_untouched(
    split_harness: Harness, tmp_path: Path
) -> None:
    h = split_harness
    lease = await h.acquire()
    await sh(h, lease, f"mkdir -p {WS}/d && head -c {8 * MIB} /dev/urandom > {WS}/d/f")
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    await sh(h, lease, f"head -c {8 * MIB} /dev/urandom > {WS}/blob")
    await h.emulator.admin.add_fault("GET", r"/files$", delay_ms=1)  # part 0000 arrives
    await h.emulator.admin.add_fault("GET", r"/files$", cut_after_bytes=1000)  # 0001 breaks
    with pytest.raises(ProviderError):
        await sync_out(h, lease, op(mapping(f"{WS}/blob", target)))
    assert target.read_bytes() == b"precious"
    assert host_temp_leftovers(tmp_path) == []
    await no_scratch(h, lease)

    await h.emulator.admin.add_fault("GET", r"/files$", delay_ms=1)
    await h.emulator.admin.add_fault("GET", r"/files$", cut_after_bytes=1000)
    with pytest.raises(ProviderError):
        await sync_out(h, lease, op(mapping(f"{WS}/d", tmp_path / "tree", "directory")))
    assert not (tmp_path / "tree").exists()
    assert host_temp_leftovers(tmp_path) == []
    await no_scratch(h, lease)


async def test_a_sync_cancelled_between_parts_cleans_up(
    split_harness: Harness, tmp_path: Path
) -> None:
    """The call's deadline lands while part 0001 is being fetched: the cleanup still runs
    (shielded, bounded), removing every part; the host keeps no temp folder."""
    h = split_harness
    lease = await h.acquire()
    await sh(h, lease, f"head -c {8 * MIB} /dev/urandom > {WS}/blob")
    await h.emulator.admin.add_fault("GET", r"/files$", delay_ms=1)
    await h.emulator.admin.add_fault("GET", r"/files$", delay_ms=4000)
    target = tmp_path / "target"
    operations = [op(mapping(f"{WS}/blob", target))]
    params = {**h.with_lease(lease, timeoutMs=2000), "operations": operations}
    with pytest.raises(ProviderError, match="did not finish"):
        await h.methods.sync_out(params)
    gets = [r for r in await h.emulator.admin.requests() if r["path"].endswith("/files")]
    assert len(gets) == 1 and gets[0]["status"] == 200  # part 0000 arrived, then the deadline
    assert not target.exists()
    assert host_temp_leftovers(tmp_path) == []
    await no_scratch(h, lease)


async def test_a_failing_placement_of_parts_is_named_and_removes_them(
    split_harness: Harness, tmp_path: Path
) -> None:
    h = split_harness
    lease = await h.acquire()
    await sh(h, lease, f"echo file > {WS}/plain")
    source = tmp_path / "blob"
    source.write_bytes(os.urandom(7 * MIB))
    with pytest.raises(ProviderError, match=r"Placing /paperclip-workspace/plain/sub/blob failed"):
        await sync_in(h, lease, op(mapping(source, f"{WS}/plain/sub/blob")))
    await no_scratch(h, lease)
    src = tmp_path / "src"
    make_tree(src)
    with pytest.raises(ProviderError, match=r"Placing /paperclip-workspace/plain failed"):
        await sync_in(h, lease, op(mapping(src, f"{WS}/plain", "directory")))
    await no_scratch(h, lease)


async def test_an_upload_body_streams_only_its_byte_range(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: several 256 KiB chunks
    source = tmp_path / "data"
    source.write_bytes(data)
    for offset, size in [(0, len(data)), (1, 300_000), (700_001, len(data) - 700_001), (5, 0)]:
        seen: list[int] = []
        for body_source in (source, data):
            body = UploadBody(body_source, size, seen.append, offset=offset)
            got = b"".join([chunk async for chunk in body])
            assert got == data[offset : offset + size]
        assert not seen or seen[-1] == size
    with pytest.raises(ValueError):
        UploadBody(source, 1, None, offset=-1)


# --- the acceptance test: 2 GiB through a real worker process -------------------------------

GIB = 1024 * MIB
BIG_FILES = 4
BIG_FILE_BYTES = 512 * MIB


def make_sparse_tree(root: Path) -> list[str]:
    """4 sparse files of 512 MiB, each with three random MiB (start, middle, end) so a
    misplaced byte range shows, plus a few small files and a link; answers the manifest."""
    root.mkdir()
    rng = random.Random(5)
    for index in range(BIG_FILES):
        path = root / f"big-{index}.bin"
        with path.open("wb") as handle:
            handle.truncate(BIG_FILE_BYTES)
            for offset in (0, BIG_FILE_BYTES // 2 + 12345, BIG_FILE_BYTES - MIB):
                handle.seek(offset)
                handle.write(rng.randbytes(MIB))
    (root / "small").mkdir()
    for index in range(20):
        (root / "small" / f"f{index}").write_bytes(rng.randbytes(rng.randrange(1, 5000)))
    (root / "link").symlink_to("big-0.bin")
    return host_manifest(root)


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
@pytest.mark.timeout(300)  # 72 s measured on a loaded 2-core machine
async def test_a_2_gib_tree_syncs_in_and_out_through_the_worker_with_bounded_memory(
    tmp_path: Path,
) -> None:
    """Issue 14 item 5's acceptance: 2 GiB in and out against a 500 MiB per-file limit with the
    default 256 MiB parts, byte-identical, worker peak RSS (VmHWM) under 100 MiB."""
    try:
        probe_runtime()
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    free = os.statvfs(tmp_path)
    assert free.f_bavail * free.f_frsize > 16 * GIB, "the 2 GiB sync test needs 16 GiB free"
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    env = {
        "TMPDIR": str(system_tmp),  # the host archive of the upload
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PAPERCLIP_CREATEOS_RUNTIME_DIR": str(tmp_path / "runtime"),
        "PAPERCLIP_CREATEOS_PACE_MS": "0",
    }
    src, back = tmp_path / "src", tmp_path / "back"
    try:
        await big_round_trip(tmp_path, env, src, back)
    finally:  # pytest keeps recent tmp_paths: do not leave gigabytes behind
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(back, ignore_errors=True)


async def big_round_trip(tmp_path: Path, env: dict[str, str], src: Path, back: Path) -> None:
    system_tmp = Path(env["TMPDIR"])
    expected = make_sparse_tree(src)
    emulator = Emulator(api_keys=["test-key"], settings={"max_file_bytes": 500 * MIB})
    timings: dict[str, float] = {}
    async with emulator, StdioHost(env=env, stderr=tmp_path / "worker.log") as host:
        common = environment_call(emulator.base_url, "test-key", timeoutMs=1_800_000)
        lease = await host.call("environmentAcquireLease", {**common, "runId": "big"})
        files = [{"sourcePath": str(src), "targetPath": f"{WS}/big", "kind": "directory"}]
        started = time.perf_counter()
        synced = await host.call(
            "environmentSyncIn",
            {**with_lease(common, lease), "operations": [{"operationId": "in", "files": files}]},
        )
        timings["in"] = time.perf_counter() - started
        sent = synced["operations"][0]["bytesTransferred"]
        assert sent > 2 * GIB and synced["operations"][0]["filesTransferred"] == 24
        puts = [r for r in await emulator.admin.requests() if r["method"] == "PUT"]
        assert len(puts) == -(-sent // sync.PART_BYTES) == 9

        files = [{"sourcePath": f"{WS}/big", "targetPath": str(back), "kind": "directory"}]
        started = time.perf_counter()
        result = await host.call(
            "environmentSyncOut",
            {**with_lease(common, lease), "operations": [{"operationId": "out", "files": files}]},
        )
        timings["out"] = time.perf_counter() - started
        received = result["operations"][0]["bytesTransferred"]
        gets = [
            r
            for r in await emulator.admin.requests()
            if r["method"] == "GET" and r["path"].endswith("/files")
        ]
        assert len(gets) == -(-received // sync.PART_BYTES) == 9
        peak = vm_hwm_mib(host.pid)

        script = SANDBOX_MANIFEST.format(root=f"{WS}/big") + "; ls -a /tmp"
        listing = await host.call(
            "environmentExecute",
            {**with_lease(common, lease), "command": "bash", "args": ["-c", script]},
        )
        lines = listing["stdout"].splitlines()
        assert sorted(lines[: len(expected)]) == expected  # what landed in the sandbox
        assert SCRATCH not in listing["stdout"]
        await host.call("environmentReleaseLease", lease_ref(common, lease))
    started = time.perf_counter()
    assert host_manifest(back) == expected
    timings["compare"] = time.perf_counter() - started
    assert list(system_tmp.iterdir()) == [] and host_temp_leftovers(tmp_path) == []
    print(f"2 GiB split sync: {timings}, worker peak RSS {peak:.1f} MiB")
    assert peak < 100, f"worker peak RSS {peak:.1f} MiB"
