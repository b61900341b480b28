"""The request body of a file upload: bytes or a byte range of a file on disk, sent in chunks."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, Final

import anyio

from provider.createos.errors import CreateOSError

UPLOAD_CHUNK: Final = 256 * 1024


class UploadBody:
    """One attempt's request body for ``put_file``: chunks of bytes or of a file on disk.

    ``size`` bytes are sent starting at ``offset`` (a byte range of the source: a part of a
    large archive is one range of its host file). A file is opened when httpx starts iterating,
    positioned at ``offset`` and closed by :meth:`close` (or at the end), so no whole-file or
    whole-range read ever happens and a cancelled upload does not keep it open.
    """

    def __init__(
        self,
        source: bytes | Path,
        size: int,
        on_progress: Callable[[int], None] | None,
        *,
        offset: int = 0,
    ) -> None:
        if offset < 0 or size < 0:
            raise ValueError("an upload range needs a non-negative offset and size")
        self._source = source
        self._size = size
        self._offset = offset
        self._on_progress = on_progress
        self._handle: BinaryIO | None = None
        self._view = memoryview(b"" if isinstance(source, Path) else source)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        if isinstance(self._source, Path):
            self._handle = await anyio.to_thread.run_sync(self._open, self._source)
        try:
            while sent < self._size:
                want = min(UPLOAD_CHUNK, self._size - sent)
                if self._handle is not None:
                    chunk = await anyio.to_thread.run_sync(self._handle.read, want)
                else:
                    start = self._offset + sent
                    chunk = bytes(self._view[start : start + want])
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

    def _open(self, path: Path) -> BinaryIO:
        # O_NONBLOCK: a FIFO put in the file's place would block a plain open forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CreateOSError(f"CreateOS upload file failed: {path} is not a regular file.")
        handle = os.fdopen(fd, "rb")
        if self._offset:
            handle.seek(self._offset)
        return handle

    def close(self) -> None:
        """Close the file, if one is open (safe to call twice)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
