"""Dispatcher behaviour on in-memory streams: lifecycle, errors, concurrency, invocation ids."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from provider.errors import ConfigError, InvalidParams, ProviderError
from provider.replies import AfterReply
from provider.rpc import dispatcher as dispatcher_module
from provider.rpc import wire
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.errors import HostCallError
from provider.rpc.outbound import current_invocation_id
from tests.rpc.harness import MemoryByteReceiveStream, MemoryByteSendStream, serving

pytestmark = pytest.mark.anyio

TEN_VERBS = [
    "environmentValidateConfig",
    "environmentProbe",
    "environmentAcquireLease",
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentRealizeWorkspace",
    "environmentExecute",
    "environmentSyncIn",
    "environmentSyncOut",
]


async def _echo(params: dict[str, Any]) -> Any:
    return {"echo": params}


# --- initialize and the built-ins --------------------------------------------------------------


async def test_initialize_lists_exactly_the_served_environment_verbs_in_canonical_order() -> None:
    methods = {name: _echo for name in reversed(TEN_VERBS)}
    methods["someHelper"] = _echo
    async with serving(Dispatcher(methods)) as host:
        response = await host.request("initialize", {"manifest": {}, "config": {}})
    assert response == {
        "jsonrpc": "2.0",
        "id": response["id"],
        "result": {"ok": True, "supportedMethods": TEN_VERBS},
    }


async def test_supported_methods_list_only_what_is_registered() -> None:
    dispatcher = Dispatcher({"environmentValidateConfig": _echo, "environmentExecute": _echo})
    assert dispatcher.supported_methods == ("environmentValidateConfig", "environmentExecute")


async def test_requests_before_initialize_are_refused_and_a_second_initialize_too() -> None:
    async with serving(Dispatcher({"environmentProbe": _echo})) as host:
        early = await host.request("environmentProbe", {})
        assert early["error"]["code"] == wire.WORKER_ERROR
        assert "not been initialized" in early["error"]["message"]
        await host.initialize()
        again = await host.request("initialize", {})
        assert again["error"]["code"] == wire.WORKER_ERROR
        assert "already initialized" in again["error"]["message"]
        served = await host.request("environmentProbe", {"x": 1})
        assert served["result"] == {"echo": {"x": 1}}


async def test_health_and_config_changed() -> None:
    async with serving(Dispatcher({})) as host:
        await host.initialize()
        assert (await host.request("health", {}))["result"] == {"status": "ok"}
        changed = await host.request("configChanged", {"config": {"a": 1}, "companyId": None})
        assert "result" in changed
        assert changed["result"] is None


def test_builtin_methods_cannot_be_replaced() -> None:
    with pytest.raises(ValueError, match="initialize"):
        Dispatcher({"initialize": _echo})


# --- malformed input and error mapping ---------------------------------------------------------


async def test_malformed_line_gets_parse_error_with_null_id_and_the_loop_continues() -> None:
    async with serving(Dispatcher({})) as host:
        await host.send_raw(b"{not json\n")
        reply = await host.receive()
        assert reply["id"] is None
        assert reply["error"]["code"] == wire.PARSE_ERROR
        await host.send_raw(b"\xff\xfe garbage bytes\n")
        assert (await host.receive())["error"]["code"] == wire.PARSE_ERROR
        await host.initialize()
        assert (await host.request("health", {}))["result"] == {"status": "ok"}


@pytest.mark.parametrize(
    ("line", "expected_id"),
    [
        (b"[1,2,3]", None),
        (b'"just a string"', None),
        (b'{"id":4,"method":"health","params":{}}', 4),
        (b'{"jsonrpc":"1.0","id":5,"method":"health","params":{}}', 5),
        (b'{"jsonrpc":"2.0","id":6,"method":42,"params":{}}', 6),
        (b'{"jsonrpc":"2.0","id":{"x":1},"method":"health","params":{}}', None),
        (b'{"jsonrpc":"2.0","id":7}', 7),
    ],
)
async def test_invalid_request_shapes_get_invalid_request(
    line: bytes, expected_id: int | None
) -> None:
    async with serving(Dispatcher({})) as host:
        await host.send_raw(line + b"\n")
        reply = await host.receive()
        assert reply["error"]["code"] == wire.INVALID_REQUEST
        assert reply["id"] == expected_id


async def test_unknown_method_is_method_not_found_and_sdk_hooks_are_not_implemented() -> None:
    async with serving(Dispatcher({})) as host:
        await host.initialize()
        unknown = await host.request("noSuchMethod", {})
        assert unknown["error"]["code"] == wire.METHOD_NOT_FOUND
        hook = await host.request("validateConfig", {"config": {}})
        assert hook["error"]["code"] == wire.METHOD_NOT_IMPLEMENTED
        unserved_verb = await host.request("environmentExecute", {})
        assert unserved_verb["error"]["code"] == wire.METHOD_NOT_IMPLEMENTED


@pytest.mark.parametrize("params", [None, [1, 2], "text", 5])
async def test_params_missing_or_not_an_object_is_invalid_params(params: Any) -> None:
    async with serving(Dispatcher({"environmentProbe": _echo})) as host:
        await host.initialize()
        if params is None:
            request_id = await host.send_request("environmentProbe", omit_params=True)
        else:
            request_id = await host.send_request("environmentProbe", params)
        reply = await host.response_to(request_id)
        assert reply["error"]["code"] == wire.INVALID_PARAMS


async def test_exceptions_map_to_json_rpc_errors_in_one_place(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def bad_params(params: dict[str, Any]) -> None:
        raise InvalidParams("lease.providerLeaseId must be a string")

    async def config_error(params: dict[str, Any]) -> None:
        raise ConfigError("shape is required: set it", field="shape")

    async def grouped(params: dict[str, Any]) -> None:
        raise ExceptionGroup("wrapped", [ProviderError("sandbox is closing")])

    async def crash(params: dict[str, Any]) -> None:
        raise RuntimeError("secret-token-123 leaked into an exception")

    methods = {
        "environmentAcquireLease": bad_params,
        "environmentValidateConfig": config_error,
        "environmentSyncIn": grouped,
        "environmentExecute": crash,
    }
    async with serving(Dispatcher(methods)) as host:
        await host.initialize()
        assert (await host.request("environmentAcquireLease", {}))["error"] == {
            "code": wire.INVALID_PARAMS,
            "message": "lease.providerLeaseId must be a string",
        }
        assert (await host.request("environmentValidateConfig", {}))["error"] == {
            "code": wire.WORKER_ERROR,
            "message": "shape is required: set it",
        }
        assert (await host.request("environmentSyncIn", {}))["error"]["message"] == (
            "sandbox is closing"
        )
        crashed = await host.request("environmentExecute", {"config": {"apiKey": "k-999"}})
    assert crashed["error"]["code"] == wire.WORKER_ERROR
    assert "environmentExecute" in crashed["error"]["message"]
    assert "secret-token-123" not in crashed["error"]["message"]
    stderr = capsys.readouterr().err
    assert "RuntimeError" in stderr  # the traceback goes to stderr ...
    assert "k-999" not in stderr  # ... but params never do
    # Each failure is logged once, with the reply's public text: warn for a caller's mistake.
    assert [n["params"] for n in host.notifications if n["method"] == "log"] == [
        {
            "level": "warn",
            "message": "environmentAcquireLease: lease.providerLeaseId must be a string",
        },
        {"level": "warn", "message": "environmentValidateConfig: shape is required: set it"},
        {"level": "error", "message": "environmentSyncIn: sandbox is closing"},
        {"level": "error", "message": f"environmentExecute: {crashed['error']['message']}"},
    ]


async def test_unencodable_result_becomes_an_error_reply() -> None:
    async def odd(params: dict[str, Any]) -> object:
        return {"value": object()}

    async with serving(Dispatcher({"environmentProbe": odd})) as host:
        await host.initialize()
        reply = await host.request("environmentProbe", {})
        assert reply["error"]["code"] == wire.WORKER_ERROR
        assert (await host.request("health", {}))["result"] == {"status": "ok"}


async def test_output_is_utf8_and_round_trips_non_ascii_text() -> None:
    text = "héllo ✓ 😀 \u2028 end"

    async def give(params: dict[str, Any]) -> dict[str, str]:
        return {"text": text}

    async with serving(Dispatcher({"environmentProbe": give})) as host:
        await host.initialize()
        reply = await host.request("environmentProbe", {})
        assert reply["result"]["text"] == text
        assert any(text.encode() in line for line in host.raw_lines)
        for line in host.raw_lines:
            line.decode("utf-8")  # strict


async def test_a_result_with_a_lone_surrogate_becomes_an_error_reply_not_bad_utf8() -> None:
    async def odd(params: dict[str, Any]) -> dict[str, str]:
        return {"path": "caf\udce9"}  # what os.fsdecode makes of a non-UTF-8 file name

    async with serving(Dispatcher({"environmentProbe": odd})) as host:
        await host.initialize()
        reply = await host.request("environmentProbe", {})
        assert reply["error"]["code"] == wire.WORKER_ERROR
        assert (await host.request("health", {}))["result"] == {"status": "ok"}
        for line in host.raw_lines:
            line.decode("utf-8")  # strict: every line the host got is valid UTF-8


async def test_unknown_host_notifications_are_ignored() -> None:
    async with serving(Dispatcher({})) as host:
        await host.send({"jsonrpc": "2.0", "method": "onEvent", "params": {"x": 1}})
        await host.initialize()
        assert host.notifications == []


# --- concurrency and invocation context ---------------------------------------------------------


async def test_a_long_call_never_blocks_health_or_a_second_call() -> None:
    release = anyio.Event()
    entered: list[str] = []

    async def slow(params: dict[str, Any]) -> str:
        entered.append(params["name"])
        await release.wait()
        return str(params["name"])

    async with serving(Dispatcher({"environmentExecute": slow})) as host:
        await host.initialize()
        first = await host.send_request("environmentExecute", {"name": "a"})
        second = await host.send_request("environmentExecute", {"name": "b"})
        assert (await host.request("health", {}))["result"] == {"status": "ok"}
        release.set()
        replies = {(await host.receive())["id"]: None for _ in range(2)}
        assert set(replies) == {first, second}
    assert sorted(entered) == ["a", "b"]


async def test_notifications_carry_the_invocation_id_of_the_call_being_served() -> None:
    gate = anyio.Event()

    async def execute(params: dict[str, Any]) -> str | None:
        label = str(params["label"])
        await gate.wait()
        await dispatcher.notify("execute.log", {"stream": "stdout", "chunk": label})
        async with anyio.create_task_group() as tg:  # child tasks inherit the context
            tg.start_soon(dispatcher.log, "info", f"child of {label}")
        return current_invocation_id()

    async def validate(params: dict[str, Any]) -> None:
        await dispatcher.notify("log", {"level": "info", "message": "no invocation"})

    dispatcher = Dispatcher({"environmentExecute": execute, "environmentValidateConfig": validate})
    async with serving(dispatcher) as host:
        await host.initialize()
        id_one = await host.send_request(
            "environmentExecute", {"label": "one"}, invocation_id="inv-1"
        )
        id_two = await host.send_request(
            "environmentExecute", {"label": "two"}, invocation_id="inv-2"
        )
        await anyio.wait_all_tasks_blocked()
        gate.set()
        results: dict[Any, Any] = {}
        while len(results) < 2:
            message = await host.receive()
            if "method" in message:
                host.notifications.append(message)
            else:
                results[message["id"]] = message["result"]
        await host.request("environmentValidateConfig", {"config": {}})
    assert results == {id_one: "inv-1", id_two: "inv-2"}
    by_text = {
        n["params"].get("chunk", n["params"].get("message")): n.get("paperclipInvocationId")
        for n in host.notifications
    }
    assert by_text == {
        "one": "inv-1",
        "two": "inv-2",
        "child of one": "inv-1",
        "child of two": "inv-2",
        "no invocation": None,
    }
    untagged = [n for n in host.notifications if n["params"].get("message") == "no invocation"]
    assert "paperclipInvocationId" not in untagged[0]  # no invocation: no key at all


async def test_log_notification_shape() -> None:
    async def handler(params: dict[str, Any]) -> None:
        await dispatcher.log("warn", "careful", {"leaseId": "sb_1"})

    dispatcher = Dispatcher({"environmentProbe": handler})
    async with serving(dispatcher) as host:
        await host.initialize()
        await host.request("environmentProbe", {})
    assert host.notifications == [
        {
            "jsonrpc": "2.0",
            "method": "log",
            "params": {"level": "warn", "message": "careful", "meta": {"leaseId": "sb_1"}},
        }
    ]


async def test_requests_to_the_host_use_our_own_ids_and_map_errors() -> None:
    async def ask(params: dict[str, Any]) -> Any:
        try:
            return await dispatcher.call_host("config.get", {"companyId": "c1"})
        except HostCallError as exc:
            return {"failed": exc.code}

    dispatcher = Dispatcher({"environmentProbe": ask})
    async with serving(dispatcher) as host:
        await host.initialize()
        probe_id = await host.send_request("environmentProbe", {}, request_id=1, invocation_id="i")
        outgoing = await host.receive()
        assert outgoing["method"] == "config.get"
        assert outgoing["paperclipInvocationId"] == "i"
        await host.send({"jsonrpc": "2.0", "id": outgoing["id"], "result": {"k": "v"}})
        assert (await host.response_to(probe_id))["result"] == {"k": "v"}
        probe_id = await host.send_request("environmentProbe", {}, request_id=2)
        outgoing = await host.receive()
        await host.send(
            {
                "jsonrpc": "2.0",
                "id": outgoing["id"],
                "error": {"code": wire.CAPABILITY_DENIED, "message": "no"},
            }
        )
        assert (await host.response_to(probe_id))["result"] == {"failed": wire.CAPABILITY_DENIED}


# --- shutdown and end of input ------------------------------------------------------------------


async def test_shutdown_aborts_active_work_then_replies_null_and_stops_serving() -> None:
    events: list[str] = []
    started = anyio.Event()
    in_cleanup = anyio.Event()
    proceed = anyio.Event()

    async def forever(params: dict[str, Any]) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            events.append("handler cancelled")

    async def on_shutdown() -> None:
        events.append("driver shutdown")
        in_cleanup.set()
        await proceed.wait()

    dispatcher = Dispatcher({"environmentExecute": forever}, on_shutdown=on_shutdown)
    async with serving(dispatcher) as host:
        await host.initialize()
        execute_id = await host.send_request("environmentExecute", {})
        await started.wait()
        shutdown_id = await host.send_request("shutdown", {})
        await in_cleanup.wait()
        late = await host.request("health", {})
        proceed.set()
        cancelled = await host.receive()
        done = await host.receive()
    assert "shutting down" in late["error"]["message"]
    assert events == ["driver shutdown", "handler cancelled"]
    assert cancelled["id"] == execute_id
    assert cancelled["error"]["code"] == wire.WORKER_ERROR
    assert "shutting down" in cancelled["error"]["message"]
    assert done == {"jsonrpc": "2.0", "id": shutdown_id, "result": None}


async def test_shutdown_cleanup_is_bounded_when_the_driver_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatcher_module, "SHUTDOWN_BUDGET_S", 0.3)
    monkeypatch.setattr(dispatcher_module, "CANCEL_GRACE_S", 0.1)

    async def hang() -> None:
        await anyio.sleep_forever()

    async with serving(Dispatcher({}, on_shutdown=hang)) as host:
        await host.initialize()
        shutdown_id = await host.send_request("shutdown", {})
        assert await host.receive() == {"jsonrpc": "2.0", "id": shutdown_id, "result": None}


async def test_end_of_input_runs_the_same_cleanup_and_returns() -> None:
    called: list[str] = []

    async def on_shutdown() -> None:
        called.append("cleanup")

    dispatcher = Dispatcher({}, on_shutdown=on_shutdown)
    async with serving(dispatcher) as host:
        await host.initialize()
        await host.close()
        with anyio.fail_after(10):
            await dispatcher.stop()
    assert called == ["cleanup"]


async def test_requests_already_read_before_end_of_input_are_still_answered() -> None:
    dispatcher = Dispatcher({})
    async with serving(dispatcher) as host:
        await host.send_raw(
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'
            b'{"jsonrpc":"2.0","id":2,"method":"health","params":{}}\n'
        )
        await host.close()
        first = await host.receive()
        second = await host.receive()
    assert first["result"]["ok"] is True
    assert second["result"] == {"status": "ok"}


async def test_losing_the_output_stream_winds_the_worker_down() -> None:
    cleanup_started = anyio.Event()

    async def on_shutdown() -> None:
        cleanup_started.set()

    dispatcher = Dispatcher({}, on_shutdown=on_shutdown)
    to_worker_send, to_worker_receive = anyio.create_memory_object_stream[bytes](10)
    from_worker_send, from_worker_receive = anyio.create_memory_object_stream[bytes](10)
    from_worker_receive.close()  # the host stopped reading
    with to_worker_send, to_worker_receive, from_worker_send:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                dispatcher.serve,
                MemoryByteReceiveStream(to_worker_receive),
                MemoryByteSendStream(from_worker_send),
            )
            await to_worker_send.send(b'{"jsonrpc":"2.0","id":1,"method":"health","params":{}}\n')
            with anyio.fail_after(10):
                await cleanup_started.wait()  # started by the failed write, input still open


async def test_an_after_reply_result_lets_its_notifications_follow_the_written_reply() -> None:
    """A session's output may be ready before its open's answer is written: it must wait."""
    written = anyio.Event()
    calls: list[str] = []

    async def session_output() -> None:
        await written.wait()
        await dispatcher.notify("loginPty.output", {"chunk": "after"})

    def on_written(delivered: bool) -> None:
        calls.append(f"written:{delivered}")
        written.set()

    async def open_session(params: dict[str, Any]) -> AfterReply:
        tg.start_soon(session_output)
        await anyio.wait_all_tasks_blocked()  # the output task is waiting
        return AfterReply({"workerSessionId": "pty-1"}, on_written)

    dispatcher = Dispatcher({"loginPtyOpen": open_session})
    async with anyio.create_task_group() as tg, serving(dispatcher) as host:
        await host.initialize()
        request_id = await host.send_request("loginPtyOpen", {})
        first = await host.receive()
        second = await host.receive()
    assert first == {"jsonrpc": "2.0", "id": request_id, "result": {"workerSessionId": "pty-1"}}
    assert second["method"] == "loginPty.output"
    assert calls == ["written:True"]


async def test_after_reply_is_told_its_result_was_not_sent_when_it_cannot_be_encoded() -> None:
    told: list[bool] = []

    async def open_session(params: dict[str, Any]) -> AfterReply:
        return AfterReply({"bad": object()}, told.append)

    async with serving(Dispatcher({"duplexChannelOpen": open_session})) as host:
        await host.initialize()
        response = await host.request("duplexChannelOpen", {})
    assert response["error"]["code"] == wire.WORKER_ERROR
    assert told == [False]  # the host got an error: the session must never be announced
