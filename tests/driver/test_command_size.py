"""An oversized command is refused before any request, naming the input; the bound is exact.

A command travels in the sandbox as one ``bash -lc`` argument, which Linux limits to 131,071
bytes (MAX_ARG_STRLEN with its NUL). A 10 MiB argument, env value, exclusion list or post-upload
command used to be sent anyway: the API answered 413 and closed while the worker still sent, the
worker read a transport error as an unknown outcome and poisoned the lease.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from provider.driver.commands.command_size import MAX_SCRIPT_BYTES, utf8_size
from provider.driver.commands.execute import CommandSpec, build_command
from provider.errors import InvalidParams
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import sync_in, sync_out

pytestmark = pytest.mark.anyio

WS = "/paperclip-workspace"
TEN_MIB = 10 * 1024 * 1024
COUNT_ARGS = 'printf "%s %s %s" "$#" "${#1}" "$(wc -c)"'


async def execute(h: Harness, lease: dict[str, Any], **fields: Any) -> Any:
    return await h.methods.execute({**h.with_lease(lease), **fields})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"command": "echo", "args": ["x" * TEN_MIB]}, r"args\[0\] \(10,485,760 bytes\)"),
        ({"command": "env", "env": {"BIG": "y" * TEN_MIB}}, r"env value of BIG \(10,485,760"),
        ({"command": "echo", "args": ["z" * 10_000] * 14}, r"args\[0\] \(10,000 bytes\)"),
        ({"command": "echo", "cwd": f"{WS}/{'d' * 200_000}"}, r"the cwd \(200,021 bytes\)"),
        ({"command": "c" * 200_000}, r"the command \(200,000 bytes\)"),
    ],
)
async def test_an_oversized_execute_is_refused_before_any_request(
    harness: Harness, fields: dict[str, Any], named: str
) -> None:
    h = harness
    lease = await h.acquire()
    before = await h.request_count()
    with pytest.raises(InvalidParams, match=r"at most 131,071 \(MAX_ARG_STRLEN") as refused:
        await execute(h, lease, stdin="staged input", **fields)
    message = str(refused.value)
    assert "The command is too large to start in the sandbox" in message
    assert len(message) < 400 and "xxxx" not in message and "yyyy" not in message
    assert re.search(named, message), message
    assert await h.request_count() == before  # refused before any request
    done = await execute(h, lease, command="echo", args=["usable"])  # the lease is not poisoned
    assert done["stdout"] == "usable\n"


async def test_the_bound_is_the_kernels_exactly_and_stdin_keeps_its_own_path(
    harness: Harness,
) -> None:
    """The largest command that fits runs for real (bubblewrap, real execve) with 1 MiB of
    stdin beside it; one byte more is refused with zero requests."""
    h = harness
    lease = await h.acquire()
    stdin = "s" * (1024 * 1024)  # over one /input: staged as a file, never in the argument

    def fields(length: int) -> dict[str, Any]:
        return {"command": "bash", "args": ["-c", COUNT_ARGS, "argv0", "a" * length]}

    def size(length: int) -> int:
        spec = CommandSpec(**fields(length), stdin=stdin, timeout=60.0)
        return utf8_size(build_command(spec).script)

    fits = 100_000 + MAX_SCRIPT_BYTES - size(100_000)
    assert size(fits) == MAX_SCRIPT_BYTES
    ran = await execute(h, lease, stdin=stdin, **fields(fits))
    assert ran["exitCode"] == 0, ran
    assert ran["stdout"] == f"1 {fits} {len(stdin)}"
    before = await h.request_count()
    with pytest.raises(InvalidParams, match=rf"args\[3\] \({fits + 1:,} bytes\)"):
        await execute(h, lease, stdin=stdin, **fields(fits + 1))
    assert await h.request_count() == before


async def test_an_oversized_exclusion_list_or_post_upload_command_is_refused_before_any_request(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    source = tmp_path / "note.txt"
    source.write_text("hello\n")
    patterns = [f"generated-{index:06d}-{'p' * 90}" for index in range(TEN_MIB // 100)]
    before = await h.request_count()
    with pytest.raises(InvalidParams, match=r"Packing files\[0\] of operation out-1") as refused:
        await sync_out(
            h,
            lease,
            {
                "operationId": "out-1",
                "files": [
                    {
                        "sourcePath": WS,
                        "targetPath": str(tmp_path / "back"),
                        "kind": "directory",
                        "exclude": patterns,
                    }
                ],
            },
        )
    assert r"exclude[0] of files[0] (107 bytes)" in str(refused.value)
    script = "echo " + "q" * TEN_MIB
    with pytest.raises(InvalidParams, match=r"postUploadCommands\[0\]\.command \(10,485,765"):
        await sync_in(
            h,
            lease,
            {
                "operationId": "in-1",
                "files": [
                    {"sourcePath": str(source), "targetPath": f"{WS}/note.txt", "kind": "file"}
                ],
                "postUploadCommands": [{"command": script}],
            },
        )
    assert await h.request_count() == before  # nothing uploaded, packed or started
    placed = await sync_in(
        h,
        lease,
        {
            "files": [{"sourcePath": str(source), "targetPath": f"{WS}/note.txt", "kind": "file"}],
            "postUploadCommands": [{"command": "test -s note.txt"}],
        },
    )
    assert placed["operations"][0]["filesTransferred"] == 1  # the lease is not poisoned


async def test_arg_max_never_binds_once_the_argument_fits(harness: Harness) -> None:
    """The most arguments that fit (empty ones: three bytes each, quoted) start: argv with its
    8-byte pointers stays far under ARG_MAX (2 MiB), so the argument is the only bound."""
    h = harness
    lease = await h.acquire()
    base = utf8_size(build_command(CommandSpec("bash", ["-c", 'echo "$#"', "argv0"])).script)
    count = (MAX_SCRIPT_BYTES - base) // 3
    ran = await execute(h, lease, command="bash", args=["-c", 'echo "$#"', "argv0", *[""] * count])
    assert ran["stdout"] == f"{count}\n", ran
