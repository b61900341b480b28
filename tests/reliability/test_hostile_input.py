"""Hostile input through the real dispatcher and driver, against the emulator.

Command values and env that a shell would misread, NUL bytes, wrong param types for every verb,
oversized command lines, and host paths with ``..`` and symlinked parents in sync.

Host-path rules (docs/protocol.md 5.2/5.6): host paths must be absolute and are otherwise
trusted, so ``..`` and symlinks in them resolve the way the OS resolves them; we never rewrite a
path lexically. What must hold whatever the path: only a complete download is renamed onto a file
target, the temp folder lives in the target's (resolved) parent and is gone afterwards, a final
component that is a symlink is *replaced* (file) or refused (directory), never written through,
and with ``followSymlinks`` the containment root is the source's real path.

(Archive validation is fuzzed in tests/driver/test_archive_property.py; not repeated here.)
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.call_params import environment_call
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.core.text_params import lone_surrogate_policy
from provider.driver.service import DriverService
from provider.emulator import Emulator
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.wire import INVALID_PARAMS, WORKER_ERROR
from tests.driver.conftest import unpaced_client
from tests.rpc.harness import FakeHost, serving

pytestmark = pytest.mark.anyio

WS = "/paperclip-workspace"
SENTINEL = "SENTINEL-7f3a"  # planted in refused values: no error message may repeat it


@dataclass
class Rig:
    host: FakeHost
    emulator: Emulator
    systmp: Path
    company_id: str = "company-hostile"
    environment_id: str = "env-hostile"
    leases: list[dict[str, Any]] = field(default_factory=list)

    def common(self) -> dict[str, Any]:
        return environment_call(
            self.emulator.base_url,
            "test-key",
            company_id=self.company_id,
            environment_id=self.environment_id,
            timeoutMs=60_000,
        )

    def fake_lease(self) -> dict[str, Any]:
        """Owned by this environment but never acquired: any HTTP use of it would show."""
        metadata = {
            "provider": "createos",
            "apiUrl": self.emulator.base_url,
            "companyId": self.company_id,
            "environmentId": self.environment_id,
            "marker": "0" * 36,
        }
        return {"providerLeaseId": "sb_never_acquired", "metadata": metadata, "expiresAt": None}

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        return await self.host.request(method, params)

    async def result(self, method: str, params: Any) -> Any:
        response = await self.call(method, params)
        assert "result" in response, response
        return response["result"]

    async def lease(self) -> dict[str, Any]:
        """One real lease per test, acquired on first use."""
        if not self.leases:
            lease = await self.result("environmentAcquireLease", {**self.common(), "runId": "r"})
            self.leases.append({**lease, "expiresAt": None})
        return self.leases[0]

    async def execute(self, **params: Any) -> dict[str, Any]:
        lease = await self.lease()
        result: dict[str, Any] = await self.result(
            "environmentExecute", {**self.common(), "lease": lease, **params}
        )
        return result

    async def sync(self, direction: str, *files: dict[str, Any]) -> dict[str, Any]:
        lease = await self.lease()
        params = {
            **self.common(),
            "lease": lease,
            "operations": [{"operationId": "op-1", "files": list(files)}],
        }
        return await self.call(f"environmentSync{direction}", params)

    async def request_count(self) -> int:
        return len(await self.emulator.admin.requests())

    async def live_trees(self) -> list[dict[str, Any]]:
        return [p for p in (await self.emulator.admin.state())["processes"] if p["tree_alive"]]


@pytest.fixture
async def rig(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Rig]:
    systmp = tmp_path / "systmp"  # the worker's system temp folder, private to this test
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    journal = LeaseJournal(tmp_path / "state" / "leases.sqlite3")
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=journal)
    channel: list[Dispatcher] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        await channel[0].notify(method, params)

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        await channel[0].log(level, message, meta)

    service = DriverService(runtime, notify=notify, log=log)
    dispatcher = Dispatcher(
        service.table(),
        on_shutdown=service.shutdown,
        initialized=True,
        text_policy=lone_surrogate_policy,
    )
    channel.append(dispatcher)
    async with serving(dispatcher) as host:
        rig = Rig(host, emulator, systmp)
        yield rig
        for lease in rig.leases:
            ref = {
                **rig.common(),
                "providerLeaseId": lease["providerLeaseId"],
                "leaseMetadata": lease["metadata"],
            }
            receipt = await rig.result("environmentReleaseLease", ref)
            assert receipt["state"] == "destroyed"
    assert temp_leftovers(systmp) == []


def temp_leftovers(*folders: Path) -> list[str]:
    return [
        p.name
        for d in folders
        if d.exists()
        for p in d.iterdir()
        if p.name.startswith(".paperclip-createos-")
    ]


# --- command values and env ----------------------------------------------------------------------

CLASSICS = [
    "'",
    '"',
    "'\"'\"'",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "; touch /tmp/pwned",
    "| touch /tmp/pwned",
    "&& touch /tmp/pwned #",
    "$HOME ${IFS} $0 $@ $$",
    "\\",
    "\\'",
    "*",
    "~",
    "-n",
    "--",
    "a\nb",
    "\n",
    "\r\n",
    "\t",
    "!!",
    "é😀\u2028\u0085",
    "x" * 4096,
]
# Printed back by the command itself, as JSON; stdin is read as bytes (no newline translation).
REPORTER = (
    "import json, os, sys\n"
    "names = [n for n in os.environ['HOSTILE_NAMES'].split(',') if n]\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': {n: os.environ.get(n) for n in names},\n"
    "    'stdin': sys.stdin.buffer.read().decode(), 'cwd': os.getcwd(),\n"
    "    'pwned': os.path.exists('/tmp/pwned')}))\n"
)
no_nul = st.characters(codec="utf-8", exclude_characters="\x00")
hostile_text = st.sampled_from(CLASSICS) | st.text(no_nul, max_size=40)
env_name = st.from_regex(r"[A-Za-z0-9_]{0,12}", fullmatch=True).map(lambda n: "H_" + n)
dir_name = (
    st.text(st.characters(codec="utf-8", exclude_characters="\x00/"), min_size=1)
    .map(lambda n: n[:40])
    .filter(lambda n: n not in (".", ".."))
)


@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    args=st.lists(hostile_text, max_size=8),
    env=st.dictionaries(env_name, hostile_text, max_size=5),
    stdin=st.none() | st.text(st.characters(codec="utf-8"), max_size=200),
    cwd_name=dir_name | st.sampled_from(["my dir", "$(touch /tmp/pwned)", "'", "a\nb", "-x"]),
)
async def test_hostile_command_values_arrive_verbatim_and_nothing_is_evaluated(
    rig: Rig, args: list[str], env: dict[str, str], stdin: str | None, cwd_name: str
) -> None:
    # The fixture runs once for all examples: they share one emulator and one lease.
    cwd = f"{WS}/{cwd_name}"
    made = await rig.execute(command="mkdir", args=["-p", "--", cwd])
    assert made["exitCode"] == 0, made
    params: dict[str, Any] = {
        "command": "python3",
        "args": ["-c", REPORTER, *args],
        "env": {**env, "HOSTILE_NAMES": ",".join(env)},
        "cwd": cwd,
    }
    if stdin is not None:
        params["stdin"] = stdin  # NUL is fine here: stdin is staged as a file
    result = await rig.execute(**params)
    assert result["exitCode"] == 0, result
    report = json.loads(result["stdout"])
    assert report == {
        "argv": args,
        "env": env,
        "stdin": stdin or "",
        "cwd": cwd,
        "pwned": False,
    }


def refused_cases() -> list[tuple[str, str, Any, tuple[int, ...]]]:
    """(label, verb, params or a params transform, accepted codes)."""
    s = SENTINEL
    bad_types: list[tuple[str, str, dict[str, Any]]] = [
        ("validate without config", "environmentValidateConfig", {"driverKey": "createos"}),
        ("probe companyId int", "environmentProbe", {"companyId": 7}),
        ("probe config list", "environmentProbe", {"config": [s]}),
        ("acquire runId int", "environmentAcquireLease", {"runId": 5}),
        ("acquire environmentId null", "environmentAcquireLease", {"environmentId": None}),
        ("resume lease id int", "environmentResumeLease", {"providerLeaseId": 5}),
        ("resume metadata str", "environmentResumeLease", {"leaseMetadata": s}),
        ("release cancelActiveWork str", "environmentReleaseLease", {"cancelActiveWork": s}),
        ("destroy lease id list", "environmentDestroyLease", {"providerLeaseId": [s]}),
        ("realize lease str", "environmentRealizeWorkspace", {"lease": s}),
        ("realize metadata list", "environmentRealizeWorkspace", {"lease": {"metadata": [s]}}),
        ("execute without command", "environmentExecute", {}),
        ("execute command int", "environmentExecute", {"command": 5}),
        ("execute args str", "environmentExecute", {"command": "ls", "args": s}),
        ("execute args of int", "environmentExecute", {"command": "ls", "args": [1]}),
        ("execute env list", "environmentExecute", {"command": "ls", "env": [s]}),
        ("execute env value int", "environmentExecute", {"command": "ls", "env": {"A": 1}}),
        ("execute env value null", "environmentExecute", {"command": "ls", "env": {"A": None}}),
        ("execute env value obj", "environmentExecute", {"command": "ls", "env": {"A": {s: s}}}),
        ("execute stdin int", "environmentExecute", {"command": "ls", "stdin": 5}),
        ("execute cwd list", "environmentExecute", {"command": "ls", "cwd": [s]}),
        ("execute timeoutMs str", "environmentExecute", {"command": "ls", "timeoutMs": "500"}),
        ("execute timeoutMs bool", "environmentExecute", {"command": "ls", "timeoutMs": True}),
        ("sync operations str", "environmentSyncIn", {"operations": s}),
        ("sync files obj", "environmentSyncIn", {"operations": [{"files": {s: s}}]}),
        ("sync path int", "environmentSyncOut", {"operations": [{"files": [{"sourcePath": 1}]}]}),
        (
            "sync mode str",
            "environmentSyncIn",
            {"operations": [{"files": [_mapping(mode="0644")]}]},
        ),
        (
            "sync mode bool",
            "environmentSyncIn",
            {"operations": [{"files": [_mapping(mode=True)]}]},
        ),
        (
            "sync followSymlinks str",
            "environmentSyncIn",
            {"operations": [{"files": [_mapping(followSymlinks=s)]}]},
        ),
        (
            "sync post command int",
            "environmentSyncIn",
            {"operations": [{"files": [], "postUploadCommands": [{"command": 5}]}]},
        ),
    ]
    cases: list[tuple[str, str, Any, tuple[int, ...]]] = [
        (label, verb, params, (INVALID_PARAMS,)) for label, verb, params in bad_types
    ]
    refused = (INVALID_PARAMS, WORKER_ERROR)  # NUL: refused, whichever layer sees it first
    for label, params in [
        ("command", {"command": f"ls\0{s}"}),
        ("arg", {"command": "ls", "args": ["ok", f"a\0{s}"]}),
        ("env value", {"command": "ls", "env": {"A": f"x\0{s}"}}),
        ("cwd", {"command": "ls", "cwd": f"{WS}/\0{s}"}),
        ("env name", {"command": "ls", "env": {"BAD;KEY": s}}),  # the name is shown, by spec
    ]:
        cases.append((f"execute NUL/bad {label}", "environmentExecute", params, refused))
    for label, mapping in [
        # Paths are not secret and may be named in the message; no sentinel there.
        ("host path", _mapping(sourcePath="/tmp/\0x")),
        ("relative host path", _mapping(sourcePath="relative/x")),
        ("sandbox path", _mapping(targetPath=f"{WS}/../x")),
        ("exclude", _mapping(kind="directory", exclude=[f"\0{s}"])),
    ]:
        params = {"operations": [{"files": [mapping]}]}
        cases.append((f"sync NUL/bad {label}", "environmentSyncIn", params, refused))
    return cases


def _mapping(**overrides: Any) -> dict[str, Any]:
    return {"sourcePath": "/etc/hostname", "targetPath": f"{WS}/x", "kind": "file", **overrides}


LEASE_ID_VERBS = ("environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease")


@pytest.mark.parametrize(
    ("verb", "overrides", "codes"),
    [pytest.param(verb, params, codes, id=label) for label, verb, params, codes in refused_cases()],
)
async def test_wrong_types_and_nul_are_refused_before_any_request(
    rig: Rig, verb: str, overrides: dict[str, Any], codes: tuple[int, ...]
) -> None:
    fake = rig.fake_lease()
    params: dict[str, Any] = rig.common()
    if verb in LEASE_ID_VERBS:
        params.update(providerLeaseId=fake["providerLeaseId"], leaseMetadata=fake["metadata"])
    elif verb not in ("environmentValidateConfig", "environmentProbe", "environmentAcquireLease"):
        params["lease"] = fake
    if verb == "environmentValidateConfig":
        params = {}
    params.update(overrides)
    before = await rig.request_count()
    response = await rig.call(verb, params)
    assert "error" in response, response
    assert response["error"]["code"] in codes, response
    assert SENTINEL not in response["error"]["message"]
    assert await rig.request_count() == before


async def test_oversized_command_lines_fail_cleanly_and_leave_the_lease_usable(rig: Rig) -> None:
    count = 'printf "%s %s" "$#" "${#1}"'
    big = await rig.execute(command="bash", args=["-c", count, "argv0", "x" * 100_000])
    assert big["stdout"] == "1 100000"
    many = await rig.execute(command="bash", args=["-c", count, "argv0", *["a"] * 20_000])
    assert many["stdout"] == "20000 1"
    # Past what the one bash argument a command travels in may carry (131,071 bytes): refused
    # before any request, naming the largest input; no process, no poison.
    for args, env in [
        (["x" * 200_000], {}),
        (["x" * (1 << 20)], {}),
        (["x" * 100_000] * 15, {}),
        ([], {"BIG": "x" * 200_000}),
    ]:
        before = await rig.request_count()
        response = await rig.call(
            "environmentExecute",
            {
                **rig.common(),
                "lease": await rig.lease(),
                "command": "bash",
                "args": ["-c", count, "argv0", *args],
                "env": env,
                "stdin": "staged input",
            },
        )
        assert response["error"]["code"] == INVALID_PARAMS, response
        message = response["error"]["message"]
        assert "xxxx" not in message and len(message) < 400
        assert "at most 131,071" in message and ("args[3]" in message or "BIG" in message)
        assert await rig.request_count() == before
        assert await rig.live_trees() == []
    # Not poisoned, and nothing staged for stdin was left behind.
    scratch = await rig.execute(command="bash", args=["-c", "ls -a /tmp"])
    assert scratch["exitCode"] == 0
    assert "paperclip-stdin-" not in scratch["stdout"]


async def test_a_cut_emoji_reaches_the_command_as_u_fffd_and_a_path_holding_one_is_refused(
    rig: Rig,
) -> None:
    """Node writes half an emoji as a lone ``\\ud83d`` escape: text the command reads gets
    U+FFFD (what Node itself would have passed), a path is refused, both under the call's id."""
    lease = await rig.lease()
    show = "import sys; print(ascii([*sys.argv[1:], sys.stdin.read()]))"
    params = {**rig.common(), "lease": lease, "command": "python3", "args": ["-c", show, "@CUT"]}
    line = json.dumps({"jsonrpc": "2.0", "id": "cut-1", "method": "environmentExecute"})
    spliced = json.dumps({**params, "stdin": "@CUT"}).replace("@CUT", "cut \\ud83d")
    await rig.host.send_raw(f'{line[:-1]}, "params": {spliced}}}\n'.encode())
    ran = await rig.host.response_to("cut-1")
    assert ran["result"]["stdout"] == "['cut \\ufffd', 'cut \\ufffd']\n", ran
    mapping = file_mapping("/tmp/@CUT", f"{WS}/x")
    params = {**rig.common(), "lease": lease, "operations": [{"files": [mapping]}]}
    spliced = json.dumps(params).replace("@CUT", "\\ud83d")
    before = await rig.request_count()
    line = json.dumps({"jsonrpc": "2.0", "id": "cut-2", "method": "environmentSyncIn"})
    await rig.host.send_raw(f'{line[:-1]}, "params": {spliced}}}\n'.encode())
    refused = await rig.host.response_to("cut-2")
    assert refused["error"]["code"] == INVALID_PARAMS
    assert "params.operations[0].files[0].sourcePath holds a lone" in refused["error"]["message"]
    assert await rig.request_count() == before


# --- host paths in sync --------------------------------------------------------------------------


def file_mapping(source: str | Path, target: str | Path, **extra: Any) -> dict[str, Any]:
    return {"sourcePath": str(source), "targetPath": str(target), "kind": "file", **extra}


def dir_mapping(source: str | Path, target: str | Path, **extra: Any) -> dict[str, Any]:
    return {"sourcePath": str(source), "targetPath": str(target), "kind": "directory", **extra}


async def make_remote_files(rig: Rig) -> None:
    script = (
        f"mkdir -p {WS}/tree/sub && printf 'remote\\n' > {WS}/out.txt"
        f" && printf 'kept\\n' > {WS}/tree/sub/keep"
    )
    made = await rig.execute(command="bash", args=["-c", script])
    assert made["exitCode"] == 0, made


async def test_sync_out_through_a_symlinked_parent_lands_where_the_link_points(
    rig: Rig, tmp_path: Path
) -> None:
    await make_remote_files(rig)
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    done = await rig.sync("Out", file_mapping(f"{WS}/out.txt", link / "out.txt"))
    assert done["result"]["operations"][0]["filesTransferred"] == 1, done
    assert (real / "out.txt").read_bytes() == b"remote\n"
    assert stat.S_IMODE((real / "out.txt").stat().st_mode) == 0o600
    done = await rig.sync("Out", dir_mapping(f"{WS}/tree", link / "tree"))
    assert done["result"]["operations"][0]["filesTransferred"] == 1, done
    assert (real / "tree" / "sub" / "keep").read_bytes() == b"kept\n"
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link itself untouched
    assert sorted(p.name for p in real.iterdir()) == ["out.txt", "tree"]  # no temp folder left


async def test_sync_out_replaces_a_final_symlink_instead_of_writing_through_it(
    rig: Rig, tmp_path: Path
) -> None:
    await make_remote_files(rig)
    victim = tmp_path / "victim.txt"
    victim.write_text("do not touch\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out.txt").symlink_to(victim)
    done = await rig.sync("Out", file_mapping(f"{WS}/out.txt", dest / "out.txt"))
    assert "result" in done, done
    assert not (dest / "out.txt").is_symlink()  # the link was replaced by the download
    assert (dest / "out.txt").read_bytes() == b"remote\n"
    assert victim.read_text() == "do not touch\n"
    # A directory target that is a link is refused (docs/protocol.md 5.6), target untouched.
    (dest / "tree").symlink_to(tmp_path)
    refused = await rig.sync("Out", dir_mapping(f"{WS}/tree", dest / "tree"))
    assert refused["error"]["code"] == WORKER_ERROR
    assert (dest / "tree").is_symlink() and not (tmp_path / "sub").exists()
    assert temp_leftovers(dest, tmp_path) == []


async def test_dot_dot_in_host_paths_resolves_like_the_os_and_never_leaves_temp_files(
    rig: Rig, tmp_path: Path
) -> None:
    await make_remote_files(rig)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / "in.txt").write_bytes(b"from b\n")
    sent = await rig.sync("In", file_mapping(f"{a}/../b/in.txt", f"{WS}/in.txt"))
    assert "result" in sent, sent
    echoed = await rig.execute(command="cat", args=[f"{WS}/in.txt"])
    assert echoed["stdout"] == "from b\n"
    got = await rig.sync("Out", file_mapping(f"{WS}/out.txt", f"{a}/../b/back.txt"))
    assert "result" in got, got
    assert (b / "back.txt").read_bytes() == b"remote\n"
    assert sorted(p.name for p in a.iterdir()) == []
    # A file target that resolves to a directory is refused; nothing is replaced or left.
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    refused = await rig.sync("Out", file_mapping(f"{WS}/out.txt", f"{b}/.."))
    assert refused["error"]["code"] == WORKER_ERROR
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


async def test_follow_symlinks_confines_to_the_real_source_behind_a_symlinked_parent(
    rig: Rig, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    source = elsewhere / "src"
    source.mkdir(parents=True)
    (source / "f").write_bytes(b"inside\n")
    (source / "inside").symlink_to("f")
    (elsewhere / "secret.txt").write_text("secret\n")
    (source / "escape").symlink_to("../secret.txt")
    (tmp_path / "lp").symlink_to(elsewhere)
    mapping = dir_mapping(tmp_path / "lp" / "src", f"{WS}/src", followSymlinks=True)
    await rig.lease()
    before = await rig.request_count()
    refused = await rig.sync("In", mapping)
    assert refused["error"]["code"] == WORKER_ERROR
    assert "secret" not in refused["error"]["message"]
    assert await rig.request_count() == before  # the batch failed before any upload
    (source / "escape").unlink()
    sent = await rig.sync("In", mapping)
    assert sent["result"]["operations"][0]["filesTransferred"] == 2, sent
    check = await rig.execute(
        command="bash", args=["-c", f"test ! -L {WS}/src/inside && cat {WS}/src/inside"]
    )
    assert check["stdout"] == "inside\n"  # dereferenced into a regular file


async def test_sync_out_creates_missing_parent_directories_private(
    rig: Rig, tmp_path: Path
) -> None:
    # Spec 5.6: new directories get the mapping's mode, else 0700 (mkdir -p would give 0755).
    await make_remote_files(rig)
    for kind, source, mode in (
        ("file", f"{WS}/out.txt", None),
        ("directory", f"{WS}/tree", None),
        ("directory", f"{WS}/tree", 0o750),
    ):
        existing = tmp_path / f"{kind}-{mode}"
        existing.mkdir()
        existing_mode = stat.S_IMODE(existing.stat().st_mode)
        target = existing / "new1" / "new2" / "target"
        mapping: dict[str, Any] = {"sourcePath": source, "targetPath": str(target), "kind": kind}
        if mode is not None:
            mapping["mode"] = mode
        done = await rig.sync("Out", mapping)
        assert "result" in done, done
        expected = 0o700 if mode is None else mode
        for created in (target.parent.parent, target.parent):
            assert stat.S_IMODE(created.stat().st_mode) == expected, (kind, mode, created)
        assert stat.S_IMODE(existing.stat().st_mode) == existing_mode  # only new ones change
    # Through "..": the directory ".." names already exists and keeps its mode.
    before = stat.S_IMODE(tmp_path.stat().st_mode)
    target = tmp_path / "fresh" / ".." / "via-dotdot" / "target"
    done = await rig.sync("Out", dir_mapping(f"{WS}/tree", target, mode=0o750))
    assert "result" in done, done
    assert stat.S_IMODE(tmp_path.stat().st_mode) == before
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "via-dotdot").stat().st_mode) == 0o750
