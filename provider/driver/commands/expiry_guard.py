"""The expiry guard's script text: a sandbox that deletes itself at its lease's deadline.

A lease acquired with ``requestedExpiresAt`` (:mod:`provider.driver.leases.expiry`) starts this
guard in the same ``exec`` that prepares the workspace, before anything else runs there. The
guard is bash only (the image may have no curl): a ``setsid``'d, double-forked loop (so it
outlives the exec, belongs to no exec's session and carries no command token, which the warm
release's sweep would kill) that sleeps in steps of at most :data:`STEP_SECONDS`, re-reading the
clock each time (a sandbox paused and resumed past its deadline fires at once), then asks the
in-guest agent (``POST /self/delete?reason=lease-expired`` on ``127.0.0.1:1029`` over bash's
``/dev/tcp``) to delete the sandbox, and asks again every :data:`RETRY_SECONDS` until it is gone.

"Confirmed" means, in that one exec: the guard wrote its pid file, ``/proc/<pid>`` exists, and
the agent answers a harmless probe (``GET /``) with an HTTP status line. The exec exits
:data:`GUARD_NOT_RUNNING` or :data:`AGENT_UNREACHABLE` otherwise (the guard is killed then).
"""

from __future__ import annotations

import shlex

from provider.driver.core.runtime import ROOT

AGENT = "127.0.0.1/1029"
PID_FILE = f"{ROOT}/.paperclip-runtime/expiry-guard.pid"
STEP_SECONDS = 5
RETRY_SECONDS = 2
GUARD_NOT_RUNNING = 97
AGENT_UNREACHABLE = 98

_REQUEST = "{method} {path} HTTP/1.1\\r\\nHost: 127.0.0.1:1029\\r\\nContent-Length: 0\\r\\n" + (
    "Connection: close\\r\\n\\r\\n"
)


def _ask(method: str, path: str, answer: str) -> str:
    """A subshell that sends one request to the agent and succeeds when the status line matches
    ``answer`` (a bash pattern). In a subshell: a refused ``exec 3<>`` ends only it."""
    request = _REQUEST.format(method=method, path=path)
    return (
        f"( exec 3<>/dev/tcp/{AGENT} && printf '{request}' >&3 && "
        f"IFS= read -r -t 5 line <&3 && [[ $line == {answer} ]] ) 2>/dev/null"
    )


GUARD = f"""d=$1; p=$2
echo $$ > "$p.tmp" && mv -f "$p.tmp" "$p"
while :; do
  printf -v now '%(%s)T' -1
  (( now >= d )) && break
  s=$(( d - now )); (( s > {STEP_SECONDS} )) && s={STEP_SECONDS}
  sleep "$s"
done
while :; do
  {_ask("POST", "/self/delete?reason=lease-expired", "'HTTP/1.'?' 2'*")}
  sleep {RETRY_SECONDS}
done
"""
"""The guard's body, run as ``bash -c GUARD expiry-guard <deadline epoch s> <pid file>``."""


def start_and_confirm(deadline_epoch: int) -> str:
    """Script lines (for ``bash -lc``) that start the guard for ``deadline_epoch`` and confirm
    it runs (module docstring); appended to the workspace-preparing exec."""
    pid = shlex.quote(PID_FILE)
    return f"""
rm -f -- {pid}
( setsid bash -c {shlex.quote(GUARD)} expiry-guard {int(deadline_epoch)} {pid} \
</dev/null >/dev/null 2>&1 & )
for (( i = 0; i < 100; i++ )); do [[ -s {pid} ]] && break; sleep 0.05; done
IFS= read -r gpid < {pid} 2>/dev/null && [[ -d /proc/$gpid ]] || exit {GUARD_NOT_RUNNING}
if ! {_ask("GET", "/", "'HTTP/1.'*")}; then kill "$gpid"; exit {AGENT_UNREACHABLE}; fi
printf '%s' "$gpid"
"""
