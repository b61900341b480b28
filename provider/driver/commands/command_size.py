"""How large a sandbox command may be: the one bash argument every command travels in.

Every command the worker starts in a sandbox is ``/bin/bash -lc SCRIPT`` (an execute, and sync's
pack, placement and post-upload commands, which run as an execute of ``bash -c TEXT``) or
``/bin/bash -c SCRIPT`` (a duplex channel). SCRIPT holds, quoted, the command, its args, env
values and cwd, a sync's sandbox paths, exclusion patterns and post-upload commands. Linux
refuses an ``execve`` whose argv or environment holds a string longer than ``MAX_ARG_STRLEN``
(32 pages: 131,072 bytes with its terminating NUL), so SCRIPT is at most
:data:`MAX_SCRIPT_BYTES` (131,071) bytes of UTF-8, and no single argument or env value can be
larger either. Once SCRIPT fits, nothing else binds: argv and environment together (``ARG_MAX``,
a quarter of the stack limit, 2 MiB with the usual 8 MiB stack) hold SCRIPT, then the command's
own argv taken from it (at most about 0.5 MiB with one 8-byte pointer per argument), plus the
sandbox's environment; and a process create carrying SCRIPT is at most about 0.75 MiB of JSON
(six bytes per byte when every byte is escaped), under the emulator's 1 MiB body limit.

A larger command could never start; worse, CreateOS refuses its create request while the worker
is still sending it (413, then the connection closed), which reads as an unknown outcome and
poisoned the lease. :func:`check_script` refuses it before any request instead, naming the
largest input and the bound. stdin is not part of SCRIPT: it travels by ``/input`` or as a
staged file (:mod:`provider.driver.commands.execute`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from provider.errors import InvalidParams

MAX_ARG_STRLEN: Final = 131_072  # Linux: 32 pages, the terminating NUL included
MAX_SCRIPT_BYTES: Final = MAX_ARG_STRLEN - 1


def utf8_size(text: str) -> int:
    """Bytes of ``text`` as the sandbox receives it (UTF-8)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_script(script: str, what: str, inputs: Iterable[tuple[str, str]], advice: str) -> None:
    """Refuse ``script`` (what ``what`` starts as) when it exceeds :data:`MAX_SCRIPT_BYTES`,
    naming the largest of ``inputs`` (label, value) by its size, never by its value."""
    size = utf8_size(script)
    if size <= MAX_SCRIPT_BYTES:
        return
    sizes = ((utf8_size(value), label) for label, value in inputs)
    first = max(sizes, key=lambda item: item[0], default=None)  # the first of equals
    largest = f" The largest part is {first[1]} ({first[0]:,} bytes)." if first else ""
    raise InvalidParams(
        f"{what} is too large to start in the sandbox: it travels as one bash argument of "
        f"{size:,} bytes, and Linux takes at most {MAX_SCRIPT_BYTES:,} (MAX_ARG_STRLEN, 128 KiB "
        f"with its NUL).{largest} {advice}"
    )
