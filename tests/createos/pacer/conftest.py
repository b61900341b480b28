"""Fixtures of the pacer tests: the virtual-time loop for every anyio test here, and the two
bucket kinds (one process's, and the shared file's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.createos.pacer.virtual_time import VirtualTimeLoop


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": VirtualTimeLoop}


@pytest.fixture(params=["in-process", "shared-file"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "in-process" else tmp_path / "run"
