"""The real ``python -m provider`` process: end of input, shutdown, signals, fd 1 guard."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from provider.app import build_dispatcher
from provider.rpc.wire import INVALID_PARAMS, PARSE_ERROR

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 20.0  # generous: these tests assert that things happen, not how fast


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


INITIALIZE = _line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})


def _spawn(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        stdin=kwargs.pop("stdin", subprocess.PIPE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def _read_message(stream: IO[bytes] | None) -> dict[str, Any]:
    assert stream is not None
    ready, _, _ = select.select([stream], [], [], HANG_GUARD_S)
    assert ready, "the worker did not answer"
    message: dict[str, Any] = json.loads(stream.readline())
    return message


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()


def test_end_of_input_exits_zero_after_answering_what_was_read() -> None:
    proc = _spawn("-m", "provider")
    health = _line({"jsonrpc": "2.0", "id": 2, "method": "health", "params": {}})
    out, err = proc.communicate(INITIALIZE + health, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    replies = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[1]["result"] == {"status": "ok"}


def test_shutdown_replies_null_and_exits_zero_while_stdin_stays_open() -> None:
    with _spawn("-m", "provider") as proc:
        _send(proc, INITIALIZE)
        assert _read_message(proc.stdout)["result"]["ok"] is True
        _send(proc, _line({"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": {}}))
        assert _read_message(proc.stdout) == {"jsonrpc": "2.0", "id": 2, "result": None}
        assert proc.wait(timeout=HANG_GUARD_S) == 0


def test_sigterm_exits_zero() -> None:
    with _spawn("-m", "provider") as proc:
        _send(proc, INITIALIZE)
        assert _read_message(proc.stdout)["result"]["ok"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_GUARD_S) == 0


def test_a_request_line_of_several_mebibytes_is_answered() -> None:
    big = {"config": {"shape": "s-1vcpu-1gb", "archiveOnRelease": "x" * (3 * 1024 * 1024)}}
    request = {"jsonrpc": "2.0", "id": 2, "method": "environmentValidateConfig", "params": big}
    proc = _spawn("-m", "provider")
    out, err = proc.communicate(INITIALIZE + _line(request), timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    replies = [json.loads(line) for line in out.splitlines()]
    assert replies[1]["result"]["ok"] is True


def test_stray_output_never_reaches_the_protocol_stream() -> None:
    proc = _spawn("-m", "tests.rpc.stray_output_worker")
    probe = _line({"jsonrpc": "2.0", "id": 2, "method": "environmentProbe", "params": {}})
    out, err = proc.communicate(INITIALIZE + probe, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2]
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in lines)
    stderr = err.decode()
    for text in (
        "stray print at start-up",
        "stray print from a handler",
        "stray sys.stdout.write",
        "stray os.write to fd 1",
        "stray output of a child process",
    ):
        assert text in stderr


def test_exits_at_once_when_the_shim_is_already_gone() -> None:
    # The shim passes its pid; a different parent means the shim died before prctl took hold.
    proc = _spawn("-m", "provider", env={"PAPERCLIP_CREATEOS_SHIM_PID": "1"})
    health = _line({"jsonrpc": "2.0", "id": 2, "method": "health", "params": {}})
    out, _ = proc.communicate(INITIALIZE + health, timeout=HANG_GUARD_S)
    assert proc.returncode == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == [1]  # health never served


def test_worker_dies_with_its_parent_even_while_stdin_stays_open() -> None:
    # The parent holds no pipe of the worker's: only PR_SET_PDEATHSIG can end it.
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    parent_code = (
        "import os, subprocess, sys, time\n"
        "env = {**os.environ, 'PAPERCLIP_CREATEOS_SHIM_PID': str(os.getpid())}  # as the shim\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'provider'], stdin={stdin_read}, "
        f"stdout={stdout_write}, env=env)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        pass_fds=(stdin_read, stdout_write),
    )
    os.close(stdin_read)
    os.close(stdout_write)
    try:
        assert parent.stdout is not None
        worker_pid = int(parent.stdout.readline())
        os.write(stdin_write, INITIALIZE)
        with os.fdopen(stdout_read, "rb") as worker_out:
            assert _read_message(worker_out)["result"]["ok"] is True  # up and serving
            parent.kill()
            parent.wait(timeout=HANG_GUARD_S)
            deadline = time.monotonic() + HANG_GUARD_S
            while _alive(worker_pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not _alive(worker_pid)
    finally:
        os.close(stdin_write)
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=HANG_GUARD_S)
        if parent.stdout is not None:
            parent.stdout.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _exchange(*messages: bytes) -> list[dict[str, Any]]:
    proc = _spawn("-m", "provider")
    out, err = proc.communicate(b"".join(messages), timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_initialize_then_more_requests_in_one_write_are_all_answered_in_order() -> None:
    health = _line({"jsonrpc": "2.0", "id": 2, "method": "health", "params": {}})
    again = _line({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}})
    lines = _exchange(INITIALIZE + health + again)
    replies = [line for line in lines if "method" not in line]
    assert [r["id"] for r in replies] == [1, 2, 3]
    logged = [line["params"] for line in lines if line.get("method") == "log"]
    assert logged == [  # a caller's mistake: logged once, at warn
        {"level": "warn", "message": "initialize: " + replies[2]["error"]["message"]}
    ]
    assert replies[0]["result"]["supportedMethods"] == list(build_dispatcher().supported_methods)
    assert replies[1]["result"] == {"status": "ok"}
    assert "already initialized" in replies[2]["error"]["message"]


def test_a_first_line_other_than_initialize_is_left_to_the_dispatcher() -> None:
    health = _line({"jsonrpc": "2.0", "id": 1, "method": "health", "params": {}})
    init = _line({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {}})
    replies = _exchange(health, init)
    assert replies[0]["id"] == 1
    assert "not been initialized" in replies[0]["error"]["message"]
    assert replies[1]["result"]["ok"] is True


def test_a_malformed_first_line_gets_a_parse_error_and_initialize_still_works() -> None:
    replies = _exchange(b"{oops\n", INITIALIZE)
    assert replies[0] == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": PARSE_ERROR, "message": "Parse error: line is not valid JSON"},
    }
    assert replies[1]["result"]["ok"] is True


def test_initialize_without_object_params_is_refused_by_the_dispatcher() -> None:
    replies = _exchange(_line({"jsonrpc": "2.0", "id": 1, "method": "initialize"}), INITIALIZE)
    assert replies[0]["error"]["code"] == INVALID_PARAMS
    assert replies[1]["result"]["ok"] is True
