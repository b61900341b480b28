"""A lone UTF-16 surrogate escape in a request is answered under the request's id.

Node writes an emoji cut in two as a lone ``\\ud83d`` escape. msgspec refuses such a line, and
the worker used to answer ``-32700`` with id null, so the host waited for its own timeout (330 s
for an execute with the default config). Real lines, written byte for byte as Node writes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provider.driver.core.text_params import lone_surrogate_policy
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.wire import INVALID_PARAMS, METHOD_NOT_FOUND, PARSE_ERROR
from tests.rpc.harness import serving

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parents[2]
CUT = "\\ud83d"  # the JSON escape Node writes for the first half of an emoji, alone


def request_line(request_id: Any, method: str, params_json: str) -> bytes:
    """A request line with ``params_json`` spliced in verbatim (json.dumps cannot write a lone
    surrogate escape on purpose)."""
    head = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method})
    return (head[:-1] + f', "params": {params_json}}}\n').encode()


async def _seen(params: dict[str, Any]) -> Any:
    return {"seen": params}


def driver_dispatcher() -> Dispatcher:
    methods = {"environmentExecute": _seen, "environmentSyncIn": _seen}
    return Dispatcher(methods, initialized=True, text_policy=lone_surrogate_policy)


async def test_command_text_gets_u_fffd_and_the_call_is_served_under_its_id() -> None:
    params = (
        f'{{"command": "echo", "args": ["cut {CUT}", "whole \\ud83d\\ude00"], '
        f'"env": {{"PROMPT": "a{CUT}b"}}, "stdin": "{CUT}"}}'
    )
    async with serving(driver_dispatcher()) as host:
        await host.send_raw(request_line(41, "environmentExecute", params))
        reply = await host.response_to(41)
    assert reply["result"]["seen"] == {
        "command": "echo",
        "args": ["cut \ufffd", "whole \U0001f600"],  # a whole pair stays the emoji
        "env": {"PROMPT": "a\ufffdb"},
        "stdin": "\ufffd",
    }


@pytest.mark.parametrize(
    ("method", "params", "where"),
    [
        ("environmentExecute", f'{{"command": "ec{CUT}ho"}}', "params.command"),
        ("environmentExecute", f'{{"command": "ls", "cwd": "/w/{CUT}"}}', "params.cwd"),
        ("environmentExecute", f'{{"command": "ls", "env": {{"A{CUT}": "x"}}}}', "params.env[...]"),
        (
            "environmentSyncIn",
            f'{{"operations": [{{"files": [{{"sourcePath": "/h/{CUT}.txt"}}]}}]}}',
            "params.operations[0].files[0].sourcePath",
        ),
        (
            "environmentSyncIn",
            f'{{"operations": [{{"postUploadCommands": [{{"command": "rm {CUT}"}}]}}]}}',
            "params.operations[0].postUploadCommands[0].command",
        ),
        ("environmentSyncIn", f'{{"config": {{"apiKey": "k{CUT}"}}}}', "params.config.apiKey"),
    ],
)
async def test_a_name_holding_one_is_refused_by_name_under_the_call_id(
    method: str, params: str, where: str
) -> None:
    async with serving(driver_dispatcher()) as host:
        await host.send_raw(request_line("call-7", method, params))
        reply = await host.response_to("call-7")
    assert reply["error"]["code"] == INVALID_PARAMS, reply
    assert f"{where} holds a lone UTF-16 surrogate" in reply["error"]["message"]


async def test_without_a_policy_the_request_is_refused_under_its_id() -> None:
    async with serving(Dispatcher({"environmentExecute": _seen}, initialized=True)) as host:
        await host.send_raw(request_line(5, "environmentExecute", f'{{"stdin": "{CUT}"}}'))
        reply = await host.response_to(5)
    assert reply["error"]["code"] == INVALID_PARAMS
    assert "lone UTF-16 surrogate" in reply["error"]["message"]


async def test_an_id_or_method_holding_one_is_never_echoed() -> None:
    async with serving(driver_dispatcher()) as host:
        await host.send_raw(
            f'{{"jsonrpc": "2.0", "id": "id{CUT}", "method": "environmentExecute", '
            '"params": {}}\n'.encode()
        )
        assert (await host.receive()) == {
            "jsonrpc": "2.0",
            "id": None,  # no line we write can carry that id
            "error": {"code": PARSE_ERROR, "message": "Parse error: line is not valid JSON"},
        }
        broken = f'{{"jsonrpc": "2.0", "id": 6, "method": "environment{CUT}", "params": {{}}}}'
        await host.send_raw(broken.encode() + b"\n")
        reply = await host.response_to(6)
    assert reply["error"]["code"] == METHOD_NOT_FOUND
    assert all(line.decode("utf-8") for line in host.raw_lines)  # every line valid UTF-8


def test_the_real_worker_answers_such_a_line_under_its_id() -> None:
    initialize = request_line(1, "initialize", "{}")
    validate = request_line(
        2,
        "environmentValidateConfig",
        f'{{"driverKey": "createos", "config": {{"shape": "s-1vcpu-1gb", "apiKey": "k{CUT}"}}}}',
    )
    out = subprocess.run(
        [sys.executable, "-m", "provider"],
        cwd=REPO_ROOT,
        input=initialize + validate,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    replies = [message for message in lines if "id" in message]  # not the log notifications
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[1]["error"]["code"] == INVALID_PARAMS
    assert "params.config.apiKey holds a lone UTF-16 surrogate" in replies[1]["error"]["message"]
