"""CI runs the live smoke tests (``live_tests/``, outside ``testpaths``) against the emulator.

``pytest live_tests`` runs in a subprocess with ``CREATEOS_LIVE_TEST=emulator`` and must pass
with more than zero tests, the warm-release, egress and overlapping-sync tests among them; the
egress test runs once more with ``CREATEOS_EGRESS_ALLOWLIST`` set (a restrictive list: the
sandbox is loopback only); without the variable every live test is skipped; a request for a
real account without its variables is refused. ``CREATEOS_EGRESS_ALLOWLIST`` parsing and the
lease helper's cleanup are checked directly: a destroy that fails fails the test that used it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from devtools.demo_hosts import open_worker_host
from live_tests.session import CleanupFailed, LiveSession
from live_tests.settings import LiveSettingsError, load_settings
from provider.emulator import Emulator

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600
# Every live test file must be part of the emulator run (a new one with a typo'd name or a
# collection error would otherwise only lower the count).
LIVE_TEST_FILES = ("test_smoke", "test_interactive", "test_doctor")


def run_live_tests(
    tmp_path: Path, *pytest_args: str, **env: str
) -> tuple[int, dict[str, int], str]:
    """``pytest live_tests [pytest_args]`` in a subprocess; returns its code, junit counts and
    output (the junit report stays at ``tmp_path / "live.xml"``)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CREATEOS_")}
    junit = tmp_path / "live.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "live_tests",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "-q",
            *pytest_args,
        ],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    counts: dict[str, int] = {}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    return result.returncode, counts, result.stdout + result.stderr


def passed_cases(junit: Path) -> set[str]:
    """``module.test_name`` of every test case the junit report shows as passed."""
    names: set[str] = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            names.add(f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}")
    return names


def test_live_smoke_passes_against_the_emulator(tmp_path: Path) -> None:
    code, counts, output = run_live_tests(tmp_path, CREATEOS_LIVE_TEST="emulator")
    assert code == 0, output
    assert counts["tests"] > 0, output
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, output
    passed = passed_cases(tmp_path / "live.xml")
    for module in LIVE_TEST_FILES:
        assert any(name.startswith(f"{module}.") for name in passed), (module, sorted(passed))
    assert {
        "test_interactive.test_duplex_channel_echoes_bytes_then_stops_and_closes",
        "test_interactive.test_login_pty_is_a_120x30_terminal",
        "test_smoke.test_the_egress_allowlist_is_the_sandboxs",
        "test_smoke.test_a_warm_release_resumes_the_same_sandbox_with_its_files",
        "test_smoke.test_a_sync_in_and_a_sync_out_overlap_on_one_lease",
        "test_doctor.test_the_doctor_finds_every_assumption_holding",
    } <= passed, sorted(passed)


def test_live_smoke_with_an_egress_allowlist_on_the_emulator(tmp_path: Path) -> None:
    code, counts, output = run_live_tests(
        tmp_path,
        "-k",
        "egress_allowlist or config_validates",
        CREATEOS_LIVE_TEST="emulator",
        CREATEOS_EGRESS_ALLOWLIST=" Example.COM, ,10.0.0.0/8 ",
    )
    assert code == 0, output
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, output
    assert passed_cases(tmp_path / "live.xml") == {
        "test_smoke.test_config_validates_without_touching_the_network",
        "test_smoke.test_the_egress_allowlist_is_the_sandboxs",
    }, output


def test_the_egress_allowlist_variable_is_normalized_and_refused_by_position() -> None:
    base = {"CREATEOS_LIVE_TEST": "emulator"}
    assert load_settings(base).egress_allowlist == ()
    spaced = {**base, "CREATEOS_EGRESS_ALLOWLIST": " Example.COM, ,10.0.0.0/8,example.com,"}
    assert load_settings(spaced).egress_allowlist == ("example.com", "10.0.0.0/8")
    real = {
        "CREATEOS_LIVE_TEST": "1",
        "CREATEOS_API_URL": "https://api.example",
        "CREATEOS_API_KEY": "k",
        "CREATEOS_SHAPE": "s-1vcpu-1gb",
        "CREATEOS_EGRESS_ALLOWLIST": "*",
    }
    assert load_settings(real).egress_allowlist == ("*",)
    bad = {**base, "CREATEOS_EGRESS_ALLOWLIST": "github.com,sk-pasted-secret value"}
    with pytest.raises(LiveSettingsError) as caught:
        load_settings(bad)
    assert "CREATEOS_EGRESS_ALLOWLIST entry 2 is not an egress rule" in str(caught.value)
    assert "sk-pasted-secret" not in str(caught.value)


def test_live_smoke_is_skipped_unless_asked_for(tmp_path: Path) -> None:
    code, counts, output = run_live_tests(tmp_path)
    assert code == 0, output
    assert counts["tests"] > 0 and counts["skipped"] == counts["tests"], output
    assert "CREATEOS_LIVE_TEST=1" in output or "opt-in" in output


def test_a_real_run_without_its_variables_fails_naming_them(tmp_path: Path) -> None:
    code, _counts, output = run_live_tests(
        tmp_path, CREATEOS_LIVE_TEST="1", CREATEOS_API_KEY="must-not-be-printed"
    )
    assert code != 0
    assert "CREATEOS_API_URL" in output and "CREATEOS_SHAPE" in output
    assert "must-not-be-printed" not in output


@pytest.mark.anyio
async def test_a_failed_destroy_fails_the_lease_block(emulator: Emulator, tmp_path: Path) -> None:
    config = {
        "apiUrl": emulator.base_url,
        "apiKey": "test-key",
        "shape": "s-1vcpu-1gb",
        "timeoutMs": 20_000,
        "reuseLease": True,
    }
    async with open_worker_host("python", log_dir=tmp_path) as host:
        live = LiveSession(host=host, config=config, emulator=emulator)
        with pytest.raises(CleanupFailed) as caught:
            async with live.reusable_lease() as lease:
                sandbox_id = lease["providerLeaseId"]
                await emulator.admin.add_fault(
                    "DELETE",
                    r"^/v1/sandboxes/[^/]+$",
                    times=50,
                    status=500,
                    body={"status": "error"},
                )
        assert sandbox_id in str(caught.value)
        assert "may be left behind" in str(caught.value)
        assert "test-key" not in str(caught.value)
        await emulator.admin.clear_faults()
        receipt = await live.destroy(lease)
        assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
