"""The egress rule grammar (docs/protocol.md 1.5), one copy for the worker and the emulator.

A rule is ``*``; a host name (``github.com``, ``*.example.com``); an IPv4 or IPv6 address or
CIDR (``203.0.113.7``, ``10.0.0.0/8``, ``2001:db8::/32``); any of the last two with ``:port``
(IPv6 then in brackets: ``[2001:db8::1]:22``). :func:`normalize_rule` returns the canonical text
(lower-case host, ``ipaddress`` canonical address) or raises :class:`RuleError`, whose reason
never repeats the entry (it may be a pasted secret). Standard library only, so that both the
worker's config (:mod:`provider.config`) and the emulator (which imports nothing else of the
worker) can share it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

MAX_RULE_CHARS: Final = 260
MAX_HOST_CHARS: Final = 253
ACCEPTED_FORMS: Final = (
    "use '*', a host name (github.com, *.example.com), an IPv4 or IPv6 address or CIDR "
    "(203.0.113.7, 10.0.0.0/8, 2001:db8::/32), optionally followed by :port (github.com:443, "
    "[2001:db8::1]:22)"
)
_LABEL: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_PORT: Final = re.compile(r"^[1-9][0-9]{0,4}\Z")
_BRACKETED: Final = re.compile(r"^\[([^\[\]]+)\](?::([^:]*))?\Z")


_Network = (
    ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network | ipaddress.IPv6Network
)


class RuleError(ValueError):
    """An entry that is not a rule; ``reason`` is safe to show (it never quotes the entry)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def normalize_rule(entry: object) -> str:
    """The canonical form of one egress rule, or :class:`RuleError`."""
    if not isinstance(entry, str):
        raise RuleError("it is not a string")
    text = entry.strip()
    if not text:
        raise RuleError("it is empty")
    if len(text) > MAX_RULE_CHARS:
        raise RuleError(f"it is longer than {MAX_RULE_CHARS} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise RuleError("it contains whitespace or a control character")
    if text == "*":
        return "*"
    bracketed = _BRACKETED.match(text)
    if bracketed:
        address, port = bracketed.group(1), bracketed.group(2)
        network = _ip(address)
        if network is None or network.version != 6:
            raise RuleError("only an IPv6 address or CIDR goes in brackets")
        return f"[{network}]" + _port_suffix(port) if port is not None else str(network)
    if text.count(":") > 1:  # a bare IPv6 address or CIDR (a port needs brackets)
        network = _ip(text)
        if network is None or network.version != 6:
            raise RuleError(
                "it is neither a host name nor an IP address (IPv6 with a port goes in brackets)"
            )
        return str(network)
    base, sep, port = text.partition(":")
    suffix = _port_suffix(port) if sep else ""
    network = _ip(base)
    if network is not None:
        return f"{network}{suffix}"
    if "/" in base:
        raise RuleError("it is not a valid CIDR (a prefix of 0-32 or 0-128, host bits zero)")
    return _host(base) + suffix


def _ip(text: str) -> _Network | None:
    """An address, or a network with zero host bits (strict); None when ``text`` is not IP-like
    at all. A zone index or host bits set raise :class:`RuleError`."""
    if "%" in text:
        raise RuleError("an IPv6 zone index is not allowed")
    try:
        if "/" in text:
            address, _, prefix = text.partition("/")
            ipaddress.ip_address(address)  # not IP-like: fall through to the host rule
            if not prefix.isdigit() or (len(prefix) > 1 and prefix[0] == "0"):
                raise RuleError("a CIDR prefix must be a plain number")
            try:
                return ipaddress.ip_network(text, strict=True)
            except ValueError as exc:
                raise RuleError(
                    "it is not a valid CIDR (a prefix of 0-32 or 0-128, host bits zero)"
                ) from exc
        return ipaddress.ip_address(text)
    except RuleError:
        raise
    except ValueError:
        return None


def _port_suffix(port: str) -> str:
    if not _PORT.match(port) or int(port) > 65535:
        raise RuleError("a port must be a number from 1 to 65535 without leading zeros")
    return f":{port}"


def _host(text: str) -> str:
    host = text.lower()
    labels = host.split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if not labels:
            raise RuleError("a wildcard needs a domain after '*.'")
    name = ".".join(labels)
    if len(name) > MAX_HOST_CHARS:
        raise RuleError(f"a host name is at most {MAX_HOST_CHARS} characters")
    if not all(_LABEL.match(label) for label in labels):
        raise RuleError(
            "a host name is dot-separated labels of 1-63 letters, digits or '-', not starting "
            "or ending with '-', with no empty label or trailing dot"
        )
    if labels[-1].isdigit():
        raise RuleError(
            "it is neither a valid IP address nor a host name (the last label is all digits)"
        )
    return host
