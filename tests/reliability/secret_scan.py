"""Looking for an API key in bytes: raw, JSON-escaped, URL-encoded, hex and base64 forms.

Base64 is checked at all three alignments (a key inside a larger encoded blob shifts by the
bytes before it), in the standard and the URL-safe alphabet.
"""

from __future__ import annotations

import base64
from urllib.parse import quote, quote_plus


def encoded_forms(secret: str) -> dict[str, bytes]:
    raw = secret.encode()
    forms = {
        "raw": raw,
        "json-escaped": secret.replace("/", "\\/").encode(),
        "url-encoded": quote(secret, safe="").encode(),
        "url-encoded (plus)": quote_plus(secret).encode(),
        "url-encoded (lower-case)": quote(secret, safe="").lower().encode(),
        "hex": raw.hex().encode(),
    }
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw)
        skip = -(-offset * 4 // 3)  # characters that also depend on the bytes before the key
        core = encoded[skip:-4]  # the last group may mix in padding or the bytes after it
        forms[f"base64@{offset}"] = core
        forms[f"base64url@{offset}"] = core.replace(b"+", b"-").replace(b"/", b"_")
    return forms


def find_secret(secret: str, sources: dict[str, bytes]) -> list[str]:
    """``"<source>: <form>"`` for every encoded form of ``secret`` found in a source."""
    forms = encoded_forms(secret)
    return [
        f"{name}: {form}"
        for name, data in sources.items()
        for form, needle in forms.items()
        if needle and needle in data
    ]
