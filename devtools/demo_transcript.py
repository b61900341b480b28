"""The demo's readable transcript: numbered steps with timings, live output, a summary.

Every line goes through :meth:`Transcript.print`, which replaces each registered secret (the API
key) with ``***`` and flushes, so a piped transcript shows output as it happens and never a key.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

LABEL_WIDTH = 14
REDACTED = "***"


@dataclass
class StepRecord:
    number: int
    title: str
    seconds: float = 0.0
    ok: bool = False
    started: float = 0.0


class Transcript:
    """Prints the demo as it runs and keeps the per-step timings for the summary."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.steps: list[StepRecord] = []
        self.started = time.perf_counter()
        self._secrets: list[str] = []
        self._current: StepRecord | None = None

    def add_secret(self, secret: str) -> None:
        if secret and secret not in self._secrets:
            self._secrets.append(secret)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def print(self, text: str = "") -> None:
        print(self.redact(text), file=self.out, flush=True)

    def banner(self, title: str, rows: list[tuple[str, str]]) -> None:
        self.print(title)
        self.print("=" * len(title))
        for label, value in rows:
            self.print(f"  {label:<{LABEL_WIDTH}}{value}")
        self.print()

    @contextmanager
    def step(self, title: str) -> Iterator[StepRecord]:
        """One numbered step: header now, ``done in`` or ``FAILED`` with its time when it ends."""
        record = StepRecord(number=len(self.steps) + 1, title=title)
        self.steps.append(record)
        self._current = record
        self.print(f"[{record.number:>2}] {title}")
        record.started = time.perf_counter()
        try:
            yield record
        except BaseException as exc:
            record.seconds = time.perf_counter() - record.started
            cancelled = isinstance(exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt)
            reason = "interrupted" if cancelled else str(exc) or type(exc).__name__
            self.print(f"     FAILED after {record.seconds:.2f} s: {reason}")
            self.print()
            raise
        finally:
            self._current = None
        record.seconds = time.perf_counter() - record.started
        record.ok = True
        self.print(f"     done in {record.seconds:.2f} s")
        self.print()

    def detail(self, label: str, value: Any) -> None:
        """An indented ``label  value`` line under the current step."""
        text = value if isinstance(value, str) else repr(value)
        self.print(f"     {label:<{LABEL_WIDTH}}{text}")

    def note(self, text: str) -> None:
        self.print(f"     {text}")

    def live(self, stream: str, chunk: str) -> None:
        """A live output chunk as it arrives, each line stamped with the time into the step."""
        since = time.perf_counter() - (self._current.started if self._current else self.started)
        lines = chunk.splitlines() or [""]
        for line in lines:
            self.print(f"     +{since:5.2f}s {stream:<6} | {line}")

    @property
    def total_seconds(self) -> float:
        return time.perf_counter() - self.started

    def summary(self, *, ok: bool, facts: list[tuple[str, str]]) -> None:
        title = "Summary: every step passed" if ok else "Summary: the demo FAILED"
        self.print(title)
        self.print("-" * len(title))
        width = max((len(step.title) for step in self.steps), default=10) + 2
        for step in self.steps:
            status = "ok" if step.ok else "FAILED"
            self.print(f"  {step.number:>2}. {step.title:<{width}}{step.seconds:7.2f} s  {status}")
        self.print(f"      {'total wall time':<{width}}{self.total_seconds:7.2f} s")
        for label, value in facts:
            self.print(f"  {label:<{LABEL_WIDTH}}{value}")
