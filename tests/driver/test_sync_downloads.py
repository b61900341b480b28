"""A 200 answer that is not the file never becomes the file (issue 21, item 5): a JSON or HTML
content type is refused, and every part must bring exactly the bytes the pack step counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.driver.transfer.sync_files import get_to_file
from provider.driver.transfer.sync_inline import INLINE_OUT_BYTES
from provider.errors import TransferError
from tests.driver.archive_helpers import snapshot
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import WS, host_temp_leftovers, mapping, op, sh, sync_out

pytestmark = pytest.mark.anyio

SB = "sb_01J8ZABCDEFGHJKMNPQRSTVWXY"
URL = f"/v1/sandboxes/{SB}/files"
PORTAL = b"<html><body>Please log in to the guest network</body></html>"


@pytest.fixture
async def client(httpserver: HTTPServer) -> AsyncIterator[CreateOSClient]:
    origin = httpserver.url_for("/").rstrip("/")
    pacer = RequestPacer(origin, interval=0)
    async with CreateOSClient(origin, "k", pacer=pacer, backoff_base=0.001) as api:
        yield api


async def fetch(client: CreateOSClient, tmp_path: Path, expected: int) -> int:
    return await get_to_file(
        client, SB, [("/tmp/s.part-0000", expected)], tmp_path / "data", 0o600,
        log=None, what="Downloading /w/f",
    )  # fmt: skip


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/json"])
async def test_a_page_or_an_envelope_answered_200_is_refused(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, content_type: str
) -> None:
    httpserver.expect_request(URL).respond_with_data(PORTAL, content_type=content_type)
    with pytest.raises(TransferError) as caught:
        await fetch(client, tmp_path, len(PORTAL))  # even with the right length
    media = content_type.split(";")[0]
    assert str(caught.value) == (
        f"Downloading /w/f failed: the answer was {media}, not the file's bytes (a gateway, "
        "proxy or error page?); nothing was installed."
    )


@pytest.mark.parametrize("expected", [len(PORTAL) - 1, len(PORTAL) + 1, 1 << 30])
async def test_a_body_of_another_size_than_packed_is_refused(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, expected: int
) -> None:
    httpserver.expect_request(URL).respond_with_data(PORTAL, content_type="")
    with pytest.raises(TransferError, match=rf"the sandbox packed {expected} bytes but the "):
        await fetch(client, tmp_path, expected)


async def test_the_exact_bytes_pass(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path
) -> None:
    httpserver.expect_request(URL).respond_with_data(
        b"abc", content_type="application/octet-stream"
    )
    assert await fetch(client, tmp_path, 3) == 3
    assert (tmp_path / "data").read_bytes() == b"abc"


async def test_a_200_envelope_from_the_api_leaves_both_targets_as_they_were(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    big = INLINE_OUT_BYTES + 1  # over the inline bound: downloaded with GET
    await sh(
        h, lease, f"mkdir -p {WS}/d && head -c {big} /dev/zero > {WS}/d/f && cp {WS}/d/f {WS}/f"
    )
    host = tmp_path / "host"
    target = host / "t"
    target.mkdir(parents=True)
    (target / "f").write_text("old")
    (host / "single").write_text("old")
    before = snapshot(host)
    envelope = {"status": "success", "data": {"message": "maintenance"}}
    for source, dest, kind in (
        (f"{WS}/f", host / "single", "file"),  # was installed as the file before the fix
        (f"{WS}/d", target, "directory"),
    ):
        await h.emulator.admin.add_fault("GET", r"/files$", status=200, body=envelope)
        with pytest.raises(TransferError, match="the answer was application/json"):
            await sync_out(h, lease, op(mapping(source, dest, kind)))
    assert snapshot(host) == before
    assert host_temp_leftovers(host, target) == []
