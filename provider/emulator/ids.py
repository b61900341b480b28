"""Identifiers and timestamps: ULID-style ids (``sb_`` / ``proc_`` + 26 Crockford base32)."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ADJECTIVES = ("brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lucky")
ANIMALS = ("otter", "badger", "falcon", "heron", "lynx", "marmot", "panda", "raven", "seal", "wolf")


def ulid() -> str:
    """26 Crockford base32 characters: 48-bit millisecond time, then 80 random bits."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    return prefix + ulid()


def request_id() -> str:
    return "req_" + secrets.token_hex(8)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def key_hash(key: str) -> str:
    """Stable, non-reversible owner label for an API key (never the key itself)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def random_name() -> str:
    return f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}-{secrets.token_hex(2)}"
