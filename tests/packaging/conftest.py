"""Shared by the packaging tests: one build of the npm packages per session.

`built` runs `packaging/build.py --platforms host` once per session with the shared wheel cache
(.cache/wheels/): the first run on a machine downloads the host's wheels (about 20 MB), later
runs need no network. test_build.py checks the layout of what it builds, test_install.py
installs it the way the host does and starts it.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "packaging" / "build.py"
BUILD_BUDGET_S = 900  # a cold machine downloads the host's wheels first
INSTALL_BUDGET_S = 300  # test_install.py's npm install of what was built


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the session's build may pay for it (and for an install of it) in its
    setup: its timeout leaves room for both budgets, which run out first with their message."""
    for item in items:
        if "built" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(BUILD_BUDGET_S + INSTALL_BUDGET_S + 120))


def host_key() -> str:
    """This machine's runtime package key, as the package names spell it (linux-x64-gnu...)."""
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    arch = cpu[platform.machine().lower()]
    system = platform.system().lower()  # linux, darwin (sys.platform would be unreachable to mypy)
    if system == "linux":
        return f"linux-{arch}-{'gnu' if platform.libc_ver()[0] == 'glibc' else 'musl'}"
    return f"{system}-{arch}"


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{tarball name: path} of the main package and this machine's runtime package."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH")
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, str(BUILD_SCRIPT), "--platforms", "host", "--out", str(out)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=BUILD_BUDGET_S, check=False
    )
    assert done.returncode == 0, done.stderr
    return {path.name: path for path in out.glob("*.tgz")}
