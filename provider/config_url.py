"""The ``apiUrl`` of an environment config: which URLs are accepted, and their normal form.

An origin (``https``, or ``http`` for loopback only), optionally with a gateway's path prefix
before ``/v1``, as both official SDKs allow; never credentials, a query or a fragment. Errors
name the problem and the accepted form, and never repeat the given URL.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit

from provider.errors import ConfigError

LOOPBACK_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_ACCEPTED_URL_FORM: Final = (
    "use https://<host>[:port][/<path prefix>][/v1] (http:// only for localhost, 127.0.0.1 or "
    "[::1]), with no user or password and no query or fragment; path segments hold letters, "
    "digits, '.', '_', '~' or '-', and /v1 may only end the path"
)
_HOST_NAME_RE: Final = re.compile(r"[a-z0-9_][a-z0-9._-]*")
_PATH_SEGMENT_RE: Final = re.compile(r"[A-Za-z0-9._~-]+")
MAX_PATH_PREFIX: Final = 200


def normalize_api_url(url: str) -> str:
    """Reduce an accepted API URL to its base: ``scheme://host[:port]`` plus an optional path
    prefix (a gateway's, e.g. ``/createos``), without a trailing ``/v1`` or slash. Requests go
    to ``<base>/v1/...``. The rate limit is per caller IP, so pacing keys on the origin alone
    (:func:`provider.createos.pacer.normalize_origin`); everything else keys on the base."""

    def refuse(reason: str) -> ConfigError:
        return ConfigError(
            f"apiUrl is not accepted ({reason}): {_ACCEPTED_URL_FORM}", field="apiUrl"
        )

    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise refuse("it contains whitespace or control characters")
    if not url.isascii():
        raise refuse("it contains non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise refuse("the host or port is malformed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise refuse("the scheme must be https")
    if "@" in parts.netloc:
        raise refuse("credentials are not allowed in the URL")
    if parts.query or parts.fragment:
        raise refuse("a query or fragment is not allowed")
    prefix = _path_prefix(parts.path, refuse)
    if parts.netloc.endswith(":") or port == 0:
        raise refuse("the port must be a number from 1 to 65535")
    host = (parts.hostname or "").lower()
    if not host:
        raise refuse("the host is missing")
    if parts.netloc.startswith("["):
        try:
            if "%" in host:  # zone ids name a local interface: never an API origin
                raise ValueError(host)
            ipaddress.IPv6Address(host)
        except ValueError:
            raise refuse("the IPv6 address is malformed") from None
        host_text = f"[{host}]"
    elif _HOST_NAME_RE.fullmatch(host):
        host_text = host
    else:
        raise refuse("the host name is malformed")
    if scheme == "http" and host not in LOOPBACK_HOSTS:
        raise refuse("http is only allowed for localhost, 127.0.0.1 or [::1]")
    default_port = 443 if scheme == "https" else 80
    port_text = "" if port is None or port == default_port else f":{port}"
    return f"{scheme}://{host_text}{port_text}{prefix}"


def _path_prefix(path: str, refuse: Callable[[str], ConfigError]) -> str:
    """The path before ``/v1`` (``""`` or ``/seg[/seg...]``); refuses anything else."""
    segments = path.split("/")[1:] if path.startswith("/") else ([path] if path else [])
    if segments and segments[-1] == "":
        segments.pop()  # one trailing slash
    if segments and segments[-1] == "v1":
        segments.pop()
    if len(path) > MAX_PATH_PREFIX:
        raise refuse(f"the path is longer than {MAX_PATH_PREFIX} characters")
    for segment in segments:
        if segment.lower() == "v1":
            raise refuse("/v1 may only end the path")
        if not segment:
            raise refuse("the path has an empty segment (//)")
        if segment in (".", ".."):
            raise refuse("the path has a '.' or '..' segment")
        if not _PATH_SEGMENT_RE.fullmatch(segment):
            raise refuse(
                "a path segment holds a character other than a letter, digit, '.', '_', '~' or '-'"
            )
    return "".join(f"/{segment}" for segment in segments)
