"""Large and non-ASCII execute output through the REAL Paperclip worker manager.

The result of an execute keeps the last 4 Mi characters of each stream (docs/protocol.md 3.7), so
the biggest answer the worker ever writes is 2 x 4 Mi characters of 4-byte UTF-8. It must reach the
host whole and exact, and the live chunks before it too: every ``execute.log`` the manager accepted,
concatenated per stream, is the output, and no chunk is over the host's 1,000,000 UTF-16 units.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.call_params import environment_call
from devtools.host_peer import HostPeer
from provider.driver.commands.output import DEFAULT_TAIL_LIMIT, LIVE_CHUNK_MAX, utf16_len
from provider.emulator import Emulator
from tests.host.peer_helpers import CALL_TIMEOUT_MS, DROPPED_LOG, LogSink

pytestmark = [pytest.mark.anyio, pytest.mark.host]

OVERSIZED_LINE = "dropping oversized worker line"


@dataclass
class Session:
    peer: HostPeer
    emulator: Emulator
    log_file: Path
    lease: dict[str, Any]

    def common(self) -> dict[str, Any]:
        return environment_call(
            self.emulator.base_url,
            "test-key",
            company_id="company-large",
            environment_id="env-large",
            timeoutMs=60_000,
        )

    async def execute(self, script: str, sink: LogSink) -> dict[str, Any]:
        params = {
            **self.common(),
            "lease": {**self.lease, "expiresAt": None},
            "command": "bash",
            "args": ["-c", script],
        }
        result: dict[str, Any] = await self.peer.call(
            "environmentExecute", params, timeout_ms=CALL_TIMEOUT_MS, on_log=sink
        )
        return result


@pytest.fixture
async def session(emulator: Emulator, tmp_path: Path) -> AsyncIterator[Session]:
    log_file = tmp_path / "peer.log"
    async with HostPeer(log_file=log_file, cwd=tmp_path) as peer:
        await peer.start_worker(auto_restart=False)
        placeholder = Session(peer, emulator, log_file, {})
        lease = await peer.call(
            "environmentAcquireLease",
            {**placeholder.common(), "runId": "run-large"},
            timeout_ms=CALL_TIMEOUT_MS,
        )
        running = Session(peer, emulator, log_file, lease)
        yield running
        await peer.call(
            "environmentReleaseLease",
            {
                **running.common(),
                "providerLeaseId": lease["providerLeaseId"],
                "leaseMetadata": lease["metadata"],
            },
            timeout_ms=CALL_TIMEOUT_MS,
        )
        await peer.stop_worker()


def _repeat(char: str, count: int, stream: str) -> str:
    """A shell pipeline printing ``char`` ``count`` times (no newline) on ``stream``."""
    size = len(char.encode()) * count
    redirect = " >&2" if stream == "stderr" else ""
    return f"yes {char} | tr -d '\\n' | head -c {size}{redirect}"


def _check_live(sink: LogSink, stream: str, expected: str) -> None:
    chunks = [chunk for s, chunk in sink.chunks if s == stream]
    assert chunks, f"no live {stream}"
    assert LIVE_CHUNK_MAX == 1_000_000  # the manager's MAX_EXECUTE_LOG_CHUNK_CHARS
    assert max(utf16_len(chunk) for chunk in chunks) <= LIVE_CHUNK_MAX
    joined = "".join(chunks)
    assert len(joined) == len(expected)
    assert joined == expected


@pytest.mark.parametrize("char", ["€", "😀"], ids=["3-byte", "4-byte"])
async def test_a_4_mi_character_non_ascii_result_per_stream_arrives_whole(
    session: Session, char: str
) -> None:
    count = DEFAULT_TAIL_LIMIT  # exactly the tail: the result carries all of it
    script = f"{_repeat(char, count, 'stdout')}; {_repeat(char, count, 'stderr')}"
    sink = LogSink()
    result = await session.execute(script, sink)
    expected = char * count
    assert result["exitCode"] == 0 and result["timedOut"] is False
    assert result["metadata"]["outputTruncated"] is False
    assert len(result["stdout"]) == count and result["stdout"] == expected
    assert len(result["stderr"]) == count and result["stderr"] == expected
    _check_live(sink, "stdout", expected)
    _check_live(sink, "stderr", expected)
    log = session.log_file.read_text(errors="replace")
    assert OVERSIZED_LINE not in log
    assert DROPPED_LOG not in log


async def test_live_chunks_are_large_ordered_and_exact_and_the_tail_is_kept(
    session: Session,
) -> None:
    # 6 Mi characters of stdout (2-byte, 1-byte and 4-byte text mixed), then stderr, then more
    # stdout with characters some line readers split on (CR, U+2028, U+2029, U+0085) and a NUL:
    # the result keeps the last 4 Mi per stream and says it truncated.
    line = "é✓x😀" * 16 + "\n"  # 65 code points, 81 UTF-16 units
    lines = 6 * 1024 * 1024 // len(line) + 1
    tricky = "tail\r\u2028\u2029\x85\x00end\n"
    script = (
        f"yes '{line[:-1]}' | head -n {lines}; sleep 0.5; echo between >&2; sleep 0.5; "
        "printf 'tail\\r\\xe2\\x80\\xa8\\xe2\\x80\\xa9\\xc2\\x85\\x00end\\n'"
    )
    sink = LogSink()
    result = await session.execute(script, sink)
    stdout = line * lines + tricky
    assert result["exitCode"] == 0
    assert result["metadata"]["outputTruncated"] is True
    assert result["stdout"] == stdout[-DEFAULT_TAIL_LIMIT:]
    assert result["stderr"] == "between\n"
    _check_live(sink, "stdout", stdout)
    _check_live(sink, "stderr", "between\n")
    # Order across streams is the order of arrival (the sleeps make the order of the two pipes
    # unambiguous): stderr's line comes after all the text before it and before the tail.
    streams = [s for s, _ in sink.chunks]
    switch = streams.index("stderr")
    assert "".join(c for _, c in sink.chunks[:switch]) == line * lines
    assert "".join(c for _, c in sink.chunks[switch + 1 :]) == tricky
    assert DROPPED_LOG not in session.log_file.read_text(errors="replace")
