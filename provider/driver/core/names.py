"""The names this worker gives its sandboxes, and how it knows them again.

Every create carries ``pc-<scope tag>-<uuid4>``. The scope tag is derived from company,
environment and API origin only (never a secret), so the reaper recognises this environment's
sandboxes and nothing else, and a sandbox name never carries a key (see docs/protocol.md).
Pure functions, used by the runtime (a call's scope tag), acquire (the create name) and the
reuse rules (which kept sandboxes are ours).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Final

TAG_LENGTH: Final = 12
_UUID: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def scope_tag(company_id: str, environment_id: str, api_url: str) -> str:
    """First 12 lower-case hex digits of sha256(companyId \\n environmentId \\n apiUrl)."""
    text = f"{company_id}\n{environment_id}\n{api_url}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:TAG_LENGTH]


def name_token(tag: str) -> str:
    """A fresh, unique create name of this scope: ``pc-<tag>-<uuid4>``."""
    return f"pc-{tag}-{uuid.uuid4()}"


def is_ours(name: str | None, tag: str) -> bool:
    """True for a name :func:`name_token` made with ``tag`` (never ``pc-setup-...``)."""
    return name is not None and re.fullmatch(f"pc-{re.escape(tag)}-{_UUID}", name) is not None
