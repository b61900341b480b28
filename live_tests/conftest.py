"""Live smoke fixtures: opt-in via ``CREATEOS_LIVE_TEST`` (see :mod:`live_tests.settings`).

Every test gets a :class:`~live_tests.session.LiveSession` on a worker started under the chosen
host; with ``CREATEOS_LIVE_TEST=emulator`` the embedded emulator serves it. Reports are scrubbed
of the API key before pytest prints them.

``live_routes`` is the same session with a :class:`~live_tests.session.RouteLog` of the
worker's ``duplexChannel.*`` / ``loginPty.*`` notifications. It always runs the worker under the
Python stdio host, whatever ``CREATEOS_LIVE_HOST`` says: the Node test peer
(host/peer-driver.mjs) relays calls and ``execute.log`` only, not the worker manager's route
sessions (``openDuplexChannel`` / ``openLoginPtySession``), and the manager kills a worker that
sends a frame for a route it did not open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from devtools.demo_hosts import HostChoice, HostReport, open_worker_host
from live_tests.session import TIMEOUT_MS, LiveSession, RouteLog
from live_tests.settings import (
    SKIP_REASON,
    LiveSettings,
    LiveSettingsError,
    live_mode,
    load_settings,
)
from provider.emulator import BwrapUnavailable, Emulator

REDACTED = "***"
_secrets: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        off = live_mode() == "off"
    except LiveSettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    if off:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Never let the key reach the terminal: scrub it from failure text and captured output."""
    report = yield
    if _secrets:
        if report.longrepr is not None:
            text = str(report.longrepr)
            if any(secret in text for secret in _secrets):
                report.longrepr = _scrub(text)
        report.sections = [(name, _scrub(content)) for name, content in report.sections]
    return report


def _scrub(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, REDACTED)
    return text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def live_settings() -> LiveSettings:
    try:
        settings = load_settings()
    except LiveSettingsError as exc:
        pytest.fail(str(exc), pytrace=False)
    _secrets.extend(key for key in (settings.api_key, settings.second_api_key) if key)
    return settings


@pytest.fixture
async def live(live_settings: LiveSettings, tmp_path: Path) -> AsyncIterator[LiveSession]:
    """A started worker (and, in emulator mode, the emulator) for one test."""
    async with _live_session(live_settings, tmp_path, live_settings.host, None) as session:
        yield session


@pytest.fixture
async def live_routes(live_settings: LiveSettings, tmp_path: Path) -> AsyncIterator[LiveSession]:
    """:func:`live` under the Python stdio host, with ``session.routes`` filled as frames come."""
    async with _live_session(live_settings, tmp_path, "python", RouteLog()) as session:
        yield session


@asynccontextmanager
async def _live_session(
    live_settings: LiveSettings, tmp_path: Path, choice: HostChoice, routes: RouteLog | None
) -> AsyncIterator[LiveSession]:
    report = HostReport()
    async with AsyncExitStack() as stack:
        emulator: Emulator | None = None
        api_url = live_settings.api_url
        if live_settings.mode == "emulator":
            emulator = Emulator(api_keys=[live_settings.api_key])
            try:
                await stack.enter_async_context(emulator)
            except BwrapUnavailable as exc:
                pytest.skip(f"the emulator cannot sandbox here: {exc}")
            api_url = emulator.base_url
        config: dict[str, Any] = {
            "apiUrl": api_url,
            "apiKey": live_settings.api_key,
            "shape": live_settings.shape,
            "timeoutMs": TIMEOUT_MS,
            "reuseLease": True,
        }
        if live_settings.rootfs:
            config["rootfs"] = live_settings.rootfs
        if live_settings.egress_allowlist:
            config["egressAllowlist"] = list(live_settings.egress_allowlist)
        host = await stack.enter_async_context(
            open_worker_host(choice, log_dir=tmp_path, report=report, on_notification=routes)
        )
        yield LiveSession(host=host, config=config, emulator=emulator, routes=routes)
    assert report.processes_left == [], f"worker processes outlived the stop: {report}"
