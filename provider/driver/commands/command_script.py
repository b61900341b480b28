"""The bash text of a streamed command (docs/protocol.md 3.9): its wrapper and its kill.

A command runs as one ``POST /exec?stream=true`` of ``/usr/bin/env PAPERCLIP_CMD=<token>
/bin/bash -lc <wrapper>``. The token is in the environment of the wrapper and of everything the
command starts, ``setsid`` and double-forked processes included: it names the command's tree,
which the API itself does not track. The wrapper (:func:`stream_wrapper`):

- refuses to start when a kill for its token came first (a tombstone in :data:`CANCELLED_DIR`),
  so a request that reaches the sandbox after its cancellation runs nothing;
- starts the command in a process group of its own (``set -m``), as the child of a holder that
  never reaps it (``exec sleep``; the command waits until its parent has become that ``sleep``,
  or the parent's bash could reap a command that ends at once), so that when the leader exits
  it stays a zombie whose raw wait
  status the wrapper reads from ``/proc/<pid>/stat`` (field 52): exit code and signal are told
  apart exactly, which ``$?`` cannot do;
- enforces the timeout with its own clock: it kills the tree (:data:`KILL_FUNCTIONS`) and says so;
- ends with a marker line, ``\\x1epaperclip-end-<nonce>:<status>``, on stdout and on stderr, at the
  leader's exit (the marker is assembled at run time, never spelled out in the script's text,
  which a command can print from ``/proc/*/cmdline``), whatever background children still hold
  the stream. Each pipe keeps its order, so everything the leader wrote precedes its marker; the
  worker stops reading at the two markers and strips them
  (:mod:`provider.driver.commands.stream_end`). ``<status>`` is ``exit=N``, ``signal=N``,
  ``timeout`` (``timeout=N`` when its kill left N processes), ``cancelled`` or ``lost`` (the
  leader's status could not be read).

The kill (:func:`kill_script`, and the wrapper's timeout) sends SIGTERM to every process that
carries the token or is in the process group of one that does, when that group's leader carries
it or is the child of a carrier (the command's own group, while its leader lives), waits up
to 1 s, then SIGKILL, and scans again: it prints ``paperclip-kill found=N left=M``, and only
``left=0`` is a confirmed kill. A process that scrubbed its environment and left the group is out
of reach (RELIABILITY.md says so).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

from provider.driver.commands.sandbox_text import quote

TREE_VAR = "PAPERCLIP_CMD"
"""The environment variable that carries a command's token."""
EVERY_COMMAND = "*"
"""For :func:`kill_script`: every streamed command's tree."""
CANCELLED_DIR = "/tmp/.paperclip-cancelled"
END_TAG = "\x1epaperclip-end-"
HOLD_SLACK_SECONDS = 120
"""The zombie holder outlives the command's timeout by this much at most, so a wrapper killed
from outside leaves nothing running for long."""

StreamStdin = Literal["none", "inline", "file"]

# The tree: token carriers, and every member of a group that one of them is in whose live leader
# carries the token or is the child of a carrier (the command's leader, child of the wrapper's
# holder), plus the group the caller names (the wrapper's timeout names the command's). Never the
# caller's own group. A group whose leader is gone is not taken on the carriers' word: the exec
# server may run every exec in one group. Zombies are dead already.
KILL_FUNCTIONS = r"""
pc_scan() {
  pc_v=()
  local d p st f kv g own
  local -A car=() pg=() pp=() live=() grp=()
  { read -r st < /proc/$BASHPID/stat; } 2>/dev/null; f=(${st##*) }); own=${f[2]}
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    { read -r st < "$d/stat"; } 2>/dev/null || continue
    f=(${st##*) })
    [[ ${f[0]} == [ZX] ]] && continue
    live[$p]=1; pp[$p]=${f[1]}; pg[$p]=${f[2]}
    { while IFS= read -r -d '' kv; do
        [[ $kv == PAPERCLIP_CMD=$1 ]] && { car[$p]=1; break; }
      done < "$d/environ"; } 2>/dev/null
  done
  [[ -n $2 ]] && grp[$2]=1
  for p in "${!car[@]}"; do
    g=${pg[$p]}
    [[ -n ${car[$g]} || ( -n ${pp[$g]} && -n ${car[${pp[$g]}]} ) ]] && grp[$g]=1
  done
  unset "grp[$own]"
  for p in "${!live[@]}"; do
    [[ -n ${car[$p]} || -n ${grp[${pg[$p]}]} ]] && pc_v+=("$p")
  done
}
pc_kill() {
  local sig n
  pc_scan "$1" "$2"; pc_found=${#pc_v[@]}
  for sig in TERM KILL; do
    for n in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      ((${#pc_v[@]})) || break 2
      [[ $sig == KILL || $n == 1 ]] && kill -"$sig" "${pc_v[@]}" 2>/dev/null
      sleep 0.05; pc_scan "$1" "$2"
    done
  done
  pc_left=${#pc_v[@]}
}
""".strip()

# pc_wait reads the leader's stat after waiting a tenth of the time waited so far (1 to 50 ms;
# the sum of the waits stands in for a clock): an exit is seen within 10% of the run time plus
# 1 ms, and a long command is polled 20 times a second.
_WRAPPER_BODY = r"""
pc_wait() {
  local d=1000 s=0 r
  while :; do
    if ! { read -r pc_st < /proc/$pc_lp/stat; } 2>/dev/null; then pc_r=lost; return; fi
    pc_f=(${pc_st##*) })
    if [[ ${pc_f[0]} == Z ]]; then
      if (( pc_f[49] & 127 )); then pc_r=signal=$(( pc_f[49] & 127 ))
      else pc_r=exit=$(( (pc_f[49] >> 8) & 255 )); fi
      return
    fi
    [[ -n $r ]] && { pc_r=lost; return; }
    pc_now
    if (( pc_us - pc_t0 >= pc_limit )); then
      pc_kill "$PAPERCLIP_CMD" "$pc_lp"; pc_r=timeout; ((pc_left)) && pc_r=timeout=$pc_left
      return
    fi
    printf -v pc_d '0.%06d' "$d"
    read -r -t $pc_d -u $pc_h; (( $? > 128 )) || r=eof
    ((s += d, d = s / 10)); ((d < 1000)) && d=1000; ((d > 50000)) && d=50000
  done
}
pc_held() {
  local s f c n=0
  while :; do
    { read -r s < /proc/$BASHPID/stat; } 2>/dev/null || return
    f=(${s##*) }); { read -r c < /proc/${f[1]}/comm; } 2>/dev/null || return
    [[ $c == sleep ]] && return
    ((++n > 100)) && sleep 0.001
    ((n > 3000)) && return
  done
}
pc_now() {
  if [[ -n $EPOCHREALTIME ]]; then pc_us=${EPOCHREALTIME//[!0-9]/}
  else pc_us=$((SECONDS * 1000000)); fi
}
""".strip()


def new_token() -> str:
    """A fresh per-command token (also used for the end marker's nonce)."""
    return uuid.uuid4().hex


def end_tag(nonce: str) -> str:
    """The marker's fixed head; the status and a newline follow it."""
    return f"{END_TAG}{nonce}:"


def stream_wrapper(
    *,
    nonce: str,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float,
    stdin: StreamStdin,
    stdin_path: str | None = None,
) -> str:
    """The wrapper of one streamed command (module docstring). Values are quoted; the caller
    has validated them (:func:`provider.driver.commands.execute.check_command`)."""
    if (stdin == "file") != (stdin_path is not None):
        raise ValueError("stdin_path goes with stdin='file' only")
    if not re.fullmatch(r"[0-9a-f]{32}", nonce):
        raise ValueError("a nonce is 32 lowercase hex digits")
    limit_us = max(1, round(timeout * 1_000_000))
    hold = int(timeout) + HOLD_SLACK_SECONDS
    words = ["env"]
    words.extend(f"{name}={quote(value)}" for name, value in env.items())
    if command.startswith("-") or "=" in command:
        words.extend(["/bin/bash", "-c", quote('exec -- "$0" "$@"')])
    words.append(quote(command))
    words.extend(quote(arg) for arg in args)
    lines = [
        "IFS=$' \\t\\n'",
        # The tag is put together at run time: the script's text (which a command can read in
        # /proc/*/cmdline) never holds it, so printing that text cannot end the stream early.
        f"pc_b={nonce[16:]}; pc_a={nonce[:16]}; pc_tag=$'\\036'{END_TAG[1:]}$pc_a$pc_b:",
        'pc_end() { printf \'%s%s\\n\' "$pc_tag" "$1"; printf \'%s%s\\n\' "$pc_tag" "$1" >&2; }',
        f'[ -e {CANCELLED_DIR}/"$PAPERCLIP_CMD" ] && {{ pc_end cancelled; exit 125; }}',
        KILL_FUNCTIONS,
        _WRAPPER_BODY,
    ]
    if stdin == "file" and stdin_path is not None:
        path = quote(stdin_path)
        lines.append(f"exec 6<{path} && rm -f -- {path} || {{ pc_end exit=125; exit 125; }}")
    elif stdin == "inline":
        lines.append("exec 6<&0")
    else:
        lines.append("exec 6</dev/null")
    lines.append("exec 7>&1 8>&2 0</dev/null")
    if cwd is not None:
        lines.append(f"cd -- {quote(cwd)} || {{ pc_end exit=1; exit 1; }}")
    lines += [
        f"pc_now; pc_t0=$pc_us; pc_limit={limit_us}",
        f"exec {{pc_h}}< <(set -m; {{ pc_held; {' '.join(['exec', *words])}; }} "
        "<&6 >&7 2>&8 6<&- 7>&- 8>&- & "
        f'printf \'%s %s\\n\' "$BASHPID" "$!"; '
        f"exec sleep {hold} </dev/null 2>/dev/null 6<&- 7>&- 8>&-)",
        "exec 6<&- 7>&- 8>&-",
        "read -r pc_hp pc_lp <&$pc_h || { pc_end lost; exit 125; }",
        "pc_wait",
        'kill -KILL "$pc_hp" 2>/dev/null',
        'pc_end "$pc_r"',
    ]
    return "\n".join(lines)


def kill_script(token: str, *, remove: Sequence[str] = ()) -> str:
    """Leave a tombstone for ``token``, kill its tree, remove ``remove`` (a staged stdin file
    whose command may not have started) and print the verdict (module docstring). ``"*"``
    kills every streamed command's tree (tombstones are for one token only)."""
    lines = []
    if token != EVERY_COMMAND:
        if not re.fullmatch(r"[0-9a-f]{32}", token):
            raise ValueError("a command token is 32 lowercase hex digits (or '*': every one)")
        lines += [
            f"mkdir -p {CANCELLED_DIR} && : > {CANCELLED_DIR}/{token} || "
            "echo 'paperclip-kill: no tombstone' >&2",
            f"find {CANCELLED_DIR} -type f -mmin +1440 -delete 2>/dev/null",
        ]
    lines += [KILL_FUNCTIONS, f"pc_kill {quote(token)} ''"]
    if remove:
        lines.append("rm -f -- " + " ".join(quote(path) for path in remove))
    lines.append('echo "paperclip-kill found=$pc_found left=$pc_left"')
    return "\n".join(lines)


_VERDICT = re.compile(r"^paperclip-kill found=(\d+) left=(\d+)$", re.MULTILINE)


def kill_confirmed(stdout: str) -> bool:
    """Whether a kill's output says nothing carrying the token is left."""
    match = _VERDICT.search(stdout)
    return match is not None and match.group(2) == "0"
