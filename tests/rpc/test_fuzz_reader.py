"""Hostile input for the JSON-RPC reader and dispatcher.

Regression tests for what a fuzz run found, then hypothesis fuzzing of whole input streams
(malformed JSON, huge lines, wrong types, unknown methods, duplicate ids, responses to nothing,
notifications, non-UTF-8 bytes, CR/CRLF line ends, blank lines), in process and against a real
``python -m provider``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from provider.rpc import wire
from provider.rpc.handshake import initialize_request_id

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120.0


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _run_worker(data: bytes, state_dir: Path) -> tuple[list[dict[str, Any]], int, bytes]:
    """Feed ``data`` to a real worker, close its input; (replies, exit code, stderr)."""
    env = {**os.environ, "XDG_STATE_HOME": str(state_dir)}
    proc = subprocess.run(
        [sys.executable, "-m", "provider"],
        cwd=REPO_ROOT,
        input=data,
        capture_output=True,
        env=env,
        timeout=HANG_GUARD_S,
        check=False,
    )
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    return replies, proc.returncode, proc.stderr


# --- regressions ---------------------------------------------------------------------------------

DEEP = 5000  # well past the interpreter's recursion limit (1000)


def test_deeply_nested_json_is_a_parse_error_not_a_crash() -> None:
    for line in (b"[" * DEEP, b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP):
        message = wire.decode_line(line)
        assert isinstance(message, wire.Invalid)
        assert (message.code, message.id) == (wire.PARSE_ERROR, None)
    assert initialize_request_id(b"[" * DEEP) is None  # left to the dispatcher


def test_a_deeply_nested_line_does_not_kill_the_worker(tmp_path: Path) -> None:
    # Found by the fuzz below: msgspec raises RecursionError (not DecodeError) past the
    # recursion limit, which escaped the read loop and ended the process with code 1.
    init = _line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    nested_params = (
        b'{"jsonrpc":"2.0","id":3,"method":"health","params":{"x":'
        + b"[" * DEEP
        + b"]" * DEEP
        + b"}}\n"
    )
    health = _line({"jsonrpc": "2.0", "id": 4, "method": "health", "params": {}})
    data = b"[" * DEEP + b"\n" + init + nested_params + health
    replies, code, stderr = _run_worker(data, tmp_path)
    assert code == 0, stderr.decode(errors="replace")[-2000:]
    assert [r["id"] for r in replies] == [None, 1, None, 4]
    assert [r.get("error", {}).get("code") for r in replies] == [-32700, None, -32700, None]
    assert replies[3]["result"] == {"status": "ok"}
