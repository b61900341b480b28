"""File calls of the CreateOS client: upload and download one file of a sandbox.

docs/protocol.md C7 (``/sandboxes/{id}/files?path=``). The upload body
(:class:`provider.createos.upload.UploadBody`) is rebuilt for each attempt, so a ``PUT`` is
replayable and retried like other idempotent calls. A download (``get_file``) is retried only
while opening, never once its body has started (no silent restart mid-file).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Final
from urllib.parse import quote

import anyio

from provider.createos.core import FILE_TIMEOUT, ClientCore
from provider.createos.models import require_id
from provider.createos.upload import UploadBody

_PATH_SAFE: Final = "!~*'()"  # encodeURIComponent leaves these (and A-Z a-z 0-9 - _ .) alone


def _file_url(sandbox_id: str, path: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError("a sandbox file path must be a non-empty string")
    return f"/sandboxes/{sandbox_id}/files?path={quote(path, safe=_PATH_SAFE)}"


class FileCalls(ClientCore):
    """``/sandboxes/{id}/files?path=`` (``PUT`` to upload, ``GET`` to download)."""

    async def put_file(
        self,
        sandbox_id: str,
        path: str,
        source: bytes | Path,
        *,
        offset: int = 0,
        length: int | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        """``PUT .../files?path=``: upload bytes, or stream a file from disk in chunks.

        ``offset`` and ``length`` select a byte range of the source (default: from ``offset``
        to its end), streamed like a whole file, never read into memory: large sync archives
        travel as several such parts. The body is replayable, so the upload is retried like
        other idempotent calls. ``on_progress(n)`` reports the bytes sent so far in the current
        attempt.
        """
        operation = "upload file"
        require_id(sandbox_id, "sandbox")
        url = _file_url(sandbox_id, path)
        if isinstance(source, Path):
            total = (await anyio.Path(source).stat()).st_size
        else:
            total = len(source)
        size = total - offset if length is None else length
        if offset < 0 or size < 0 or offset + size > total:
            raise ValueError("the upload range lies outside the source")
        await self._call(
            "PUT",
            url,
            operation=operation,
            upload=lambda: UploadBody(source, size, on_progress, offset=offset),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            limits=FILE_TIMEOUT,
        )

    def get_file(
        self, sandbox_id: str, path: str
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """``GET .../files?path=`` as raw body chunks; errors are raised on enter.

        A GET is idempotent (docs/protocol.md C1.8), so opening the download is retried like
        other GETs; once body bytes flow, a cut is raised to the caller (no silent restart).
        """
        require_id(sandbox_id, "sandbox")
        return self._stream(
            _file_url(sandbox_id, path),
            operation="download file",
            accept="application/octet-stream, application/json",
            limits=FILE_TIMEOUT,
            retry_open=True,
        )
