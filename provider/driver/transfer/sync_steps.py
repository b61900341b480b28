"""One in-sandbox script per inbound sync operation: placement, post-upload commands, cleanup.

Spec 5.4 and 5.9 as ordered steps of a single command, so a sync operation costs that one
command (one streaming exec) plus one upload per mapping that did not travel in its stdin
(:mod:`provider.driver.transfer.sync_inline`; or one per byte-range part, :mod:`provider.driver.
sync_parts`) instead of a command per step and a cleanup request per mapping. What the steps
keep:

- each mapping is placed by its guarded control text (``sync_parts.placement_text``: the
  single-file texts of :mod:`provider.driver.commands.sandbox_text`, or the part-consuming ones for
  a split upload), after decoding its bytes from stdin into its scratch when they travel inline;
- each post-upload command first passes the guard for its cwd, then runs **verbatim** as its
  own ``bash -c`` argument (never rewritten or joined with other text) in that cwd, under its
  own ``timeout``;
- the first failing step ends the script, so later steps never run;
- the scratch files (and their parts) are removed by an ``EXIT`` trap whatever happens
  (``TERM``/``HUP``/``INT`` exit through it too), so nothing of the sync outlives the process.

Before each step the script writes a marker line to stderr; :func:`failed_step` reads back which
step failed and the stderr that step wrote, so errors name the step like separate commands did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from provider.driver.commands import sandbox_text
from provider.driver.transfer.sync_parts import Scratch

STEP_MARK = "__paperclip_sync_step__"
TIMEOUT_MARK = "__paperclip_sync_timeout__"
TIMEOUT_EXIT = 124  # what coreutils timeout answers when the command ran out of time
KILL_AFTER_S = 5
_MARK_RE = re.compile(rf"(?:^|\n){STEP_MARK} (\d+)\n")


@dataclass(frozen=True)
class Step:
    label: str  # names the step in an error ("Placing /paperclip-workspace/x")
    text: str  # bash lines; a failure exits non-zero
    reads_stdin: bool = False  # it decodes its bytes from the script's stdin


@dataclass(frozen=True)
class FailedStep:
    label: str
    detail: str  # the stderr the failing step wrote (markers removed)
    timed_out: bool


def post_upload_steps(command: str, cwd: str, timeout_s: float) -> list[Step]:
    """The cwd guard, then the command verbatim in that cwd under ``timeout`` (docs/protocol.md
    5.9)."""
    seconds = max(1, math.ceil(timeout_s))
    run = (
        f"cd -- {sandbox_text.quote(cwd)} || exit 1\n"
        f"timeout -k {KILL_AFTER_S} {seconds} /bin/bash -c {sandbox_text.quote(command)}\n"
        "rc=$?\n"
        f'[ "$rc" -ne {TIMEOUT_EXIT} ] || echo {TIMEOUT_MARK} >&2\n'
        'exit "$rc"'
    )
    return [
        Step("The post-upload cwd check", sandbox_text.guard_snippet(cwd)),
        Step("A post-upload command", run),
    ]


def operation_script(steps: Sequence[Step], scratches: Sequence[Scratch]) -> str:
    """The whole operation as one bash script (each step in its own subshell). After the last
    step that reads the script's stdin, stdin becomes ``/dev/null``: later steps (post-upload
    commands) see no stdin, as when nothing travels inline."""
    removal = "rm -f -- " + " ".join(word for s in scratches for word in s.removal_words())
    lines = [f"trap {sandbox_text.quote(removal)} EXIT", "trap 'exit 143' HUP INT TERM"]
    readers = [index for index, step in enumerate(steps) if step.reads_stdin]
    for index, step in enumerate(steps):
        lines.append(f"printf '\\n{STEP_MARK} %d\\n' {index} >&2")
        lines.append(f"(\n{step.text}\n) || exit $?")
        if readers and index == readers[-1]:
            lines.append("exec </dev/null")
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
