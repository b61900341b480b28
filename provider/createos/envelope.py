"""JSend envelopes and list pages of the CreateOS API (docs/protocol.md C1.4, C1.6).

Pure functions over a status code and body bytes; they raise
:class:`~provider.createos.errors.APIProtocolError` naming the operation and status, never
quoting the body.
"""

from __future__ import annotations

from typing import Any

import msgspec

from provider.createos.errors import APIProtocolError

_json = msgspec.json.Decoder()


def unwrap_success(status: int, body: bytes, operation: str) -> Any:
    """The ``data`` of a 2xx JSend success envelope (None for an empty 204/205).

    An empty body is legal only for 204 and 205; anything that is not JSON, not an object,
    not ``"status": "success"`` or lacks ``data`` is a protocol error.
    """
    if not body.strip():
        if status in (204, 205):
            return None
        raise APIProtocolError(f"CreateOS {operation} answered HTTP {status} with an empty body.")
    try:
        envelope = _json.decode(body)
    except msgspec.DecodeError as exc:
        raise APIProtocolError(
            f"CreateOS {operation} answered HTTP {status} with a body that is not JSON."
        ) from exc
    if (
        not isinstance(envelope, dict)
        or envelope.get("status") != "success"
        or "data" not in envelope
    ):
        raise APIProtocolError(
            f"CreateOS {operation} answered HTTP {status} without a JSend success envelope."
        )
    return envelope["data"]


def list_page(data: Any, operation: str) -> tuple[list[Any], int | None]:
    """A list page's items and total (None when the server sent no pagination: one page).

    Standard: ``{"data": [...], "pagination": {"total": n}}``; older servers send a bare
    array or a single named list such as ``{"sandboxes": [...]}``.
    """
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict):
        items = data.get("data")
        if isinstance(items, list):
            pagination = data.get("pagination")
            total = pagination.get("total") if isinstance(pagination, dict) else None
            if isinstance(total, bool) or not isinstance(total, int):
                total = None
            return items, total
        lists = [value for value in data.values() if isinstance(value, list)]
        if len(lists) == 1:
            return lists[0], None
    raise APIProtocolError(f"CreateOS {operation} answered with an unexpected list shape.")
