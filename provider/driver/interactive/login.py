"""Login terminals (``loginPty*``, docs/protocol.md 6): an agent CLI's device login in a
120x30 pseudo-terminal of the lease's sandbox, relayed to the Paperclip UI.

The command is one of a closed map (the host has checked the key too); it runs with ``HOME``
(and ``CODEX_HOME`` / ``GROK_HOME``) pointing at the login's session home, which the same script
creates first (``mkdir -p -m 700``; on failure the terminal shows why and the session exits
125), so an open costs two requests: the process create and the output stream's connect, with
no start gate since the stream replays from ``after=0``. Output is decoded incrementally (UTF-8,
replacement) into ``loginPty.output`` chunks of at most 500,000 code points; after 8 Mi UTF-16
units the session is stopped (the host would end the route anyway). Input is text, typed into
the terminal as UTF-8 in 256 KiB requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from provider.createos.client import MAX_INPUT_BYTES
from provider.createos.models import DataFrame
from provider.driver.commands.output import StreamDecoder, utf16_cut, utf16_len
from provider.driver.commands.sandbox_text import quote
from provider.driver.core.params import (
    LoginInputParams,
    LoginOpenParams,
    LoginStopParams,
    RouteCloseParams,
)
from provider.driver.interactive.hub import Interactive, OpenTarget
from provider.driver.interactive.sessions import RemoteSession, start_process
from provider.errors import InvalidParams, RequestRefused
from provider.replies import AfterReply

KIND: Final = "login terminal"
PTY_SIZE: Final = (30, 120)  # rows, cols
CHUNK_CODE_POINTS: Final = 500_000
ROUTE_UNITS: Final = 8 * 1024 * 1024  # UTF-16 units the host accepts per route
MAX_INPUT_CHARS: Final = 8 * 1024 * 1024
SESSION_HOME_RE: Final = re.compile(
    r"^/tmp/paperclip-adapter-login/[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\Z"
)
# key -> (program, arguments, extra home variable)
COMMANDS: Final[dict[str, tuple[str, tuple[str, ...], str | None]]] = {
    "claude": ("claude", ("setup-token",), None),
    "codex": ("codex", ("login", "--device-auth"), "CODEX_HOME"),
    "grok": ("grok", ("login", "--device-auth"), "GROK_HOME"),
}


HOME_FAILED_EXIT: Final = 125  # the session home could not be created: the login never started


def login_script(key: str, home: str) -> str:
    """The ``bash -lc`` script of 6.1.2-3: create the session home (mode 700; else say so and
    exit 125), find the program (127), resolve an asdf shim while ``HOME`` is still the
    sandbox's, check it is executable (126), then ``exec`` it."""
    program, args, home_var = COMMANDS[key]
    homes = f"HOME={quote(home)}" + (f" {home_var}={quote(home)}" if home_var else "")
    failed = quote(f"Creating the login's session home {home} failed.")
    return "\n".join(
        [
            f"/bin/mkdir -p -m 700 -- {quote(home)} ||"
            f" {{ printf '%s\\n' {failed} >&2; exit {HOME_FAILED_EXIT}; }}",
            f"p=$(command -v -- {quote(program)}) || exit 127",
            "case $p in /*) ;; *) exit 127 ;; esac",
            "case $p in */.asdf/shims/*)",
            f'  r=$(asdf which {quote(program)} 2>/dev/null) && [ -n "$r" ] && p=$r',
            "  PATH=${p%/*}:$PATH ;;",
            "esac",
            '[ -f "$p" ] && [ -x "$p" ] || exit 126',
            f'exec env {homes} TERM=xterm-256color "$p" ' + " ".join(quote(arg) for arg in args),
        ]
    )


@dataclass(eq=False)
class LoginSession(RemoteSession):
    decoder: StreamDecoder = field(default_factory=StreamDecoder)
    forwarded_units: int = 0

    async def forward(self, frame: DataFrame) -> None:
        if frame.stream == "pty":  # other streams only advance the cursor (6.2)
            await self._emit(self.decoder.feed(frame.data))

    async def flush(self) -> None:
        await self._emit(self.decoder.flush())

    async def _emit(self, text: str) -> None:
        start = 0
        while start < len(text) and not self.kill_on_end:
            end = min(len(text), start + CHUNK_CODE_POINTS)
            room = ROUTE_UNITS - self.forwarded_units
            if utf16_len(text[start:end]) > room:
                end = utf16_cut(text, room, start)
                self.kill_on_end = True  # the route is full: stop the session (6.2)
            if end > start:
                chunk = text[start:end]
                self.forwarded_units += utf16_len(chunk)
                await self.notify(
                    "loginPty.output",
                    {
                        "hostRouteId": self.route_id,
                        "workerSessionId": self.session_id,
                        "chunk": chunk,
                    },
                )
            start = end

    async def send_exit(self) -> None:
        await self.notify(
            "loginPty.exit",
            {
                "hostRouteId": self.route_id,
                "workerSessionId": self.session_id,
                "exitCode": self.exit_code(),
            },
        )


def terminal_bytes(data: str) -> bytes:
    """Text as UTF-8, a lone surrogate (JSON can carry one) becoming U+FFFD."""
    try:
        return data.encode("utf-8")
    except UnicodeEncodeError:
        text = data.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return text.encode("utf-8")


class LoginTerminals:
    """The four ``loginPty*`` verbs."""

    def __init__(self, interactive: Interactive) -> None:
        self.interactive = interactive

    async def open(self, p: LoginOpenParams) -> AfterReply:
        if p.loginCommandKey not in COMMANDS:
            raise RequestRefused(
                "loginCommandKey must be one of: " + ", ".join(sorted(COMMANDS)) + "."
            )
        if not SESSION_HOME_RE.match(p.sessionHome):
            raise RequestRefused(
                "sessionHome must be /tmp/paperclip-adapter-login/ followed by a lower-case UUID."
            )
        target: OpenTarget = self.interactive.check_open(KIND, p, "loginPtyOpen")
        session = self.interactive.new_session(LoginSession, KIND, target, "pty")
        script = login_script(p.loginCommandKey, p.sessionHome)

        async def start(s: RemoteSession) -> None:
            await start_process(s, script=script, login=True, pty=PTY_SIZE)
            self.interactive.start_reader(s, target.window)  # replays from after=0: no gate

        return await self.interactive.open(
            session, target, start, {"workerSessionId": session.session_id}
        )

    def _live(self, session_id: str) -> RemoteSession:
        session = self.interactive.table.by_session(KIND, session_id)
        if session is None or not session.live:
            raise RequestRefused("This login terminal is not open (it ended or never existed).")
        return session

    async def input(self, p: LoginInputParams) -> None:
        session = self._live(p.workerSessionId)
        if len(p.data) > MAX_INPUT_CHARS:
            raise InvalidParams(f"A login input is limited to {MAX_INPUT_CHARS} characters.")
        data = terminal_bytes(p.data)
        async with session.input_lock:
            if not session.live:
                raise RequestRefused("This login terminal ended while the input waited.")
            assert session.process_id is not None
            for start in range(0, len(data), MAX_INPUT_BYTES):
                await session.client.write_input(
                    session.scope.lease_id,
                    session.process_id,
                    data[start : start + MAX_INPUT_BYTES],
                )
        return None

    async def stop(self, p: LoginStopParams) -> None:
        session = self.interactive.table.by_session(KIND, p.workerSessionId)
        if session is not None and not session.opening:
            await session.stop()
        return None

    async def close(self, p: RouteCloseParams) -> dict[str, Any]:
        session = self.interactive.table.by_route(KIND, p.hostRouteId)
        if session is not None:
            await self.interactive.close(session)
        return {"hostRouteId": p.hostRouteId}
