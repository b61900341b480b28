"""One in-sandbox script per inbound sync operation: placement, post-upload commands, cleanup.

Spec 5.4 and 5.9 as ordered steps of a single managed process, so a sync operation costs one
upload per mapping plus the three requests of one command (create, connect, close) instead of a
command per step and a cleanup request per mapping. What the steps keep:

- each mapping is placed by its guarded control text (``shell.syncin_*_command``, or
  ``syncin_parts_*_command`` below for a split upload);
- each post-upload command first passes the guard for its cwd, then runs **verbatim** as its
  own ``bash -c`` argument (never rewritten or joined with other text) in that cwd, under its
  own ``timeout``;
- the first failing step ends the script, so later steps never run;
- the scratch files are removed by an ``EXIT`` trap whatever happens (``TERM``/``HUP``/``INT``
  exit through it too), so nothing of the sync outlives the process.

Before each step the script writes a marker line to stderr; :func:`failed_step` reads back which
step failed and the stderr that step wrote, so errors name the step like separate commands did.

Large transfers: byte-range parts
---------------------------------
The files API refuses a file above its per-file limit (about 500 MiB on CreateOS, 413 above it),
so a tar stream (or a ``kind: file``) larger than the session's part size (``PART_BYTES`` of
:mod:`provider.driver.sync`, 256 MiB) travels as byte-range parts named
``<scratch>.part-0000``, ``<scratch>.part-0001``, ... (:func:`part_path`; four digits, as GNU
``split -d -a 4`` names them). Everything at or under the part size keeps its single scratch
file and the texts of :mod:`provider.driver.shell`, so a normal sync costs what it did.

- Inbound: each part is one streamed ``PUT`` of a range of the host file; the placement step
  (:func:`syncin_parts_dir_command`, :func:`syncin_parts_file_command`) reads the parts in
  order, deleting each once consumed (so the sandbox holds at most the tree plus one part), into
  ``tar -xf - -C "$resolved"`` or, for a file, appended into the scratch before the usual
  ``chmod`` / ``mv``. The ``EXIT`` trap removes the scratch and ``<scratch>.part-*`` whatever
  happens.
- Outbound: the pack command always pipes into ``split -b <part size> -d -a 4`` (a small tree or
  file is one part, ``.part-0000``; an empty file gets an empty part) and prints the part count
  (:data:`PARTS_MARK`), so one command packs whatever the size, with no second copy of the
  archive in the sandbox. The host ``GET``s the parts in order (:func:`parse_part_count`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from provider.driver import shell

STEP_MARK = "__paperclip_sync_step__"
PARTS_MARK = "__paperclip_sync_parts__"
PART_DIGITS = 4
MAX_PARTS = 10**PART_DIGITS
TIMEOUT_MARK = "__paperclip_sync_timeout__"
TIMEOUT_EXIT = 124  # what coreutils timeout answers when the command ran out of time
KILL_AFTER_S = 5
_MARK_RE = re.compile(rf"(?:^|\n){STEP_MARK} (\d+)\n")
_PARTS_RE = re.compile(rf"^{PARTS_MARK} (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class Step:
    label: str  # names the step in an error ("Placing /paperclip-workspace/x")
    text: str  # bash lines; a failure exits non-zero


@dataclass
class Scratch:
    """A sandbox scratch path of one mapping: one file at ``path`` (``parts == 0``) or
    ``parts`` byte-range parts at :func:`part_path` ``(path, 0 .. parts - 1)``."""

    path: str
    parts: int = 0

    def removal_words(self) -> list[str]:
        """Shell words for ``rm -f --``: the scratch, and every part when split."""
        words = [shell.quote(self.path)]
        if self.parts:
            words.append(shell.quote(self.path + ".part-") + "*")
        return words


@dataclass(frozen=True)
class FailedStep:
    label: str
    detail: str  # the stderr the failing step wrote (markers removed)
    timed_out: bool


def post_upload_steps(command: str, cwd: str, timeout_s: float) -> list[Step]:
    """The cwd guard, then the command verbatim in that cwd under ``timeout`` (spec 5.9)."""
    seconds = max(1, math.ceil(timeout_s))
    run = (
        f"cd -- {shell.quote(cwd)} || exit 1\n"
        f"timeout -k {KILL_AFTER_S} {seconds} /bin/bash -c {shell.quote(command)}\n"
        "rc=$?\n"
        f'[ "$rc" -ne {TIMEOUT_EXIT} ] || echo {TIMEOUT_MARK} >&2\n'
        'exit "$rc"'
    )
    return [
        Step("The post-upload cwd check", shell.guard_snippet(cwd)),
        Step("A post-upload command", run),
    ]


def operation_script(steps: Sequence[Step], scratches: Sequence[Scratch]) -> str:
    """The whole operation as one bash script (each step in its own subshell)."""
    removal = "rm -f -- " + " ".join(word for s in scratches for word in s.removal_words())
    lines = [f"trap {shell.quote(removal)} EXIT", "trap 'exit 143' HUP INT TERM"]
    for index, step in enumerate(steps):
        lines.append(f"printf '\\n{STEP_MARK} %d\\n' {index} >&2")
        lines.append(f"(\n{step.text}\n) || exit $?")
    return "\n".join(lines)


def failed_step(steps: Sequence[Step], stderr: str) -> FailedStep | None:
    """Which step a failed script stopped in, from its stderr markers (None: before any)."""
    found = list(_MARK_RE.finditer(stderr))
    if not found:
        return None
    last = found[-1]
    index = int(last.group(1))
    if not 0 <= index < len(steps):
        return None
    detail = stderr[last.end() :]
    timed_out = TIMEOUT_MARK in detail
    detail = detail.replace(TIMEOUT_MARK, "").strip()
    return FailedStep(steps[index].label, detail, timed_out)


# --- byte-range parts ----------------------------------------------------------------------------


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


def _consume_parts(scratch: str, parts: int, sink: str) -> str:
    """A loop writing parts 0 .. parts-1 of ``scratch`` in order to stdout, or appending them to
    ``sink`` when given, deleting each once read; a missing part fails it."""
    if not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"a transfer has 1 to {MAX_PARTS} parts")
    redirect = f" >> {sink}" if sink else ""
    return (
        f"for ((i = 0; i < {parts}; i++)); do "
        f"printf -v part '%s.part-%0{PART_DIGITS}d' {shell.quote(scratch)} \"$i\"; "
        f'cat -- "$part"{redirect} && rm -f -- "$part" || exit 1; done'
    )


def placement_text(
    scratch: Scratch, kind: Literal["file", "directory"], target: str, mode: int
) -> str:
    """The placement step of one inbound mapping: spec 5.4 step 4 from the scratch file, or
    from its parts when the upload was split."""
    if scratch.parts:
        if kind == "directory":
            return syncin_parts_dir_command(scratch.path, scratch.parts, target, mode)
        return syncin_parts_file_command(scratch.path, scratch.parts, target, mode)
    if kind == "directory":
        return shell.syncin_dir_command(scratch.path, target, mode)
    return shell.syncin_file_command(scratch.path, target, mode)


def syncin_parts_dir_command(scratch: str, parts: int, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (directory) for a split archive: guard; mkdir; the parts in order
    through ``tar -xf -``; chmod the top."""
    return "\n".join(
        [
            shell.guard_snippet(target),
            'mkdir -p -- "$resolved" || exit 1',
            "set -o pipefail",
            _consume_parts(scratch, parts, "") + ' | tar -xf - -C "$resolved" || exit 1',
            f'chmod {_octal(mode)} -- "$resolved" || exit 1',
        ]
    )


def syncin_parts_file_command(scratch: str, parts: int, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (file) for a split upload: guard; mkdir the parent; the parts appended in
    order into the scratch; chmod it; mv it into place."""
    q_scratch = shell.quote(scratch)
    return "\n".join(
        [
            shell.guard_snippet(target),
            'mkdir -p -- "$(dirname -- "$resolved")" || exit 1',
            f": > {q_scratch} || exit 1",
            _consume_parts(scratch, parts, q_scratch),
            f"chmod {_octal(mode)} -- {q_scratch} || exit 1",
            f'mv -f -- {q_scratch} "$resolved" || exit 1',
        ]
    )


def _count_parts(scratch: str) -> str:
    first = shell.quote(part_path(scratch, 0))
    return "\n".join(
        [
            f"[ -e {first} ] || : > {first} || exit 1",  # split writes nothing for empty input
            f"set -- {shell.quote(scratch + '.part-')}*",
            f'echo "{PARTS_MARK} $#"',
        ]
    )


def syncout_dir_parts_command(
    source: str,
    scratch: str,
    part_bytes: int,
    *,
    exclude: Sequence[str],
    follow_symlinks: bool,
) -> str:
    """Spec 5.6 step 1 (directory): guard; must be a directory; ``tar [-h] [--exclude] -cf -``
    piped into ``split`` parts of ``part_bytes``; prints the part count."""
    words = ["tar"]
    if follow_symlinks:
        words.append("-h")
    words.extend(f"--exclude={shell.quote(pattern)}" for pattern in exclude)
    words.extend(["-cf", "-", "-C", '"$resolved"', "."])
    return "\n".join(
        [
            shell.guard_snippet(source),
            'test -d "$resolved" || '
            f"{{ echo {shell.quote('paperclip: the sandbox path is not a directory')} >&2; "
            "exit 1; }",
            "set -o pipefail",
            " ".join(words) + " | " + _split(part_bytes, "-", scratch) + " || exit 1",
            _count_parts(scratch),
        ]
    )


def syncout_file_parts_command(source: str, scratch: str, part_bytes: int) -> str:
    """Spec 5.6 step 1 (file): guard; must be a regular file; ``split`` it into parts of
    ``part_bytes`` (instead of a ``cp``: one copy either way); prints the part count."""
    return "\n".join(
        [
            shell.guard_snippet(source),
            'test -f "$resolved" || '
            f"{{ echo {shell.quote('paperclip: the sandbox path is not a regular file')} >&2; "
            "exit 1; }",
            _split(part_bytes, '"$resolved"', scratch) + " || exit 1",
            _count_parts(scratch),
        ]
    )


def _split(part_bytes: int, source: str, scratch: str) -> str:
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError("the part size must be a positive integer")
    prefix = shell.quote(scratch + ".part-")
    return f"split -b {part_bytes} -d -a {PART_DIGITS} -- {source} {prefix}"


def parse_part_count(stdout: str) -> int:
    """The part count a pack command printed; ValueError when it printed none or a bad one."""
    found = _PARTS_RE.findall(stdout)
    if not found:
        raise ValueError("the pack command printed no part count")
    count = int(found[-1])
    if not 1 <= count <= MAX_PARTS:
        raise ValueError(f"the pack command printed an impossible part count ({count})")
    return count


def removal_command(scratch: str) -> tuple[str, list[str]]:
    """``POST /exec`` argv removing ``scratch`` and all its parts (a glob, so parts of a pack or
    an upload that stopped halfway go too)."""
    return "/bin/bash", ["-c", 'rm -f -- "$1" "$1".part-*', "rm", scratch]


def _octal(mode: int) -> str:
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError("mode must be an integer in [0, 0o777]")
    return format(mode, "04o")
