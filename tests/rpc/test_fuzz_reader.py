"""Hostile input for the JSON-RPC reader and dispatcher.

Regression tests for what a fuzz run found, then hypothesis fuzzing of whole input streams
(malformed JSON, huge lines, wrong types, unknown methods, duplicate ids, responses to nothing,
notifications, non-UTF-8 bytes, CR/CRLF line ends, blank lines), in process and against a real
``python -m provider``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService
from provider.errors import ProviderError
from provider.rpc import wire
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.handshake import initialize_request_id
from provider.verbs import LEASE_VERBS
from tests.rpc.harness import MemoryByteReceiveStream, MemoryByteSendStream

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
    assert [r.get("error", {}).get("code") for r in replies] == [
        wire.PARSE_ERROR,
        None,
        wire.PARSE_ERROR,
        None,
    ]
    assert replies[3]["result"] == {"status": "ok"}


# --- fuzzing -------------------------------------------------------------------------------------
#
# A case is a list of frames. Each frame is one input line built so that its expected outcome is
# known by construction (an independent oracle, not the worker's own classifier):
#   request  -> exactly one response carrying that id (result or any non-framing error);
#   silent   -> no response (blank line, notification, response to a request we never sent);
#   invalid  -> exactly one -32600 response, id null or the frame's own id;
#   parse    -> exactly one -32700 response with id null.


@dataclass(frozen=True)
class Frame:
    data: bytes
    kind: str
    id: Any = None
    tag: str = ""  # what the frame exercises, for the tally


KNOWN_METHODS = (
    "health",
    "configChanged",
    "initialize",
    "validateConfig",
    "onEvent",
    "environmentCancel",
    "config.get",
    "log",
    "execute.log",
    "Health",
    "shutdown ",
    *LEASE_VERBS,
)

leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)
json_value = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
containers = st.lists(json_value, max_size=3) | st.dictionaries(
    st.text(max_size=3), leaf, max_size=2
)
non_object = leaf | st.lists(json_value, max_size=4)
not_null_nor_object = (
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
    | st.lists(json_value, max_size=3)
)
not_string = st.none() | st.booleans() | st.integers() | containers
valid_id = st.integers(-(2**53), 2**53) | st.text(max_size=12) | st.sampled_from([0, 1, "1", ""])
bad_id = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(leaf, max_size=2)
    | st.dictionaries(st.text(max_size=3), leaf, max_size=2)
)
method_name = (st.sampled_from(KNOWN_METHODS) | st.text(min_size=1, max_size=24)).filter(
    lambda m: m != "shutdown"  # a real shutdown ends the stream: covered by its own tests
)


def driver_params(*, allow_company: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Environment-call shaped params with hostile types. Without ``allow_company`` the
    ``companyId`` is never a string, so no call can get as far as the network."""
    company = json_value if allow_company else not_string
    config = st.fixed_dictionaries(
        {},
        optional={
            "apiUrl": json_value | st.sampled_from(["http://127.0.0.1:9/v1", "file:///x"]),
            "apiKey": json_value,
            "shape": json_value | st.just("s-1vcpu-1gb"),
            "timeoutMs": json_value,
            "reuseLease": json_value,
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "driverKey": json_value | st.just("createos"),
            "companyId": company,
            "environmentId": json_value,
            "config": config | json_value,
            "lease": json_value,
            "providerLeaseId": json_value,
            "command": json_value,
            "args": json_value,
            "env": st.dictionaries(st.text(max_size=8), json_value, max_size=3) | json_value,
            "operations": json_value,
            "timeoutMs": json_value,
        },
    )


def encode(obj: Any, ascii_only: bool) -> bytes:
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8")


@st.composite
def request_frame(draw: st.DrawFn, *, allow_company: bool) -> Frame:
    request_id = draw(valid_id)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": draw(method_name)}
    params = draw(st.sampled_from(["omit", "any", "driver", "driver"]))
    if params == "any":
        message["params"] = draw(json_value)
        if not allow_company and isinstance(message["params"], dict):
            message["params"].pop("companyId", None)
    elif params == "driver":
        message["params"] = draw(driver_params(allow_company=allow_company))
    if draw(st.booleans()):
        message["paperclipInvocation"] = draw(
            json_value | st.fixed_dictionaries({"id": json_value | st.text(max_size=8)})
        )
    return Frame(encode(message, draw(st.booleans())), "request", request_id)


@st.composite
def silent_frame(draw: st.DrawFn) -> Frame:
    shape = draw(st.sampled_from(["blank", "notification", "result", "error"]))
    if shape == "blank":
        return Frame(
            draw(st.sampled_from([b"", b" ", b"\t \t", b"\r", b"  \r"])), "silent", tag=shape
        )
    if shape == "notification":
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": draw(method_name)}
        if draw(st.booleans()):
            message["params"] = draw(json_value)
    elif shape == "result":
        message = {"jsonrpc": "2.0", "id": draw(valid_id), "result": draw(json_value)}
    else:
        error = draw(st.none() | st.dictionaries(st.text(max_size=8), json_value, max_size=3))
        message = {"jsonrpc": "2.0", "id": draw(valid_id), "error": error}
    return Frame(encode(message, draw(st.booleans())), "silent", tag=shape)


@st.composite
def invalid_frame(draw: st.DrawFn) -> Frame:
    shape = draw(
        st.sampled_from(
            ["top", "version", "method", "request-id", "response-id", "error-type", "neither"]
        )
    )
    if shape == "top":
        return Frame(encode(draw(non_object), True), "invalid", tag=shape)
    request_id = draw(valid_id)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": draw(method_name)}
    if shape == "version":
        version = draw(st.sampled_from(["omit", "1.0", 2.0, 2, None, "2.0 ", "2"]))
        if version == "omit":
            del message["jsonrpc"]
        else:
            message["jsonrpc"] = version
    elif shape == "method":
        message["method"] = draw(st.just("") | not_string)
        if draw(st.booleans()):
            del message["id"]
    elif shape == "request-id":
        message["id"] = draw(bad_id)
        request_id = None
    elif shape == "response-id":
        del message["method"]
        message["result"] = draw(json_value)
        if draw(st.booleans()):
            message["id"] = draw(bad_id)
        else:
            del message["id"]
        request_id = None
    elif shape == "error-type":
        del message["method"]
        message["error"] = draw(not_null_nor_object)
    else:
        del message["method"]
        message.update(draw(st.dictionaries(st.sampled_from(["params", "x", "ID"]), json_value)))
    return Frame(encode(message, draw(st.booleans())), "invalid", request_id, tag=shape)


@st.composite
def parse_frame(draw: st.DrawFn) -> Frame:
    shape = draw(
        st.sampled_from(["truncated", "utf8", "control", "garbage", "deep", "lone-cr", "trailing"])
    )
    health = {"jsonrpc": "2.0", "id": draw(valid_id), "method": "health", "params": {}}
    text = encode(health, draw(st.booleans()))
    if shape == "truncated":
        return Frame(text[: draw(st.integers(1, len(text) - 1))], "parse", tag=shape)
    if shape == "utf8":  # a byte sequence that is not UTF-8, inside a string or between tokens
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"]))
        where = draw(st.sampled_from([b'"health"', b'"params"', b","]))
        return Frame(text.replace(where, where[:-1] + bad + where[-1:], 1), "parse", tag=shape)
    if shape == "control":  # a raw control character inside a string
        char = draw(st.sampled_from([b"\x00", b"\x01", b"\x1f", b"\t", b"\x7f\x00"]))
        return Frame(text.replace(b'"health"', b'"hea' + char + b'lth"', 1), "parse", tag=shape)
    if shape == "garbage":
        junk = draw(st.binary(max_size=64)).replace(b"\n", b" ")
        return Frame(
            draw(st.sampled_from([b"x", b"}", b"\x00", b"\xff", b"{'"])) + junk, "parse", tag=shape
        )
    if shape == "deep":
        depth = draw(st.integers(2000, 200_000))
        nested = draw(
            st.sampled_from(
                [
                    b"[" * depth,
                    b"[" * depth + b"]" * depth,
                    b'{"a":' * depth + b"0" + b"}" * depth,
                    text[:-1] + b',"x":' + b"[" * depth + b"]" * depth + b"}",
                ]
            )
        )
        return Frame(nested, "parse", tag=shape)
    if shape == "lone-cr":  # only LF ends a line: a lone CR leaves both texts on one line
        return Frame(text + b"\r" + text, "parse", tag=shape)
    return Frame(text + draw(st.sampled_from([b"}", b" x", b"{}", b"null"])), "parse", tag=shape)


@st.composite
def huge_frame(draw: st.DrawFn) -> Frame:
    """A line of several MiB: a request (answered), or an unterminated one (a parse error)."""
    size = draw(st.sampled_from([(64 << 10) + 1, 1 << 20, 3 << 20, 9 << 20]))
    request_id = draw(valid_id)
    method = draw(st.sampled_from(["health", "environmentValidateConfig", "noSuchMethod"]))
    pad = "y" * size
    params = {"config": {"shape": pad}} if method == "environmentValidateConfig" else {"pad": pad}
    text = encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, True)
    if not draw(st.booleans()):  # the simplest draw (False) is the answered request
        return Frame(text, "request", request_id, tag="huge")
    return Frame(text[:-2], "parse", tag="huge")


def frames(*, allow_company: bool) -> st.SearchStrategy[Frame]:
    return st.one_of(
        request_frame(allow_company=allow_company),
        request_frame(allow_company=allow_company),
        silent_frame(),
        invalid_frame(),
        parse_frame(),
    )


@dataclass(frozen=True)
class Case:
    frames: list[Frame]
    data: bytes


FINAL_ID = "final-health-check-after-the-fuzz"  # longer than any generated id


@st.composite
def cases(draw: st.DrawFn, *, allow_company: bool, min_size: int, max_size: int) -> Case:
    items = draw(
        st.lists(frames(allow_company=allow_company), min_size=min_size, max_size=max_size)
    )
    if draw(st.integers(0, 3)) == 0:
        items.insert(draw(st.integers(0, len(items))), draw(huge_frame()))
    final = encode({"jsonrpc": "2.0", "id": FINAL_ID, "method": "health", "params": {}}, True)
    items.append(Frame(final, "request", FINAL_ID))
    ends = [draw(st.sampled_from([b"\n", b"\n", b"\r\n"])) for _ in items]
    ends[-1] = draw(st.sampled_from([b"\n", b"\r\n", b""]))  # the last line may end at EOF
    return Case(items, b"".join(frame.data + end for frame, end in zip(items, ends, strict=True)))


def _key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)


def check_replies(case: Case, replies: list[dict[str, Any]]) -> None:
    """Every request answered exactly once, framing errors counted, nothing else said but the
    one ``log`` line each failed request gets."""
    assert all(reply.get("jsonrpc") == "2.0" for reply in replies)
    assert all(reply.get("method") in (None, "log") for reply in replies)
    replies = [reply for reply in replies if "method" not in reply]
    codes = [reply["error"]["code"] if "error" in reply else None for reply in replies]
    parse = [r for r, code in zip(replies, codes, strict=True) if code == wire.PARSE_ERROR]
    invalid = [r for r, code in zip(replies, codes, strict=True) if code == wire.INVALID_REQUEST]
    answers = [
        r
        for r, c in zip(replies, codes, strict=True)
        if c not in (wire.PARSE_ERROR, wire.INVALID_REQUEST)
    ]
    kinds = Counter(frame.kind for frame in case.frames)
    assert len(parse) == kinds["parse"]
    assert all(reply["id"] is None for reply in parse)
    assert len(invalid) == kinds["invalid"]
    invalid_ids = {_key(f.id) for f in case.frames if f.kind == "invalid" and f.id is not None}
    assert all(r["id"] is None or _key(r["id"]) in invalid_ids for r in invalid)
    expected = Counter(_key(f.id) for f in case.frames if f.kind == "request")
    assert Counter(_key(reply["id"]) for reply in answers) == expected
    for reply in answers:
        assert ("result" in reply) != ("error" in reply)
    final = [reply for reply in answers if reply["id"] == FINAL_ID]
    assert [reply.get("result") for reply in final] == [{"status": "ok"}]


# Frames run, by mode and kind; written to $FUZZ_REPORT (JSON) at the end when it is set.
FRAMES_RUN: Counter[str] = Counter()


def _tally(mode: str, case: Case) -> None:
    FRAMES_RUN[f"{mode}:cases"] += 1
    for frame in case.frames:
        FRAMES_RUN[f"{mode}:{frame.kind}"] += 1
        if frame.tag:
            FRAMES_RUN[f"{mode}:{frame.kind}:{frame.tag}"] += 1
    ids = Counter(_key(f.id) for f in case.frames if f.kind == "request")
    FRAMES_RUN[f"{mode}:duplicate-id requests"] += sum(n for n in ids.values() if n > 1)
    report = os.environ.get("FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(dict(sorted(FRAMES_RUN.items())), indent=1))


def _no_network(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
    raise ProviderError("the fuzz runs without a CreateOS endpoint")


async def _serve_in_process(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The real dispatcher and driver table on memory streams: feed, close, collect."""
    to_worker, worker_input = anyio.create_memory_object_stream[bytes](math.inf)
    worker_output, from_worker = anyio.create_memory_object_stream[bytes](math.inf)
    for chunk in chunks:
        to_worker.send_nowait(chunk)
    to_worker.close()
    runtime = DriverRuntime(client_factory=_no_network, environ={}, journal=LeaseJournal(None))
    holder: list[Dispatcher] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        await holder[0].notify(method, params)

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        await holder[0].log(level, message, meta)

    service = DriverService(runtime, notify=notify, log=log)
    dispatcher = Dispatcher(service.table(), on_shutdown=service.shutdown, initialized=True)
    holder.append(dispatcher)
    with anyio.fail_after(HANG_GUARD_S):
        await dispatcher.serve(
            MemoryByteReceiveStream(worker_input), MemoryByteSendStream(worker_output)
        )
    worker_input.close()
    worker_output.close()
    with from_worker:
        data = b"".join([chunk async for chunk in from_worker])
    return [json.loads(line) for line in data.splitlines()]


def _chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def fuzz_settings(examples_variable: str, default: int) -> settings:
    return settings(
        max_examples=int(os.environ.get(examples_variable, str(default))),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


@fuzz_settings("RPC_FUZZ_EXAMPLES", 500)
@given(
    case=cases(allow_company=True, min_size=1, max_size=25),
    chunk_size=st.sampled_from([1, 7, 64, 4096, 1 << 16, 1 << 30]),
)
def test_in_process_every_request_is_answered_once_and_the_reader_survives(
    case: Case, chunk_size: int
) -> None:
    if len(case.data) > 1 << 16:
        chunk_size = max(chunk_size, 4096)  # MiB lines in 1-byte chunks only measure the test
    replies = anyio.run(_serve_in_process, _chunked(case.data, chunk_size))
    check_replies(case, replies)
    _tally("in-process", case)


@fuzz_settings("RPC_FUZZ_PROCESS_EXAMPLES", 20)
@given(case=cases(allow_company=False, min_size=40, max_size=120))
def test_real_worker_answers_every_request_once_and_exits_cleanly(
    case: Case, tmp_path_factory: Any
) -> None:
    state = tmp_path_factory.mktemp("state")
    init = _line({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}})
    env_key = os.environ.pop("CREATEOS_API_KEY", None)  # no key: nothing can reach a network
    try:
        replies, code, stderr = _run_worker(init + case.data, state)
    finally:
        if env_key is not None:
            os.environ["CREATEOS_API_KEY"] = env_key
    assert code == 0, stderr.decode(errors="replace")[-3000:]
    assert replies[0]["id"] == "init" and replies[0]["result"]["ok"] is True
    check_replies(case, replies[1:])
    _tally("process", case)
