"""Shell text sent into the sandbox: quoting, the execute wrapper, the guard, sync placement.

Every value that reaches bash goes through :func:`quote` (single quotes, ``'`` spelled ``'"'"'``),
so arguments, environment values and paths arrive verbatim whatever they contain. NUL cannot be
carried by an argv or a file name and is refused. The in-sandbox guard (docs/protocol.md 5.3,
:func:`guard_snippet`) is an early, readable error; the host-side confinement in
:func:`confine_sandbox_path` is the boundary. The inbound placement of a single scratch file
(:func:`syncin_file_command`, :func:`syncin_dir_command`) is here too; everything that knows
about byte-range parts, the outbound pack commands included, is
:mod:`provider.driver.transfer.sync_parts`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from provider.errors import RequestRefused

SANDBOX_ROOT = "/paperclip-workspace"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def quote(value: str) -> str:
    """Single-quote ``value`` for bash. Raises ValueError on NUL (no argv can carry it)."""
    if "\0" in value:
        raise ValueError("a shell value contains a NUL character")
    return "'" + value.replace("'", "'\"'\"'") + "'"


def validate_env(env: object) -> dict[str, str]:
    """Spec 3.1: a mapping of valid names to NUL-free strings. Errors name the variable only."""
    if not isinstance(env, Mapping):
        raise RequestRefused("env must be an object mapping variable names to strings")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise RequestRefused(
                f"env variable name {_show_name(name)} is invalid: names must match "
                "[A-Za-z_][A-Za-z0-9_]*"
            )
        if not isinstance(value, str):
            raise RequestRefused(
                f"env variable {name} must have a string value, not {type(value).__name__}"
            )
        if "\0" in value:
            raise RequestRefused(f"env variable {name} has a value containing a NUL character")
        checked[name] = value
    return checked


def _show_name(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


StdinMode = Literal["none", "pipe", "file"]


def build_wrapper_script(
    *,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    gate_seconds: int,
    stdin: StdinMode = "none",
    stdin_path: str | None = None,
    stdin_length: int = 0,
) -> str:
    """The bash script of docs/protocol.md 3.2: wait for EOF on stdin (the start gate), optional
    cd, then ``exec env ... argv`` with the command's own stdin.

    The process's stdin pipe is the gate: the worker closes it once the output stream is open,
    so the command never starts before a reader is attached. The wait is bounded by
    ``gate_seconds`` (then exit 125). ``stdin`` says where the command's input comes from:

    - ``"none"``: ``/dev/null``;
    - ``"pipe"``: exactly ``stdin_length`` bytes written to the process's stdin are drained
      into an already-unlinked temp file (nothing is left in the sandbox whatever happens
      next), which becomes the command's stdin; their arrival is the gate (no close needed);
    - ``"file"``: the file staged at ``stdin_path`` is opened and unlinked first thing.

    Raises RequestRefused for an empty command or NUL in command, args or cwd, and for a bad env
    (via :func:`validate_env`). A command starting with ``-`` or holding ``=`` cannot be named
    through ``env`` (it would read it as an option or an assignment); such a command is started
    through ``bash -c 'exec -- "$0" "$@"'`` after ``env`` instead.
    """
    if not isinstance(command, str) or not command:
        raise RequestRefused("command must be a non-empty string")
    if "\0" in command:
        raise RequestRefused("command contains a NUL character")
    for index, arg in enumerate(args):
        if not isinstance(arg, str):
            raise RequestRefused(f"args[{index}] must be a string")
        if "\0" in arg:
            raise RequestRefused(f"args[{index}] contains a NUL character")
    if cwd is not None and "\0" in cwd:
        raise RequestRefused("cwd contains a NUL character")
    checked_env = validate_env(env)
    if isinstance(gate_seconds, bool) or not isinstance(gate_seconds, int) or gate_seconds < 1:
        raise ValueError("gate_seconds must be a positive integer")
    if (stdin == "file") != (stdin_path is not None):
        raise ValueError("stdin_path goes with stdin='file' only")
    if isinstance(stdin_length, bool) or not isinstance(stdin_length, int):
        raise ValueError("stdin_length must be an integer")
    if (stdin == "pipe") != (stdin_length > 0):
        raise ValueError("a positive stdin_length goes with stdin='pipe' only")

    lines = []
    if stdin == "file" and stdin_path is not None:
        path = quote(stdin_path)
        lines.append(f"exec 4<{path} && rm -f -- {path} || exit 125")
    if stdin == "pipe":
        lines.append(
            't=$(mktemp /tmp/paperclip-stdin-XXXXXXXXXX) && exec 3>"$t" 4<"$t" 5<"$t" '
            '&& rm -f -- "$t" || exit 125'
        )
        lines.append(
            f"timeout {gate_seconds} head -c {stdin_length} >&3 && exec 3>&- "
            f'&& [ "$(wc -c <&5)" -eq {stdin_length} ] && exec 5<&- || exit 125'
        )
    else:
        lines.append(f"timeout {gate_seconds} cat >/dev/null || exit 125")
    if cwd is not None:
        lines.append(f"cd -- {quote(cwd)} || exit")
    words = ["exec", "env"]
    words.extend(f"{name}={quote(value)}" for name, value in checked_env.items())
    if command.startswith("-") or "=" in command:
        words.extend(["/bin/bash", "-c", quote('exec -- "$0" "$@"')])
    words.append(quote(command))
    words.extend(quote(arg) for arg in args)
    words.append("</dev/null" if stdin == "none" else "<&4 4<&-")
    lines.append(" ".join(words))
    return "\n".join(lines)


def confine_sandbox_path(path: str) -> str:
    """Spec 5.2: return the normalized sandbox path, or raise RequestRefused naming the rule."""
    return _confine(path, SANDBOX_ROOT)


def _confine(path: object, root: str) -> str:
    if not isinstance(path, str) or not path:
        raise RequestRefused("a sandbox path must be a non-empty string")
    if "\0" in path:
        raise RequestRefused("a sandbox path contains a NUL character")
    if not path.startswith("/"):
        raise RequestRefused(f"sandbox path {path!r} is not absolute (it must be under {root})")
    if ".." in path.split("/"):
        raise RequestRefused(f"sandbox path {path!r} contains a '..' segment")
    normalized = "/" + posixpath.normpath(path).lstrip("/")
    if normalized != root and not normalized.startswith(root + "/"):
        raise RequestRefused(f"sandbox path {path!r} is outside {root}")
    return normalized


def guard_snippet(path: str, root: str = SANDBOX_ROOT) -> str:
    """Spec 5.3: root check, then ``resolved`` = realpath -m of ``path``, confined, else exit 1.
    ``root`` is the workspace root; only the tests give another (a temporary tree)."""
    q_root = quote(root)
    return "\n".join(
        [
            f'root=$(realpath -- {q_root}) && [ "$root" = {q_root} ] || '
            f"{{ echo {quote(f'paperclip: {root} is missing or not a real directory')} >&2; "
            "exit 1; }",
            f"resolved=$(realpath -m -- {quote(path)}) || "
            f"{{ echo {quote('paperclip: cannot resolve the sandbox path (GNU realpath -m)')} >&2;"
            " exit 1; }",
            f'case "$resolved" in {q_root}|{q_root}/*) ;; '
            f"*) echo {quote(f'paperclip: the sandbox path resolves outside {root}')} >&2; "
            "exit 1;; esac",
        ]
    )


def octal_mode(mode: int) -> str:
    """``mode`` as ``chmod`` takes it (``0755``); ValueError outside ``[0, 0o777]``."""
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError("mode must be an integer in [0, 0o777]")
    return format(mode, "04o")


def syncin_file_command(scratch: str, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (file): guard; mkdir the parent; chmod the scratch file; mv it into place."""
    return _syncin_file(scratch, target, mode, SANDBOX_ROOT)


def _syncin_file(scratch: str, target: str, mode: int, root: str) -> str:
    q_scratch = quote(scratch)
    return "\n".join(
        [
            guard_snippet(target, root),
            'mkdir -p -- "$(dirname -- "$resolved")" || exit 1',
            f"chmod {octal_mode(mode)} -- {q_scratch} || exit 1",
            f'mv -f -- {q_scratch} "$resolved" || exit 1',
        ]
    )


def syncin_dir_command(scratch: str, target: str, mode: int) -> str:
    """Spec 5.4 step 4 (directory): guard; mkdir; untar the scratch archive; chmod the top."""
    return _syncin_dir(scratch, target, mode, SANDBOX_ROOT)


def _syncin_dir(scratch: str, target: str, mode: int, root: str) -> str:
    return "\n".join(
        [
            guard_snippet(target, root),
            'mkdir -p -- "$resolved" || exit 1',
            f'tar -xf {quote(scratch)} -C "$resolved" || exit 1',
            f'chmod {octal_mode(mode)} -- "$resolved" || exit 1',
        ]
    )
