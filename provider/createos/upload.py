"""The request body of a file upload: bytes or a file on disk, sent in chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, Final

import anyio

from provider.createos.errors import CreateOSError

UPLOAD_CHUNK: Final = 256 * 1024


class UploadBody:
    """One attempt's request body for ``put_file``: chunks of bytes or of a file on disk.

    A file is opened when httpx starts iterating and closed by :meth:`close` (or at the end),
    so no whole-file read ever happens and a cancelled upload does not keep it open.
    """

    def __init__(
        self,
        source: bytes | Path,
        size: int,
        on_progress: Callable[[int], None] | None,
    ) -> None:
        self._source = source
        self._size = size
        self._on_progress = on_progress
        self._handle: BinaryIO | None = None
        self._view = memoryview(b"" if isinstance(source, Path) else source)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        if isinstance(self._source, Path):
            self._handle = await anyio.to_thread.run_sync(self._source.open, "rb")
        try:
            while sent < self._size:
                want = min(UPLOAD_CHUNK, self._size - sent)
                if self._handle is not None:
                    chunk = await anyio.to_thread.run_sync(self._handle.read, want)
                else:
                    chunk = bytes(self._view[sent : sent + want])
                if not chunk:
                    raise CreateOSError(
                        "CreateOS upload file failed: the local file shrank during the upload."
                    )
                sent += len(chunk)
                if self._on_progress is not None:
                    self._on_progress(sent)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        """Close the file, if one is open (safe to call twice)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
