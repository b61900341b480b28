"""Shell quoting, the execute wrapper, the sync guard and the single-file placement texts,
checked by running real bash (the byte-range part texts: tests/driver/test_sync_parts.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provider.driver.commands import sandbox_text
from provider.errors import RequestRefused
from tests.driver.shell_helpers import BASH, make_tree, run_bash
from tests.processes import reap

HOSTILE = [
    "a'; touch /bad; echo '",
    "$(touch /bad)",
    "`touch /bad`",
    "with space",
    "two\nlines",
    "",
    "'",
    '"double" \\back\\slash',
    "${HOME} $HOME * ? [a] ~ ! # & | ; < >",
    "-n",
    "--",
    "ünïcødé €𝄞 日本",
    "\t\r\x01\x7f",
]


def wrapper(
    tmp_path: Path,
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: sandbox_text.StdinMode = "none",
    stdin_path: str | None = None,
    stdin_length: int = 0,
    gate_seconds: int = 60,
) -> str:
    return sandbox_text.build_wrapper_script(
        command=command,
        args=args,
        env=env or {},
        cwd=cwd,
        gate_seconds=gate_seconds,
        stdin="file" if stdin_path is not None else stdin,
        stdin_path=stdin_path,
        stdin_length=stdin_length,
    )


def test_quote_wraps_and_escapes_single_quotes() -> None:
    assert sandbox_text.quote("abc") == "'abc'"
    assert sandbox_text.quote("") == "''"
    assert sandbox_text.quote("it's") == "'it'\"'\"'s'"


def test_quote_refuses_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        sandbox_text.quote("a\0b")


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_survives_bash_verbatim(value: str) -> None:
    result = run_bash(f"printf '%s' {sandbox_text.quote(value)}")
    assert result.returncode == 0
    assert result.stdout.decode() == value


def test_spec_example_text_exactly() -> None:
    script = sandbox_text.build_wrapper_script(
        command="printf",
        args=["a'; touch /bad; echo '"],
        env={"MESSAGE": "$(touch /bad)"},
        cwd="/srv/my dir",
        gate_seconds=320,
    )
    assert script.split("\n") == [
        "timeout 320 cat >/dev/null || exit 125",
        "cd -- '/srv/my dir' || exit",
        "exec env MESSAGE='$(touch /bad)' 'printf' 'a'\"'\"'; touch /bad; echo '\"'\"'' </dev/null",
    ]


def test_stdin_modes_without_cwd_have_no_cd() -> None:
    piped = sandbox_text.build_wrapper_script(
        command="cat", args=[], env={}, cwd=None, gate_seconds=5, stdin="pipe", stdin_length=7
    ).split("\n")
    assert piped == [
        't=$(mktemp /tmp/paperclip-stdin-XXXXXXXXXX) && exec 3>"$t" 4<"$t" 5<"$t" '
        '&& rm -f -- "$t" || exit 125',
        'timeout 5 head -c 7 >&3 && exec 3>&- && [ "$(wc -c <&5)" -eq 7 ] && exec 5<&- || exit 125',
        "exec env 'cat' <&4 4<&-",
    ]
    with pytest.raises(ValueError, match="stdin_length"):
        sandbox_text.build_wrapper_script(
            command="cat", args=[], env={}, cwd=None, gate_seconds=5, stdin="pipe"
        )
    staged = sandbox_text.build_wrapper_script(
        command="cat",
        args=[],
        env={},
        cwd=None,
        gate_seconds=5,
        stdin="file",
        stdin_path="/tmp/paperclip-stdin-x",
    ).split("\n")
    assert staged == [
        "exec 4<'/tmp/paperclip-stdin-x' && rm -f -- '/tmp/paperclip-stdin-x' || exit 125",
        "timeout 5 cat >/dev/null || exit 125",
        "exec env 'cat' <&4 4<&-",
    ]
    with pytest.raises(ValueError, match="stdin_path"):
        sandbox_text.build_wrapper_script(
            command="cat", args=[], env={}, cwd=None, gate_seconds=5, stdin="file"
        )


def test_hostile_args_arrive_verbatim(tmp_path: Path) -> None:
    args = ["%s\\0", *HOSTILE]
    result = run_bash(wrapper(tmp_path, "printf", args))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == HOSTILE
    assert not Path("/bad").exists()


def test_hostile_env_values_arrive_verbatim(tmp_path: Path) -> None:
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    env["MESSAGE"] = "$(touch /bad)"
    result = run_bash(wrapper(tmp_path, "env", ["-0"], env=env))
    assert result.returncode == 0, result.stderr
    seen = dict(item.split("=", 1) for item in result.stdout.decode().split("\0")[:-1])
    for name, value in env.items():
        assert seen[name] == value
    assert not Path("/bad").exists()


@pytest.mark.parametrize("dirname", ["my dir", "it's", "$(x)", "new\nline", "`y`", "ünï €"])
def test_hostile_cwd_is_entered(tmp_path: Path, dirname: str) -> None:
    target = tmp_path / dirname
    target.mkdir()
    result = run_bash(wrapper(tmp_path, "pwd", ["-P"], cwd=str(target)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == f"{target}\n"


def test_missing_cwd_fails_without_running_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = run_bash(wrapper(tmp_path, "touch", [str(marker)], cwd=str(tmp_path / "nope")))
    assert result.returncode != 0
    assert not marker.exists()


def test_staged_stdin_is_the_command_input_and_is_unlinked(tmp_path: Path) -> None:
    staged = tmp_path / "stdin"
    content = b"line one\n\xe2\x82\xac 'q' $(x)\n"
    staged.write_bytes(content)
    result = run_bash(wrapper(tmp_path, "cat", [], stdin_path=str(staged)))
    assert result.returncode == 0
    assert result.stdout == content
    assert not staged.exists()


def test_piped_stdin_is_the_command_input_exactly(tmp_path: Path) -> None:
    content = bytes(range(256)) * 64 + b"no newline"
    script = wrapper(tmp_path, "cat", [], stdin="pipe", stdin_length=len(content))
    result = run_bash(script, stdin=content)
    assert result.returncode == 0, result.stderr
    assert result.stdout == content


def test_piped_stdin_starts_the_command_without_eof(tmp_path: Path) -> None:
    """The exact length arrived: the command runs while the pipe is still open."""
    script = wrapper(tmp_path, "cat", [], stdin="pipe", stdin_length=3)
    proc = subprocess.Popen([BASH, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"abc")
        proc.stdin.flush()
        assert proc.stdout.read() == b"abc"  # EOF of the command's own stdin, not the pipe's
        assert proc.wait(timeout=60) == 0
    finally:
        reap(proc)


def test_short_piped_stdin_never_starts_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = wrapper(tmp_path, "touch", [str(marker)], stdin="pipe", stdin_length=10)
    result = run_bash(script, stdin=b"short")
    assert result.returncode == 125
    assert not marker.exists()


def test_without_stdin_the_command_reads_dev_null(tmp_path: Path) -> None:
    result = run_bash(wrapper(tmp_path, "readlink", ["/proc/self/fd/0"]), stdin=b"ignored")
    assert result.stdout == b"/dev/null\n"


@pytest.mark.parametrize("name", ["run=me", "-dash"])
def test_commands_env_would_misread_still_run(tmp_path: Path, name: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    program = bindir / name
    program.write_text('#!/bin/sh\nprintf \'%s|\' "$0" "$@"; printf \'%s\' "$X"\n')
    program.chmod(0o755)
    script = wrapper(tmp_path, str(program), ["a b", "-c"], env={"X": "x=1"})
    result = run_bash(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == f"{program}|a b|-c|x=1"
    # Found through PATH too, with the wrapper's own environment.
    by_name = wrapper(tmp_path, name, [], env={"PATH": f"{bindir}:/usr/bin:/bin", "X": "y"})
    result = run_bash(by_name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().endswith("|y")


def test_without_eof_the_command_never_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = wrapper(tmp_path, "touch", [str(marker)], gate_seconds=1)
    proc = subprocess.Popen([BASH, "-c", script], stdin=subprocess.PIPE)
    try:
        assert proc.wait(timeout=60) == 125  # the bounded wait ran out
        assert not marker.exists()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_closing_stdin_later_releases_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = wrapper(tmp_path, "touch", [str(marker)], gate_seconds=600)
    proc = subprocess.Popen([BASH, "-c", script], stdin=subprocess.PIPE)
    try:
        assert proc.poll() is None
        assert not marker.exists()
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert marker.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", ["BAD;KEY", "1ABC", "A-B", "", "A B", "Ä", "A\0", "X\n"])
def test_bad_env_names_are_refused_without_echoing_values(name: str) -> None:
    with pytest.raises(RequestRefused, match="env variable name") as info:
        sandbox_text.validate_env({name: "s3cret-value"})
    assert "s3cret-value" not in str(info.value)


def test_env_value_rules() -> None:
    with pytest.raises(RequestRefused, match="OK") as info:
        sandbox_text.validate_env({"OK": "se\0cret"})
    assert "se\0cret" not in str(info.value)
    with pytest.raises(RequestRefused, match="int"):
        sandbox_text.validate_env({"N": 5})
    with pytest.raises(RequestRefused):
        sandbox_text.validate_env(["A=1"])
    assert sandbox_text.validate_env({"_a1": "", "B": "x"}) == {"_a1": "", "B": "x"}


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("command", {"command": "a\0b"}),
        ("command", {"command": ""}),
        ("args", {"args": ["ok", "b\0"]}),
        ("cwd", {"cwd": "/tmp/\0"}),
        ("env", {"env": {"BAD;KEY": "v"}}),
    ],
)
def test_wrapper_refuses_nul_and_bad_input(field: str, kwargs: dict[str, object]) -> None:
    params: dict[str, object] = {
        "command": "true",
        "args": [],
        "env": {},
        "cwd": None,
        "gate_seconds": 1,
    }
    params.update(kwargs)
    with pytest.raises(RequestRefused):
        sandbox_text.build_wrapper_script(**params)  # type: ignore[arg-type]


# --- confinement -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "/paperclip-workspace/../secret",
        "relative",
        "paperclip-workspace/a",
        "/paperclip-workspace-other/file",
        "/paperclip-workspace/a/../../etc",
        "/paperclip-workspace/..",
        "/paperclip-workspace/a\0b",
        "",
        "/",
        "//paperclip-workspace-x",
    ],
)
def test_unconfined_sandbox_paths_are_refused(path: str) -> None:
    with pytest.raises(RequestRefused):
        sandbox_text.confine_sandbox_path(path)


@pytest.mark.parametrize(
    ("path", "normalized"),
    [
        ("/paperclip-workspace", "/paperclip-workspace"),
        ("/paperclip-workspace/", "/paperclip-workspace"),
        ("/paperclip-workspace/a/./b", "/paperclip-workspace/a/b"),
        ("/paperclip-workspace//a//b/", "/paperclip-workspace/a/b"),
        ("//paperclip-workspace/x", "/paperclip-workspace/x"),
        ("/paperclip-workspace/..hidden", "/paperclip-workspace/..hidden"),
    ],
)
def test_confined_sandbox_paths_are_normalized(path: str, normalized: str) -> None:
    assert sandbox_text.confine_sandbox_path(path) == normalized


def test_confinement_message_names_the_rule() -> None:
    with pytest.raises(RequestRefused, match=r"'\.\.'"):
        sandbox_text.confine_sandbox_path("/paperclip-workspace/../x")
    with pytest.raises(RequestRefused, match="outside /paperclip-workspace"):
        sandbox_text.confine_sandbox_path("/paperclip-workspace-other/file")
    with pytest.raises(RequestRefused, match="not absolute"):
        sandbox_text.confine_sandbox_path("relative")


# --- the in-sandbox guard, run by real bash against a temporary root ----------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def guard_run(path: str, root: Path, *, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    script = sandbox_text.guard_snippet(path, str(root)) + '\nprintf "%s" "$resolved"'
    result = run_bash(script, env=env)
    return result.returncode, result.stdout.decode()


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("", ""),
        ("/sub", "/sub"),
        ("/sub/new/file", "/sub/new/file"),
        ("/link-in/x", "/sub/x"),
        ("/missing/../sub", "/sub"),
    ],
)
def test_guard_accepts_paths_resolving_inside(tree: Path, relative: str, expected: str) -> None:
    code, resolved = guard_run(f"{tree}{relative}", tree)
    assert code == 0
    assert resolved == f"{tree}{expected}"


@pytest.mark.parametrize(
    "relative",
    ["/link-out", "/link-out/secret", "/abs-out", "/../outside/secret", "-other", "/sub/../../x"],
)
def test_guard_refuses_paths_resolving_outside(tree: Path, relative: str) -> None:
    code, resolved = guard_run(f"{tree}{relative}", tree)
    assert code == 1
    assert resolved == ""


def test_guard_refuses_when_the_root_is_a_link(tree: Path) -> None:
    alias = tree.parent / "ws-alias"
    alias.symlink_to(tree)
    code, _ = guard_run(f"{alias}/sub", alias)
    assert code == 1


def test_guard_fails_closed_without_realpath(tree: Path) -> None:
    code, _ = guard_run(f"{tree}/sub", tree, env={"PATH": "/nonexistent"})
    assert code == 1


def test_guard_snippet_uses_the_workspace_root() -> None:
    text = sandbox_text.guard_snippet("/paperclip-workspace/a'b")
    assert "realpath -m -- '/paperclip-workspace/a'\"'\"'b'" in text
    assert "'/paperclip-workspace'|'/paperclip-workspace'/*)" in text


# --- the control commands, run against a temporary root --------------------------------------


def test_syncin_file_moves_scratch_with_mode(tree: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch file"
    scratch.write_bytes(b"\x00\xff\x80\n\r")
    target = tree / "new dir" / "it's.bin"
    result = run_bash(sandbox_text._syncin_file(str(scratch), str(target), 0o600, str(tree)))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == b"\x00\xff\x80\n\r"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not scratch.exists()


def test_syncin_file_to_escaping_target_leaves_scratch(tree: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.write_text("x")
    result = run_bash(
        sandbox_text._syncin_file(str(scratch), str(tree / "link-out" / "f"), 0o644, str(tree))
    )
    assert result.returncode == 1
    assert scratch.exists()
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret"]


def test_syncin_dir_extracts_and_sets_top_mode(tree: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "keep").write_text("kept")
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(source / "keep", arcname="./keep")
    target = tree / "dest"
    result = run_bash(sandbox_text._syncin_dir(str(archive), str(target), 0o750, str(tree)))
    assert result.returncode == 0, result.stderr
    assert (target / "keep").read_text() == "kept"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750


def test_public_command_builders_quote_everything() -> None:
    assert "chmod 0644 -- '/tmp/s'" in sandbox_text.syncin_file_command(
        "/tmp/s", "/paperclip-workspace/f", 0o644
    )
    assert 'chmod 0755 -- "$resolved"' in sandbox_text.syncin_dir_command(
        "/tmp/s", "/paperclip-workspace", 0o755
    )
    assert "tar -xf '/tmp/s'\"'\"'x' -C" in sandbox_text.syncin_dir_command(
        "/tmp/s'x", "/paperclip-workspace", 0o755
    )
    with pytest.raises(ValueError):
        sandbox_text.syncin_file_command("/tmp/s", "/paperclip-workspace/f", 0o1777)
    assert [sandbox_text.octal_mode(m) for m in (0, 0o640, 0o777)] == ["0000", "0640", "0777"]
    for bad in (-1, 0o1000, True):
        with pytest.raises(ValueError, match=r"mode must be an integer in \[0, 0o777\]"):
            sandbox_text.octal_mode(bad)
