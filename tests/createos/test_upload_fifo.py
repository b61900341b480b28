"""An upload never blocks on a FIFO put where the file was (issue 21, item 3): the body opens
its source non-blocking and refuses what is not a regular file, before any byte is sent."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from pytest_httpserver import HTTPServer

from provider.createos.client import CreateOSClient
from provider.createos.errors import CreateOSError
from provider.createos.upload import UploadBody

pytestmark = pytest.mark.anyio


async def test_a_fifo_source_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # no writer: a plain open would block for good
    body = UploadBody(fifo, 10, None)
    with anyio.fail_after(10), pytest.raises(CreateOSError, match="is not a regular file"):
        async for _ in body:
            pass


async def test_put_file_of_a_fifo_fails_at_once(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path
) -> None:
    httpserver.expect_request(
        "/v1/sandboxes/sb_01J8ZABCDEFGHJKMNPQRSTVWXY/files"
    ).respond_with_json({"status": "success", "data": None})
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with anyio.fail_after(10), pytest.raises(CreateOSError, match="is not a regular file"):
        await client.put_file("sb_01J8ZABCDEFGHJKMNPQRSTVWXY", "/tmp/x", fifo)
