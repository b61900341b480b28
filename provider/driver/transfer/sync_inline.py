"""Small syncs inside their one command: the bytes ride in the exec's stdin or stdout.

With ordinary commands running as one streaming exec each (docs/protocol.md 3.9), a sync
of a small file or tree spends more requests on the files API than on the work: inbound, a
``PUT`` and the placing command; outbound, the pack command, a ``GET`` and the scratch removal.
Small enough archives and files skip the files API (issue 22, item 2):

- **Inbound**: every mapping whose bytes, base64-encoded, still fit in what is left of the
  operation's inline stdin (:data:`INLINE_IN_CHARS` characters, the exec's inline stdin bound,
  so the command stays one request) travels in the command's stdin, one encoded run after the
  other in mapping order. Its placement step first decodes exactly its run (``head -c <len> |
  base64 -d``, under ``umask 077``) into its scratch file and checks the scratch holds exactly
  the host's byte count (:func:`receive_text`), then places it as an uploaded scratch is
  placed (the guard, ``chmod`` before ``mv``, ``tar -xf`` into the target). After the last
  decoding step the operation's stdin becomes ``/dev/null``, so post-upload commands see what
  they always saw. The operation's ``EXIT`` trap removes the scratch as before. Larger
  mappings are uploaded with ``PUT`` as before (a mix is fine).
- **Outbound**: the pack command packs into its scratch as always; when the result is one
  part of at most :data:`INLINE_OUT_BYTES` it prints :data:`INLINE_MARK` and the byte count,
  then the bytes as one base64 line, and removes the scratch itself (:func:`pack_tail`). The
  worker decodes that line strictly (:func:`parse_inline`: the base64 alphabet and padding
  only, the exact byte count, never above the bound) into its host temp file and validates,
  installs or extracts it exactly as a downloaded file. Larger results print the part sizes
  and are fetched with ``GET`` as before, and so is everything on an origin without the exec
  stream (its commands' output passes through a managed process's 1 MiB journal).

Why it is safe for the bytes: base64 is ASCII, so the exec's JSON text (stdin in the body,
output frames decoded as UTF-8) carries it unchanged; a truncated or altered run fails the
exact byte count or the strict decoding, and the sync fails with nothing placed or installed.
The encoded output (at most about 1.4 Mi characters) stays well inside the 4 Mi-character
output tail a command's result keeps, and sync commands send no live output, so no base64
reaches a log. A 5 MiB transfer still goes through the files API, raw.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

from provider.driver.commands import sandbox_text
from provider.driver.commands.streamed import INLINE_STDIN_BYTES

INLINE_IN_CHARS: Final = INLINE_STDIN_BYTES
"""Base64 characters an inbound operation may carry in its command's stdin (about 192 KiB of
bytes): the exec's inline stdin bound, so the operation stays one request."""
INLINE_OUT_BYTES: Final = 1024 * 1024
"""The largest packed file or archive an outbound mapping receives in its pack command's
output (about 1.4 Mi base64 characters); larger ones are fetched with ``GET``."""
INLINE_MARK = "__paperclip_sync_inline__"
_INLINE_RE = re.compile(rf"(?:^|\n){INLINE_MARK} (\d+)\n([^\n]*)\n")


def encoded_length(size: int) -> int:
    """How many base64 characters carry ``size`` bytes (padded)."""
    return 4 * -(-size // 3)


def encode(data: bytes) -> str:
    """``data`` as one padded base64 run, no newlines."""
    return base64.b64encode(data).decode("ascii")


def receive_text(scratch: str, size: int) -> str:
    """Bash lines decoding the next :func:`encoded_length` (``size``) characters of stdin into
    ``scratch`` (mode 0600) and checking that it holds exactly ``size`` bytes."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("the inline size must be a non-negative integer")
    q_scratch = sandbox_text.quote(scratch)
    return "\n".join(
        [
            f"(umask 077 && head -c {encoded_length(size)} | base64 -d > {q_scratch}) || "
            f"{{ echo {sandbox_text.quote('paperclip: the inline upload could not be decoded')} "
            ">&2; exit 1; }",
            f'[ "$(stat -c %s -- {q_scratch})" = {size} ] || '
            f"{{ echo {sandbox_text.quote('paperclip: the inline upload arrived incomplete')} "
            ">&2; exit 1; }",
        ]
    )


def pack_tail(inline_bytes: int) -> str:
    """Bash lines for the end of a pack command, with the parts as ``"$@"``: one part of at
    most ``inline_bytes`` -> :data:`INLINE_MARK`, its size, its bytes as one base64 line, and
    it is removed; otherwise nothing (the caller prints the part sizes)."""
    if isinstance(inline_bytes, bool) or not isinstance(inline_bytes, int) or inline_bytes < 1:
        raise ValueError("the inline bound must be a positive integer")
    return (
        f'if [ $# -eq 1 ] && size=$(stat -c %s -- "$1") && [ "$size" -le {inline_bytes} ]; '
        f'then echo "{INLINE_MARK} $size" && base64 -w 0 -- "$1" && echo && '
        'rm -f -- "$1" || exit 1; exit 0; fi'
    )


def parse_inline(stdout: str, bound: int) -> bytes | None:
    """The bytes a pack command printed inline (the last such block), or None when it printed
    none (its parts are to be fetched). ValueError when the block is not strict padded
    base64, decodes to another byte count than announced, or announces more than ``bound``."""
    blocks = list(_INLINE_RE.finditer(stdout))
    if not blocks:
        return None
    found = blocks[-1]
    size = int(found.group(1))
    if size > bound:
        raise ValueError(f"the pack command printed {size} bytes inline, over {bound}")
    try:
        data = binascii.a2b_base64(found.group(2), strict_mode=True)
    except binascii.Error:
        raise ValueError("the pack command's inline bytes are not valid base64") from None
    if len(data) != size:
        raise ValueError(f"the pack command announced {size} bytes inline but printed {len(data)}")
    return data
