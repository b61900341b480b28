"""``python -m provider doctor`` as a subprocess against a scripted endpoint: one broken
assumption fails the run naming it, failing checks and Ctrl-C still delete the sandbox, an
unconfirmed delete and a lost create answer are handled, usage errors send nothing."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from provider.doctor import cli
from provider.doctor.checks_sandbox import retry_after
from provider.doctor.report import ASSUMPTIONS
from provider.doctor.wire import Seen
from tests.doctor.conftest import (
    REPO_ROOT,
    RUN_TIMEOUT_S,
    Ran,
    doctor_argv,
    doctor_env,
    key_file,
    run_doctor,
)
from tests.doctor.fake_api import KEY, OTHER_KEY, FakeCreateOS

FAST = ("--auto-pause-seconds", "1", "--stream-seconds", "0.6")
SANDBOX = r"/v1/sandboxes/[^/]+"


def args(origin: str, tmp_path: Path, *extra: str, second: bool = True) -> list[str]:
    argv = ["--api-url", origin, "--api-key-file", key_file(tmp_path, "key", KEY), *FAST]
    if second:
        argv += ["--second-api-key-file", key_file(tmp_path, "other", OTHER_KEY)]
    return argv + list(extra)


def assert_no_key(ran: Ran) -> None:
    for key in (KEY, OTHER_KEY):
        assert key not in ran.stdout + ran.stderr


def assert_deleted_once(api: FakeCreateOS, ran: Ran) -> None:
    assert api.count("DELETE", SANDBOX) == 1
    assert "sandboxes created: 1, deleted: 1" in ran.stdout


def outcomes(ran: Ran) -> dict[str, str]:
    """Assumption text -> outcome, for every row of the table."""
    found = {}
    for key, text in ASSUMPTIONS.items():
        found[key] = ran.row(text).split()[0]
    return found


def assert_only_violation(ran: Ran, key: str, observed: str) -> None:
    """The run exits 1 with ``key`` violated (its row naming ``observed``), the 429 check
    skipped and every other check ok."""
    assert ran.code == cli.EXIT_VIOLATED, ran
    assert observed in ran.row(ASSUMPTIONS[key])
    found = outcomes(ran)
    assert found.pop(key) == "violated"
    assert found.pop("retry_after") == "skipped"
    assert set(found.values()) == {"ok"}, ran.stdout


def test_a_403_for_another_keys_sandbox_fails_the_run_and_names_it(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.foreign_status = 403

    ran = run_doctor(args(origin, tmp_path))

    assert_only_violation(ran, "foreign_sandbox", "HTTP 403")
    assert api.count("POST", "/v1/sandboxes") == 1
    assert_deleted_once(api, ran)
    assert_no_key(ran)


def test_a_sandbox_without_a_guest_agent_is_a_violation_and_the_run_goes_on(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.guest_agent = False

    ran = run_doctor(args(origin, tmp_path))

    assert_only_violation(ran, "guest_agent_pause", "connection refused")
    assert_deleted_once(api, ran)


def test_a_sandbox_that_pauses_as_the_next_exec_arrives_still_passes_the_agent_check(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.agent_pause_late = True

    ran = run_doctor(args(origin, tmp_path))

    assert ran.row(ASSUMPTIONS["guest_agent_pause"]).startswith("ok"), ran.stdout
    assert ran.code == 0, ran


def test_without_a_second_key_that_check_is_skipped_and_a_429_seen_is_reported(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.limit_once = "0"
    argv = ["--api-url", origin, *FAST]

    ran = run_doctor(argv, CREATEOS_API_KEY=KEY)

    assert ran.code == cli.EXIT_OK, ran
    assert "no --second-api-key-file" in ran.row(ASSUMPTIONS["foreign_sandbox"])
    assert ran.row(ASSUMPTIONS["retry_after"]).startswith("ok")
    assert "Retry-After (first: 0)" in ran.stdout
    assert api.count("DELETE", SANDBOX) == 1
    assert_no_key(ran)


def test_a_silent_connect_is_a_violation_and_sse_framing_is_reported(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.connect_heartbeats = False
    api.sse = True

    ran = run_doctor(args(origin, tmp_path))

    assert ran.code == cli.EXIT_VIOLATED, ran
    connect = ran.row(ASSUMPTIONS["connect_heartbeat"])
    assert connect.startswith("violated") and "no heartbeat during a silent 0.6 s" in connect
    exec_row = ran.row(ASSUMPTIONS["exec_heartbeat"])
    assert exec_row.startswith("ok") and "framing seen: comment, sse" in exec_row, exec_row
    assert ran.row(ASSUMPTIONS["exec_stream_end"]).startswith("ok")
    assert_deleted_once(api, ran)


def test_a_429_without_retry_after_is_a_violation() -> None:
    seen = [Seen("GET", "/v1/sandboxes", 429, None), Seen("GET", "/v1/sandboxes", 200, None)]
    assert retry_after(seen).outcome == "violated"
    assert retry_after(seen[1:]).outcome == "skipped"


def test_checks_that_raise_become_violations_and_the_sandbox_is_still_deleted(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.fail = {("POST", SANDBOX + "/exec"): 500, ("POST", SANDBOX + "/processes"): 502}

    ran = run_doctor(args(origin, tmp_path))

    assert ran.code == cli.EXIT_VIOLATED, ran
    for key in ("connect_heartbeat", "exec_heartbeat", "exec_stream_end"):
        row = ran.row(ASSUMPTIONS[key])
        assert row.startswith("violated") and "HTTP 50" in row, row
    assert ran.row(ASSUMPTIONS["put_creates_parents"]).startswith("ok")
    assert_deleted_once(api, ran)


def test_ctrl_c_deletes_the_sandbox_and_a_second_one_does_not_stop_that(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.delete_delay = 1.0
    process = subprocess.Popen(
        doctor_argv(*args(origin, tmp_path)),
        cwd=REPO_ROOT,
        env=doctor_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert api.armed.wait(RUN_TIMEOUT_S), "the doctor never reached the idle check"
        process.send_signal(signal.SIGINT)
        assert api.deleting.wait(RUN_TIMEOUT_S), "the doctor never deleted its sandbox"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    ran = Ran(process.returncode, stdout, stderr)

    assert ran.code == cli.EXIT_INTERRUPTED, ran
    assert "interrupted (SIGINT)" in ran.row(ASSUMPTIONS["paused_sandbox"])
    assert "still deleting what was created" in ran.stderr
    assert_deleted_once(api, ran)


def test_an_unconfirmed_delete_is_named_and_exits_4(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.fail = {("DELETE", SANDBOX): 500}

    ran = run_doctor(args(origin, tmp_path, "--deadline", "1"))

    assert ran.code == cli.EXIT_LEFT_BEHIND, ran
    assert "stopped early: the doctor's deadline (1 s) passed" in ran.stdout
    assert "NOT CONFIRMED DELETED" in ran.stdout and "sb_fake1" in ran.stdout
    assert api.count("DELETE", SANDBOX) == 3  # the first attempt and two retries


def test_a_create_whose_answer_is_lost_is_found_by_name_and_deleted(
    fake: tuple[FakeCreateOS, str], tmp_path: Path
) -> None:
    api, origin = fake
    api.drop_create_answer = True

    ran = run_doctor(args(origin, tmp_path))

    assert ran.code == cli.EXIT_INCOMPLETE, ran
    assert "not checked: could not create the sandbox" in ran.stdout
    assert api.boxes["sb_fake1"].status == "destroyed"
    assert_deleted_once(api, ran)


def test_an_unreachable_endpoint_exits_3_and_leaves_nothing(tmp_path: Path) -> None:
    ran = run_doctor(args("http://127.0.0.1:9", tmp_path))

    assert ran.code == cli.EXIT_INCOMPLETE, ran
    assert "connection error" in ran.stdout
    assert "sandboxes created: 0, deleted: 0" in ran.stdout
    assert "NOT CONFIRMED" not in ran.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no API key"),
        (["--api-url", "ftp://example.com"], "--api-url"),
        (["--api-url", "https://api.example.com", "--stream-seconds", "0"], "positive"),
    ],
)
def test_usage_errors_exit_2_before_any_request(
    fake: tuple[FakeCreateOS, str], argv: list[str], message: str
) -> None:
    api, origin = fake
    ran = run_doctor(argv or ["--api-url", origin])

    assert ran.code == cli.EXIT_USAGE, ran
    assert message in ran.stderr
    assert api.log == []


def test_the_same_key_twice_is_refused(fake: tuple[FakeCreateOS, str], tmp_path: Path) -> None:
    api, origin = fake
    same = key_file(tmp_path, "same", KEY)
    ran = run_doctor(["--api-url", origin, "--api-key-file", same, "--second-api-key-file", same])

    assert ran.code == cli.EXIT_USAGE, ran
    assert "same key" in ran.stderr
    assert api.log == []
    assert_no_key(ran)
