"""The official CreateOS Python SDK (PyPI ``createos-sandbox`` 0.1.3, imported as ``createos``)
driving the emulator: what a user of the emulator who never saw this repo would run.

The SDK is blocking (httpx's sync client), so each test's SDK part runs in a worker thread
(``sdk_run``) while the emulator serves on the test's event loop; the few admin calls those
parts need go back to the loop through ``anyio.from_thread``. Commands that must wait for the
test wait on a gate file the test uploads, never on a timing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import pytest
from createos.client import Client
from createos.errors import (
    APIError,
    AuthenticationError,
    CommandError,
    OperationTimeout,
    ProtocolError,
)
from createos.instance import SandboxInstance
from createos.models import (
    CreateSandboxRequest,
    ExecOptions,
    ExecStreamEventType,
    ForkSandboxRequest,
    ListSandboxesOptions,
    ManagedProcess,
    ManagedProcessConnectEventType,
    ManagedProcessConnectOptions,
    ManagedProcessCreateRequest,
    ManagedProcessDeleteOptions,
    ManagedProcessSignal,
    ManagedProcessState,
    ManagedProcessWaitOptions,
    ManagedProcessWaitScope,
    PTYSize,
    RetryOptions,
    RunCommandRequest,
    SandboxStatus,
    WaitOptions,
)

from provider.emulator import Emulator

from .helpers import KEY, OTHER_KEY

pytestmark = pytest.mark.anyio

T = TypeVar("T")
SHAPE = "s-1vcpu-1gb"
WAIT_GATE = "until [ -e /tmp/go ]; do sleep 0.02; done"
QUICK = WaitOptions(timeout=20)


def sdk_client(emulator: Emulator, key: str | None = KEY) -> Client:
    # Short retry delays: the SDK's own policy (429/503 on any method) with test-sized waits.
    retry = RetryOptions(max_retries=2, base_delay=0.01, max_delay=0.05)
    return Client(api_key=key or "", base_url=emulator.base_url, timeout=30, retry=retry)


@pytest.fixture
async def sdk(emulator: Emulator) -> AsyncIterator[Client]:
    client = sdk_client(emulator)
    try:
        yield client
    finally:
        client.close()


async def sdk_run(fn: Callable[[], T]) -> T:
    """Run a blocking SDK scenario in a worker thread; the emulator keeps serving."""
    return await anyio.to_thread.run_sync(fn)


@contextmanager
def sandbox_of(client: Client, **fields: Any) -> Iterator[SandboxInstance]:
    """A sandbox created through the SDK, destroyed on the way out (nothing left running)."""
    sandbox = client.create_sandbox(CreateSandboxRequest(shape=SHAPE, **fields))
    try:
        yield sandbox
    finally:
        if sandbox.refresh().status not in (SandboxStatus.DESTROYING, SandboxStatus.DESTROYED):
            sandbox.destroy()


def bash(script: str) -> RunCommandRequest:
    return RunCommandRequest(command="/bin/bash", arguments=["-c", script])


def start(sandbox: SandboxInstance, **fields: Any) -> ManagedProcess:
    """A managed process started through the SDK (``ManagedProcessCreateRequest`` fields)."""
    return sandbox.processes.create(ManagedProcessCreateRequest(**fields))


def open_gate(sandbox: SandboxInstance) -> None:
    sandbox.files.upload("/tmp/go", b"")


# -- sandboxes ------------------------------------------------------------------------------
async def test_create_read_list_and_destroy(sdk: Client) -> None:
    def scenario() -> None:
        assert sdk.health().up is True
        assert sdk.readiness().ready is True
        assert SHAPE in {shape.id for shape in sdk.list_shapes()}
        assert sdk.list_root_file_systems().default == "devbox:1"
        request = CreateSandboxRequest(
            shape=SHAPE, name="sdk-one", environment_variables={"GREETING": "hi"}
        )
        sandbox = sdk.create_sandbox(request)
        assert sandbox.status is SandboxStatus.RUNNING and sandbox.name == "sdk-one"
        assert sandbox.id.startswith("sb_") and sandbox.data.shape == SHAPE
        read = sdk.get_sandbox(sandbox.id).data
        assert read.environment_variables == ["GREETING"]  # names only, never values
        assert read.running_at is not None and read.created_at is not None
        assert [s.id for s in sdk.list_sandboxes()] == [sandbox.id]
        running = ListSandboxesOptions(status=SandboxStatus.RUNNING)
        assert [s.id for s in sdk.list_sandboxes(running)] == [sandbox.id]
        paused = ListSandboxesOptions(status=SandboxStatus.PAUSED)
        assert sdk.list_sandboxes(paused) == []
        assert sdk.who_am_i().stats.running == 1
        sandbox.destroy()
        assert sandbox.data.status in (SandboxStatus.DESTROYING, SandboxStatus.DESTROYED)
        sandbox.wait_until_destroyed(QUICK)
        assert sdk.who_am_i().stats.total == 0

    await sdk_run(scenario)


async def test_pause_resume_and_fork(sdk: Client) -> None:
    # The SDK's files_and_snapshots example, asserted: a fork of a paused sandbox has its
    # files, diverges from it, and leaves it paused.
    def scenario() -> None:
        with sandbox_of(sdk) as base:
            base.files.upload("/root/seed.txt", b"seed\n")
            base.pause().wait_until_paused(QUICK)
            assert base.data.paused_at is not None
            with pytest.raises(APIError) as busy:
                base.run_command(bash("true"))
            assert busy.value.status_code == 409
            clone = base.fork(ForkSandboxRequest(start_paused=True))
            try:
                assert clone.id != base.id
                clone.wait_until_paused(QUICK)
                assert clone.data.forked_from == base.id
                clone.resume().wait_until_running(QUICK)
                assert clone.run_command(bash("cat /root/seed.txt")).result.standard_output == (
                    "seed\n"
                )
                clone.files.upload("/root/fork-only.txt", b"fork\n")
                assert base.refresh().status is SandboxStatus.PAUSED
                base.resume().wait_until_running(QUICK)
                missing = base.run_command(bash("test ! -e /root/fork-only.txt"))
                assert missing.result.exit_code == 0
            finally:
                clone.destroy()

    await sdk_run(scenario)


async def test_egress_and_auto_pause_settings(sdk: Client) -> None:
    def scenario() -> None:
        with sandbox_of(sdk, egress_rules=["Example.com:443"]) as sandbox:
            assert sandbox.data.egress_rules == ["example.com:443"]  # stored normalized
            assert sandbox.egress().egress_rules == ["example.com:443"]
            replaced = sandbox.set_egress(["10.0.0.0/8", "*.github.com"])
            assert replaced.id == sandbox.id
            assert replaced.egress_rules == ["10.0.0.0/8", "*.github.com"]
            with pytest.raises(APIError) as bad:
                sandbox.set_egress(["*.github.com", "http://x"])
            assert bad.value.status_code == 400 and "egress[1]" in str(bad.value)
            assert sandbox.egress().egress_rules == ["10.0.0.0/8", "*.github.com"]
            armed = sandbox.set_auto_pause(120).data
            assert armed.auto_pause_after_seconds == 120
            assert sandbox.set_auto_pause(None).data.auto_pause_after_seconds is None
            # A restrictive list gives the sandbox its own loopback: a server there is reached
            # by the SDK's wait_for_port (an exec probing /dev/tcp), a closed port is not.
            serve = ["-m", "http.server", "8765", "--bind", "127.0.0.1"]
            start(sandbox, command="python3", arguments=serve)
            sandbox.wait_for_port(8765, timeout=15)
            with pytest.raises(OperationTimeout):
                sandbox.wait_for_port(8766, timeout=0.2)

    await sdk_run(scenario)


# -- exec -----------------------------------------------------------------------------------
async def test_buffered_exec(sdk: Client) -> None:
    def scenario() -> None:
        with sandbox_of(sdk, environment_variables={"DECLARED": "base"}) as sandbox:
            done = sandbox.run_command(RunCommandRequest(command="echo", arguments=["a b"]))
            assert done.result.standard_output == "a b\n" and done.result.exit_code == 0
            assert done.execution_milliseconds > 0
            upper = sandbox.run_command(
                RunCommandRequest(command="tr", arguments=["a-z", "A-Z"]),
                ExecOptions(standard_input="quiet"),
            )
            assert upper.result.standard_output == "QUIET"
            env = sandbox.run_command(
                bash("echo $DECLARED; echo oops >&2; exit 7"),
                ExecOptions(environment_variables={"DECLARED": "call"}),
            ).result
            assert (env.standard_output, env.standard_error, env.exit_code) == (
                "call\n",
                "oops\n",
                7,
            )
            with pytest.raises(APIError) as undeclared:
                sandbox.run_command(bash("true"), ExecOptions(environment_variables={"NOPE": "x"}))
            assert undeclared.value.status_code == 400 and "NOPE" in str(undeclared.value)
            missing = sandbox.run_command(RunCommandRequest(command="/no/such/tool")).result
            assert missing.exit_code == -1 and missing.error_message
            with pytest.raises(CommandError, match="status 3"):
                sandbox.shell("exit 3")
            assert sandbox.shell("pwd").result.standard_output == "/root\n"

    await sdk_run(scenario)


async def test_streamed_exec_is_live(sdk: Client, emulator: Emulator) -> None:
    await emulator.admin.settings(heartbeat_ms=100)

    def scenario() -> None:
        with sandbox_of(sdk) as sandbox:
            script = f"echo first; {WAIT_GATE}; echo second >&2; exit 4"
            events: list[tuple[ExecStreamEventType, str, int | None]] = []
            with sandbox.stream_command(bash(script)) as stream:
                for event in stream:
                    events.append((event.type, event.data, event.exit_code))
                    if event.type is ExecStreamEventType.HEARTBEAT and len(events) == 2:
                        # "first" arrived and then a heartbeat, all before the gate opens.
                        open_gate(sandbox)
            output = [e for e in events if e[0] is not ExecStreamEventType.HEARTBEAT]
            assert events[0] == (ExecStreamEventType.STDOUT, "first\n", None)
            assert events[1][0] is ExecStreamEventType.HEARTBEAT
            assert output == [
                (ExecStreamEventType.STDOUT, "first\n", None),
                (ExecStreamEventType.STDERR, "second\n", None),
                (ExecStreamEventType.EXIT, "", 4),
            ]

    await sdk_run(scenario)


# -- processes ------------------------------------------------------------------------------
def collect(sandbox: SandboxInstance, process_id: str, after: int = 0) -> dict[str, Any]:
    """Every frame of one connect: bytes per stream, data sequence numbers, the exit event."""
    out: dict[str, Any] = {"stdout": b"", "stderr": b"", "pty": b"", "seqs": [], "exit": None}
    options = ManagedProcessConnectOptions(after_sequence=after)
    with sandbox.processes.connect(process_id, options) as stream:
        for event in stream:
            if event.type is ManagedProcessConnectEventType.DATA:
                assert event.stream is not None
                out[str(event.stream)] += event.data
                out["seqs"].append(event.sequence)
            elif event.type is ManagedProcessConnectEventType.EXIT:
                out["exit"] = (event.exit_code, event.signal)
    return out


async def test_pipe_process_input_connect_replay_and_wait(sdk: Client) -> None:
    # The SDK's managed_process example, part 1 and 2, asserted.
    def scenario() -> None:
        envs = {"BASE": "from-sandbox", "OVERRIDE": "declared"}
        with sandbox_of(sdk, environment_variables=envs) as sandbox:
            processes = sandbox.processes
            script = (
                "printf 'base:%s\\n' \"$BASE\"; printf 'override:%s\\n' \"$OVERRIDE\"; "
                "printf 'stderr:ready\\n' >&2; IFS= read -r line; printf 'stdin:%s\\n' \"$line\"; "
                "pwd"
            )
            started = processes.create(
                ManagedProcessCreateRequest(
                    command="/bin/sh",
                    arguments=["-c", script],
                    working_directory="/paperclip-workspace",
                    environment_variables={"OVERRIDE": "from-process"},
                )
            )
            pid = started.process_id
            assert started.state in (ManagedProcessState.STARTING, ManagedProcessState.RUNNING)
            assert started.command == "/bin/sh" and started.pid > 0
            assert [p.process_id for p in processes.list()] == [pid]
            assert processes.input(pid, "hello managed process\n") == 1
            done = processes.wait(
                pid, ManagedProcessWaitOptions(scope=ManagedProcessWaitScope.TREE, wait_timeout=10)
            )
            assert done.exit_code == 0 and done.tree_exited and done.finished_at is not None
            assert done.state is ManagedProcessState.EXITED
            # Closing the stdin of a process that already ended answers ok, as the example
            # (input, then close) needs when the process is quicker than the close.
            processes.close_standard_input(pid)
            with pytest.raises(APIError) as twice:
                processes.close_standard_input(pid)
            assert twice.value.status_code == 409
            output = collect(sandbox, pid)
            assert output["stdout"] == (
                b"base:from-sandbox\noverride:from-process\n"
                b"stdin:hello managed process\n/paperclip-workspace\n"
            )
            assert output["stderr"] == b"stderr:ready\n" and output["exit"] == (0, None)
            seqs = output["seqs"]
            assert seqs == list(range(1, len(seqs) + 1))
            replay = collect(sandbox, pid, after=seqs[-1] - 1)
            assert replay["seqs"] == [seqs[-1]] and replay["exit"] == (0, None)
            assert processes.get(pid).output.newest_sequence == seqs[-1]

    await sdk_run(scenario)


async def test_signal_wait_timeout_and_delete(sdk: Client) -> None:
    def scenario() -> None:
        with sandbox_of(sdk) as sandbox:
            processes = sandbox.processes
            sleeper = start(sandbox, command="/bin/sleep", arguments=["1000"])
            with pytest.raises(APIError) as still_running:
                processes.wait(sleeper.process_id, ManagedProcessWaitOptions(wait_timeout=0.05))
            assert still_running.value.status_code == 408
            processes.signal(sleeper.process_id, ManagedProcessSignal.TERMINATE)
            ended = processes.wait(sleeper.process_id)
            assert ended.signal == "SIGTERM" and ended.exit_code is None
            assert collect(sandbox, sleeper.process_id)["exit"] == (None, "SIGTERM")
            # The example's part 4: a tree ignoring SIGTERM is killed after the grace.
            deaf = "trap '' TERM; sleep 300 & wait"
            stubborn = start(sandbox, command="/bin/sh", arguments=["-c", deaf])
            gone = processes.delete(
                stubborn.process_id, ManagedProcessDeleteOptions(grace_period=0.1)
            )
            assert gone.leader_exited and gone.tree_exited and gone.signal == "SIGKILL"
            with pytest.raises(APIError) as unknown:
                processes.get("proc_00000000000000000000000000")
            assert unknown.value.status_code == 404

    await sdk_run(scenario)


async def test_pty_process_resize_and_foreground(sdk: Client) -> None:
    # The SDK's managed_process example, part 3, asserted; plus the foreground job, which the
    # SDK decodes as {pid, cmd, args}.
    def scenario() -> None:
        with sandbox_of(sdk) as sandbox:
            shell = start(sandbox, working_directory="/root", pty=PTYSize(rows=24, cols=80))
            processes = sandbox.processes
            pid = shell.process_id
            assert str(shell.kind) == "pty"
            processes.input(pid, "stty size; exec sleep 1000\n")
            deadline = time.monotonic() + 20
            while True:  # until the shell has exec'd the sleep (same pid, new argv)
                foreground = processes.get(pid).foreground
                if foreground is not None and foreground.command == "sleep":
                    break
                assert time.monotonic() < deadline, foreground
                time.sleep(0.02)
            assert (foreground.command, foreground.arguments) == ("sleep", ["1000"])
            assert foreground.process_id == shell.pid
            processes.resize(pid, PTYSize(rows=32, cols=100))
            processes.signal(pid, ManagedProcessSignal.KILL)
            processes.wait(pid, ManagedProcessWaitOptions(scope=ManagedProcessWaitScope.TREE))
            output = collect(sandbox, pid)
            assert b"24 80" in output["pty"] and output["exit"] == (None, "SIGKILL")
            assert output["stdout"] == b"" and output["stderr"] == b""

    await sdk_run(scenario)


# -- files ----------------------------------------------------------------------------------
async def test_files_upload_and_download(sdk: Client) -> None:
    def scenario() -> None:
        with sandbox_of(sdk) as sandbox:
            blob = bytes(range(256)) * 1024
            sandbox.files.upload("/paperclip-workspace/deep/er/blob.bin", blob)
            with sandbox.files.download("/paperclip-workspace/deep/er/blob.bin") as download:
                assert download.read() == blob
            sandbox.files.upload("/tmp/empty", b"")
            with sandbox.files.download("/tmp/empty") as empty:
                assert empty.read() == b""
            sandbox.files.upload("/root/name with space.txt", b"spaced")
            listed = sandbox.run_command(bash("cat '/root/name with space.txt'"))
            assert listed.result.standard_output == "spaced"
            for path, status in (("/root/missing", 404), ("relative.txt", 400), ("/root", 400)):
                with pytest.raises(APIError) as refused:
                    sandbox.files.download(path)
                assert refused.value.status_code == status, path

    await sdk_run(scenario)


# -- errors and faults ----------------------------------------------------------------------
async def test_errors_are_jsend_with_request_ids(sdk: Client, emulator: Emulator) -> None:
    def scenario() -> None:
        with pytest.raises(APIError) as unknown:
            sdk.get_sandbox("sb_00000000000000000000000000")
        assert unknown.value.status_code == 404 and unknown.value.request_id
        with pytest.raises(APIError) as bad_shape:
            sdk.create_sandbox(CreateSandboxRequest(shape="s-0vcpu-0gb"))
        assert bad_shape.value.status_code == 400 and "shape" in str(bad_shape.value)
        with sandbox_of(sdk) as mine:
            other = sdk_client(emulator, OTHER_KEY)
            try:
                with pytest.raises(APIError) as foreign:
                    other.get_sandbox(mine.id)
                assert foreign.value.status_code == 404  # never 403 for another key's sandbox
            finally:
                other.close()
            with pytest.raises(APIError) as not_paused:
                mine.resume().fork()
            assert not_paused.value.status_code == 409
            with pytest.raises(APIError) as not_emulated:
                mine.bandwidth()
            assert not_emulated.value.status_code == 404 and "no such route" in str(
                not_emulated.value
            )
        wrong = sdk_client(emulator, "not-a-key")
        try:
            with pytest.raises(APIError) as denied:
                wrong.list_sandboxes()
            assert denied.value.status_code == 401
            assert "not-a-key" not in str(denied.value)
        finally:
            wrong.close()
        keyless = sdk_client(emulator, None)
        try:
            with pytest.raises(AuthenticationError):
                keyless.who_am_i()  # refused before any request
        finally:
            keyless.close()

    await sdk_run(scenario)


async def test_the_sdk_retries_a_503_create_once(sdk: Client, emulator: Emulator) -> None:
    await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", status=503, retry_after="0")

    def scenario() -> str:
        with sandbox_of(sdk) as sandbox:
            return sandbox.id

    sandbox_id = await sdk_run(scenario)
    creates = [
        r["status"]
        for r in await emulator.admin.requests()
        if (r["method"], r["path"]) == ("POST", "/v1/sandboxes")
    ]
    assert creates == [503, 200]
    assert [s["id"] for s in (await emulator.admin.state())["sandboxes"]] in ([], [sandbox_id])


async def test_a_create_without_status_is_refused_by_the_python_sdk(
    sdk: Client, emulator: Emulator
) -> None:
    # create_omits_status reproduces the body the TS SDK describes; the Python SDK requires
    # status there (its CreateSandboxResponse), so it cannot read that answer.
    await emulator.admin.settings(create_omits_status=True)
    with pytest.raises(ProtocolError, match="CreateSandboxResponse"):
        await sdk_run(lambda: sdk.create_sandbox(CreateSandboxRequest(shape=SHAPE)))
    (created,) = (await emulator.admin.state())["sandboxes"]
    await emulator.admin.force_state(created["id"], "destroyed")
