"""Byte-range parts: how a sync moves a stream larger than the files API takes in one file.

The files API refuses a file above its per-file limit (about 500 MiB on CreateOS, 413 above it),
so a tar stream (or a ``kind: file``) larger than the session's part size (``PART_BYTES`` of
:mod:`provider.driver.transfer.sync`, 256 MiB) travels as byte-range parts named
``<scratch>.part-0000``, ``<scratch>.part-0001``, ... (:func:`part_path`; four digits, as GNU
``split -d -a 4`` names them). This module holds the part arithmetic and every sandbox text that
knows about parts; the guard and the single-file texts are
:mod:`provider.driver.commands.sandbox_text`'s.

- Inbound: a mapping at or under the part size is one ``PUT`` of the whole file to its scratch
  path and is placed by ``sandbox_text.syncin_*_command`` (:func:`placement_text` picks). Above it,
  each part is one streamed ``PUT`` of a range of the host file (:func:`byte_ranges`); the
  placement step (:func:`syncin_parts_dir_command`, :func:`syncin_parts_file_command`) reads
  the parts in order, deleting each once consumed (so the sandbox holds at most the tree plus
  one part), into ``tar -xf - -C "$resolved"`` or, for a file, appended into the scratch before
  the usual ``chmod`` / ``mv``. The operation's ``EXIT`` trap
  (:mod:`provider.driver.transfer.sync_steps`) removes the scratch and ``<scratch>.part-*``
  (:meth:`Scratch.removal_words`) whatever happens.
- Outbound: the pack command (:func:`syncout_dir_parts_command`,
  :func:`syncout_file_parts_command`) always pipes into ``split -b <part size> -d -a 4`` (a
  small tree or file is one part, ``.part-0000``; an empty file gets an empty part) and prints
  the part count and each part's byte count (:data:`PARTS_MARK`), so one command packs whatever
  the size, with no second copy of the archive in the sandbox. The host ``GET``s the parts in
  order (:func:`parse_part_sizes`), and a part whose download is not exactly that many bytes
  (a gateway's HTML page answered with 200, a cut body) fails the sync before anything is
  installed; the cleanup is :meth:`Scratch.removal_command`. With an inline bound, one part
  small enough is printed base64 instead and removed by the pack command
  (:func:`provider.driver.transfer.sync_inline.pack_tail`): no ``GET`` and no cleanup.

Each public text pins the workspace root; the ``_``-prefixed builders take it as a parameter so
the tests can run the exact texts in real bash against a temporary tree.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from provider.driver.commands import sandbox_text
from provider.driver.commands.sandbox_ops import scratch_removal
from provider.driver.transfer import sync_inline

SCRATCH_PREFIX = "/tmp/paperclip-createos-transfer-"
PARTS_MARK = "__paperclip_sync_parts__"
PART_DIGITS = 4
MAX_PARTS = 10**PART_DIGITS
_PARTS_RE = re.compile(rf"^{PARTS_MARK} (\d+)((?: \d+)*)$", re.MULTILINE)


@dataclass
class Scratch:
    """A sandbox scratch path of one mapping: one file at ``path`` (``parts == 0``) or
    ``parts`` byte-range parts at :func:`part_path` ``(path, 0 .. parts - 1)``."""

    path: str
    parts: int = 0
    sent: bool = False  # a PUT to it may have started: it must be journaled and removed

    def removal_words(self) -> list[str]:
        """Shell words for ``rm -f --``: the scratch, and every part when split."""
        words = [sandbox_text.quote(self.path)]
        if self.parts:
            words.append(sandbox_text.quote(self.path + ".part-") + "*")
        return words

    def removal_command(self) -> tuple[str, list[str]]:
        """``POST /exec`` argv removing the scratch file, or the scratch and all its parts."""
        return scratch_removal(self.path, parts=bool(self.parts))


def new_scratch() -> str:
    """A fresh sandbox scratch path of one mapping's transfer (unique: removing it is safe)."""
    return f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"


def part_path(scratch: str, index: int) -> str:
    """The sandbox path of part ``index`` of ``scratch`` (``<scratch>.part-0003``)."""
    if not 0 <= index < MAX_PARTS:
        raise ValueError(f"a transfer has at most {MAX_PARTS} parts")
    return f"{scratch}.part-{index:0{PART_DIGITS}d}"


def part_count(size: int, part_bytes: int) -> int:
    """How many parts of at most ``part_bytes`` carry ``size`` bytes (at least one)."""
    if part_bytes < 1:
        raise ValueError("the part size must be positive")
    return max(1, -(-size // part_bytes))


def byte_ranges(scratch: Scratch, size: int, part_bytes: int) -> list[tuple[str, int, int]]:
    """``(sandbox path, offset, length)`` of each PUT: the whole file, or each part."""
    if not scratch.parts:
        return [(scratch.path, 0, size)]
    return [
        (
            part_path(scratch.path, index),
            index * part_bytes,
            min(part_bytes, size - index * part_bytes),
        )
        for index in range(scratch.parts)
    ]


def parse_part_count(stdout: str) -> int:
    """The part count a pack command printed; ValueError when it printed none or a bad one."""
    return len(parse_part_sizes(stdout))


def parse_part_sizes(stdout: str) -> list[int]:
    """The byte count of each part, in order, as the pack command printed them; ValueError
    when it printed none, an impossible part count, or not one size per part."""
    found = _PARTS_RE.findall(stdout)
    if not found:
        raise ValueError("the pack command printed no part count")
    count_text, sizes_text = found[-1]
    count = int(count_text)
    if not 1 <= count <= MAX_PARTS:
        raise ValueError(f"the pack command printed an impossible part count ({count})")
    sizes = [int(size) for size in sizes_text.split()]
    if len(sizes) != count:
        raise ValueError(f"the pack command printed {len(sizes)} part sizes for {count} parts")
    return sizes


# --- inbound: placing the parts ------------------------------------------------------------------


def placement_text(
    scratch: Scratch, kind: Literal["file", "directory"], target: str, mode: int
) -> str:
    """The placement step of one inbound mapping: docs/protocol.md 5.4 step 4 from the scratch
    file, or from its parts when the upload was split."""
    if scratch.parts:
        if kind == "directory":
            return syncin_parts_dir_command(scratch.path, scratch.parts, target, mode)
        return syncin_parts_file_command(scratch.path, scratch.parts, target, mode)
    if kind == "directory":
        return sandbox_text.syncin_dir_command(scratch.path, target, mode)
    return sandbox_text.syncin_file_command(scratch.path, target, mode)


def syncin_parts_dir_command(scratch: str, parts: int, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (directory) for a split archive: guard; mkdir; the parts in order
    through ``tar -xf -``; chmod the top."""
    return _syncin_parts_dir(scratch, parts, target, mode, sandbox_text.SANDBOX_ROOT)


def _syncin_parts_dir(scratch: str, parts: int, target: str, mode: int, root: str) -> str:
    return "\n".join(
        [
            sandbox_text.guard_snippet(target, root),
            'mkdir -p -- "$resolved" || exit 1',
            "set -o pipefail",
            _consume_parts(scratch, parts, "") + ' | tar -xf - -C "$resolved" || exit 1',
            f'chmod {sandbox_text.octal_mode(mode)} -- "$resolved" || exit 1',
        ]
    )


def syncin_parts_file_command(scratch: str, parts: int, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (file) for a split upload: guard; mkdir the parent; the parts appended in
    order into the scratch; chmod it; mv it into place."""
    return _syncin_parts_file(scratch, parts, target, mode, sandbox_text.SANDBOX_ROOT)


def _syncin_parts_file(scratch: str, parts: int, target: str, mode: int, root: str) -> str:
    q_scratch = sandbox_text.quote(scratch)
    return "\n".join(
        [
            sandbox_text.guard_snippet(target, root),
            'mkdir -p -- "$(dirname -- "$resolved")" || exit 1',
            f": > {q_scratch} || exit 1",
            _consume_parts(scratch, parts, q_scratch),
            f"chmod {sandbox_text.octal_mode(mode)} -- {q_scratch} || exit 1",
            f'mv -f -- {q_scratch} "$resolved" || exit 1',
        ]
    )


def _consume_parts(scratch: str, parts: int, sink: str) -> str:
    """A loop writing parts 0 .. parts-1 of ``scratch`` in order to stdout, or appending them to
    ``sink`` when given, deleting each once read; a missing part fails it."""
    if not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"a transfer has 1 to {MAX_PARTS} parts")
    redirect = f" >> {sink}" if sink else ""
    return (
        f"for ((i = 0; i < {parts}; i++)); do "
        f"printf -v part '%s.part-%0{PART_DIGITS}d' {sandbox_text.quote(scratch)} \"$i\"; "
        f'cat -- "$part"{redirect} && rm -f -- "$part" || exit 1; done'
    )


# --- outbound: packing into parts ----------------------------------------------------------------


def syncout_dir_parts_command(
    source: str,
    scratch: str,
    part_bytes: int,
    *,
    exclude: Sequence[str],
    follow_symlinks: bool,
    inline_bytes: int = 0,
) -> str:
    """Spec 5.6 step 1 (directory): guard; must be a directory; ``tar [-h] [--exclude] -cf -``
    piped into ``split`` parts of ``part_bytes``; prints the part count, or the archive itself
    when it is at most ``inline_bytes`` (:func:`provider.driver.transfer.sync_inline.pack_tail`)."""
    return _syncout_dir_parts(
        source,
        scratch,
        part_bytes,
        exclude,
        follow_symlinks,
        sandbox_text.SANDBOX_ROOT,
        inline_bytes,
    )


def _syncout_dir_parts(
    source: str,
    scratch: str,
    part_bytes: int,
    exclude: Sequence[str],
    follow_symlinks: bool,
    root: str,
    inline_bytes: int = 0,
) -> str:
    words = ["tar"]
    if follow_symlinks:
        words.append("-h")
    words.extend(f"--exclude={sandbox_text.quote(pattern)}" for pattern in exclude)
    words.extend(["-cf", "-", "-C", '"$resolved"', "."])
    return "\n".join(
        [
            sandbox_text.guard_snippet(source, root),
            'test -d "$resolved" || '
            f"{{ echo {sandbox_text.quote('paperclip: the sandbox path is not a directory')} >&2; "
            "exit 1; }",
            "set -o pipefail",
            " ".join(words) + " | " + _split(part_bytes, "-", scratch) + " || exit 1",
            _count_parts(scratch, inline_bytes),
        ]
    )


def syncout_file_parts_command(
    source: str, scratch: str, part_bytes: int, inline_bytes: int = 0
) -> str:
    """Spec 5.6 step 1 (file): guard; must be a regular file; ``split`` it into parts of
    ``part_bytes`` (instead of a ``cp``: one copy either way); prints the part count, or the
    file itself when it is at most ``inline_bytes``."""
    return _syncout_file_parts(source, scratch, part_bytes, sandbox_text.SANDBOX_ROOT, inline_bytes)


def _syncout_file_parts(
    source: str, scratch: str, part_bytes: int, root: str, inline_bytes: int = 0
) -> str:
    return "\n".join(
        [
            sandbox_text.guard_snippet(source, root),
            'test -f "$resolved" || '
            f"{{ echo {sandbox_text.quote('paperclip: the sandbox path is not a regular file')} "
            ">&2; exit 1; }",
            _split(part_bytes, '"$resolved"', scratch) + " || exit 1",
            _count_parts(scratch, inline_bytes),
        ]
    )


def _split(part_bytes: int, source: str, scratch: str) -> str:
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError("the part size must be a positive integer")
    prefix = sandbox_text.quote(scratch + ".part-")
    return f"split -b {part_bytes} -d -a {PART_DIGITS} -- {source} {prefix}"


def _count_parts(scratch: str, inline_bytes: int) -> str:
    """Print the part count and sizes; with ``inline_bytes`` (0: never), one small enough
    part is printed itself instead, and removed."""
    first = sandbox_text.quote(part_path(scratch, 0))
    lines = [
        f"[ -e {first} ] || : > {first} || exit 1",  # split writes nothing for empty input
        f"set -- {sandbox_text.quote(scratch + '.part-')}*",
    ]
    if inline_bytes:
        lines.append(sync_inline.pack_tail(inline_bytes))
    lines.append(f'echo "{PARTS_MARK} $#" $(stat -c %s -- "$@") || exit 1')
    return "\n".join(lines)
