"""File calls against exact HTTP scripts: paths, streamed uploads and downloads
(provider/createos/files.py)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import UPLOAD_CHUNK, CreateOSClient
from provider.createos.errors import (
    CreateOSError,
    NotFound,
)
from tests.createos.scripts import SB, fail, ok

pytestmark = pytest.mark.anyio


async def test_file_path_is_encoded_like_encode_uri_component(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    path = "/paperclip-workspace/a b/ü€!~*'()&=?#%+;,.txt"
    seen: list[tuple[bytes, str]] = []

    def handler(request: Request) -> Response:
        seen.append((request.query_string, request.args["path"]))
        return ok({"bytes": 1, "path": path})

    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_handler(
        handler
    )

    await client.put_file(SB, path, b"x")

    expected = "path=" + quote(path, safe="!~*'()")
    assert seen == [(expected.encode(), path)]
    assert "%20" in expected and "!~*'()" in expected and "%26" in expected


# ---------------------------------------------------------------- files


async def test_put_file_streams_a_path_in_chunks_and_is_retried(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, delays: list[float]
) -> None:
    content = bytes(range(256)) * (4 * UPLOAD_CHUNK // 256) + b"tail!"
    source = tmp_path / "data"
    source.write_bytes(content)
    bodies: list[tuple[bytes, str | None, str | None]] = []

    def handler(request: Request) -> Response:
        bodies.append(
            (request.get_data(), request.headers.get("Content-Length"), request.content_type)
        )
        return fail(503) if len(bodies) == 1 else ok({"bytes": len(content)})

    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_handler(
        handler
    )
    progress: list[int] = []

    await client.put_file(SB, "/tmp/data", source, on_progress=progress.append)

    assert len(bodies) == 2
    for body, length, content_type in bodies:
        assert body == content
        assert length == str(len(content))
        assert content_type == "application/octet-stream"
    # One report per chunk of at most UPLOAD_CHUNK bytes, restarting with the retry.
    steps = [b - a for a, b in zip([0, *progress], progress, strict=False) if b > a]
    assert max(steps) <= UPLOAD_CHUNK
    assert progress.count(len(content)) == 2
    assert len(progress) == 2 * 5


async def test_put_file_uploads_empty_bytes(httpserver: HTTPServer, client: CreateOSClient) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/files", method="PUT", data=b""
    ).respond_with_response(ok({}))

    await client.put_file(SB, "/tmp/gate", b"")

    assert httpserver.log[0][0].headers.get("Content-Length") == "0"


async def test_get_file_streams_raw_bytes(httpserver: HTTPServer, client: CreateOSClient) -> None:
    blob = bytes(range(256)) * 4096
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/files", query_string={"path": "/tmp/blob"}
    ).respond_with_data(blob, content_type="application/octet-stream")

    received = bytearray()
    async with client.get_file(SB, "/tmp/blob") as body:
        async for chunk in body:
            received += chunk

    assert bytes(received) == blob


async def test_get_file_status_errors_are_raised_on_enter(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/files").respond_with_response(fail(404))
    entered = False

    with pytest.raises(NotFound, match="download file"):
        async with client.get_file(SB, "/tmp/missing"):
            entered = True

    assert not entered


async def test_put_file_fails_cleanly_when_the_source_shrinks_mid_upload(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, delays: list[float]
) -> None:
    source = tmp_path / "data"
    source.write_bytes(b"x" * (3 * UPLOAD_CHUNK))
    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_response(
        ok({})
    )

    def shrink(sent: int) -> None:
        with source.open("r+b") as handle:
            handle.truncate(sent)

    with pytest.raises(CreateOSError, match="shrank"):
        await client.put_file(SB, "/tmp/data", source, on_progress=shrink)

    assert delays == []
