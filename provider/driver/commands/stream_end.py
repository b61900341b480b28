"""Finding a streamed command's end marker in its output (docs/protocol.md 3.9).

The wrapper (:mod:`provider.driver.commands.command_script`) ends each of stdout and stderr with
``<tag><status>\\n`` when the command's leader exits. :class:`EndScanner` reads one stream's decoded
text as it comes, passes on everything before the marker, holds back only a tail that could be
the start of it (so a marker split across frames is still found and never shown), and reports
the status. What arrives after the marker (a background child's later writes) is dropped, as a
managed process's journal would drop it unread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provider.createos.errors import MalformedFrame

MAX_STATUS_CHARS = 32
_STATUS = re.compile(r"exit=\d{1,3}|signal=\d{1,2}|timeout(=\d{1,6})?|cancelled|lost")

# Linux signal numbers (the sandbox's kernel), whatever the worker's own platform numbers them.
LINUX_SIGNALS = {
    1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT",
    7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
    13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM", 16: "SIGSTKFLT", 17: "SIGCHLD",
    18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU", 23: "SIGURG",
    24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO",
    30: "SIGPWR", 31: "SIGSYS",
}  # fmt: skip


@dataclass(frozen=True)
class EndStatus:
    """How the leader ended, as its wrapper saw it."""

    kind: str  # "exit", "signal", "timeout", "cancelled" or "lost"
    code: int | None = None  # for "timeout": how many processes the wrapper's kill left

    @property
    def signal_name(self) -> str:
        assert self.kind == "signal" and self.code is not None
        return LINUX_SIGNALS.get(self.code, f"SIG{self.code}")

    @classmethod
    def parse(cls, text: str) -> EndStatus:
        if not _STATUS.fullmatch(text):
            raise MalformedFrame("A streamed command ended with an unreadable status.")
        kind, _, code = text.partition("=")
        return cls(kind, int(code) if code else None)


class EndScanner:
    """One stream's text in, the text to keep out, until the marker (module docstring)."""

    def __init__(self, tag: str) -> None:
        self._tag = tag
        self._held = ""
        self._status: str | None = None  # the text after the tag, while it is being read
        self.end: EndStatus | None = None

    def feed(self, text: str) -> str:
        """The part of ``text`` that is the command's output; sets :attr:`end` at the marker."""
        if self.end is not None:
            return ""
        if self._status is not None:
            return self._read_status(text)
        text = self._held + text
        self._held = ""
        at = text.find(self._tag)
        if at >= 0:
            self._status = ""
            self._read_status(text[at + len(self._tag) :])
            return text[:at]
        keep = self._partial_tag(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At a stream's end without a marker: what was held back was output after all."""
        held, self._held = self._held, ""
        return held

    def _read_status(self, text: str) -> str:
        assert self._status is not None
        line, newline, _ = text.partition("\n")
        self._status += line
        if len(self._status) > MAX_STATUS_CHARS:
            raise MalformedFrame("A streamed command ended with an unreadable status.")
        if newline:
            self.end = EndStatus.parse(self._status)
        return ""

    def _partial_tag(self, text: str) -> int:
        """The length of the longest tail of ``text`` that begins the tag."""
        first = self._tag[0]
        start = max(0, len(text) - len(self._tag) + 1)
        while (at := text.find(first, start)) >= 0:
            if self._tag.startswith(text[at:]):
                return len(text) - at
            start = at + 1
        return 0
