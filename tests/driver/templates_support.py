"""Shared pieces of the setup-session and template tests: the host's redaction rules ported
to Python, recorded request bodies, and the steps of a setup session through the real driver."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from tests.driver.conftest import Harness

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
EXPIRES_AT = "2030-01-01T00:00:00.000Z"
SETUP_FILE = "/paperclip-workspace/setup.txt"
MARKER_PATH = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease"


# -- the host's redaction of setup and template metadata (docs/protocol.md H10.4) -------------

# A port of redactEnvironmentCustomImageValue (@paperclipai/shared, environment-custom-images.js).
_SENSITIVE_KEYS = [
    re.compile(pattern, re.IGNORECASE | re.ASCII)
    for pattern in (
        r"auth",
        r"credential",
        r"host",
        r"ip",
        r"^key$",
        r"lease",
        r"password",
        r"private.?key",
        r"sandbox.?id",
        r"secret",
        r"template.?ref",
        r"token",
        r"url",
    )
]
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b", re.ASCII)
_SSH_COMMAND = re.compile(r"\bssh\s+[-\w@.:/]+\b", re.IGNORECASE | re.ASCII)


def host_redact(value: Any) -> Any:
    if isinstance(value, list):
        return [host_redact(entry) for entry in value]
    if isinstance(value, dict):
        return {
            key: "[redacted]"
            if not key.endswith("Redacted") and any(p.search(key) for p in _SENSITIVE_KEYS)
            else host_redact(entry)
            for key, entry in value.items()
        }
    if isinstance(value, str) and (_IPV4.search(value) or _SSH_COMMAND.search(value)):
        return "[redacted]"
    return value


class _Recorder(httpx.AsyncBaseTransport):
    """Passes requests on and records method, path and JSON body of each."""

    def __init__(self, sent: list[tuple[str, str, Any]]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._sent = sent

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body: Any = json.loads(request.content) if request.content else None
        except (httpx.RequestNotRead, ValueError):
            body = None
        self._sent.append((request.method, request.url.path, body))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


FORK_TOKEN = re.compile(r"^PAPERCLIP_CREATEOS_FORK_[0-9a-f]{32}$")


def fork_bodies(sent: list[tuple[str, str, Any]], source: str) -> list[dict[str, Any]]:
    """The bodies of the forks of ``source`` in ``sent``, each checked to carry one fresh fork
    token (``envs``) and shown without it; a retried fork repeats its token."""
    bodies: list[dict[str, Any]] = []
    for _, path, body in sent:
        if path == f"/v1/sandboxes/{source}/fork":
            rest = dict(body)
            envs = rest.pop("envs")
            (token,) = envs
            assert FORK_TOKEN.match(token) and envs[token] == "1", envs
            bodies.append(rest)
    return bodies


def fork_tokens(sent: list[tuple[str, str, Any]]) -> list[str]:
    return [next(iter(body["envs"])) for _, path, body in sent if path.endswith("/fork")]


def record_bodies(h: Harness) -> list[tuple[str, str, Any]]:
    """From now on, every request the driver sends, with its JSON body."""
    sent: list[tuple[str, str, Any]] = []

    def factory(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        pacer = RequestPacer(config.api_url, interval=0.0, shared_dir=None)
        return CreateOSClient(
            config.api_url, api_key, pacer=pacer, backoff_base=0.01, transport=_Recorder(sent)
        )

    h.methods.runtime.client_factory = factory
    return sent


@asynccontextmanager
async def api(h: Harness) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=h.emulator.base_url, headers={"X-Api-Key": "test-key"}, timeout=30
    ) as client:
        yield client


async def view(h: Harness, sandbox_id: str) -> dict[str, Any] | None:
    async with api(h) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}")
    if answer.status_code == 404:
        return None
    return dict(answer.json()["data"])


async def gone(h: Harness, sandbox_id: str) -> bool:
    found = await view(h, sandbox_id)
    return found is None or found["status"] == "destroyed"


async def sh(h: Harness, sandbox_id: str, script: str) -> dict[str, Any]:
    async with api(h) as client:
        answer = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "/bin/bash", "args": ["-lc", script]}
        )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"]["result"])


async def start_shell(h: Harness, sandbox_id: str) -> str:
    """What the attach helper leaves running: a login shell on a terminal, and a daemon."""
    async with api(h) as client:
        answer = await client.post(
            f"/v1/sandboxes/{sandbox_id}/processes",
            json={
                "cmd": "/bin/bash",
                "args": ["-lc", "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & exec bash -l"],
                "cwd": "/paperclip-workspace",
                "pty": {"rows": 24, "cols": 80},
            },
        )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["data"]["process_id"])


async def alive_processes(h: Harness, sandbox_id: str) -> list[dict[str, Any]]:
    state = await h.emulator.admin.state()
    return [p for p in state["processes"] if p["sandbox_id"] == sandbox_id and p["tree_alive"]]


def start_params(h: Harness, *, source: str | None = None, **config: Any) -> dict[str, Any]:
    return {
        **h.call(**config),
        "sessionId": str(uuid.uuid4()),
        "sourceTemplateRef": source,
        "sourceTemplateKind": "snapshot" if source is not None else None,
        "connectionExpiresInMinutes": 15,
        "expiresAt": EXPIRES_AT,
    }


def session_params(h: Harness, session: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # The host hands back its own keys beside ours (setupRpcCompanyId, a config fingerprint).
    metadata = {**session["metadata"], "setupRpcCompanyId": h.company_id, "x": "y"}
    return {
        **h.call(),
        "providerLeaseId": session["providerLeaseId"],
        "setupMetadata": metadata,
        **extra,
    }


async def start(h: Harness, **kwargs: Any) -> dict[str, Any]:
    session: dict[str, Any] = await h.methods.start_setup(start_params(h, **kwargs))
    return session


async def capture(h: Harness, session: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = await h.methods.capture_template(
        session_params(h, session, templateLabel="paperclip-env-1-abcd", timeoutMs=60_000)
    )
    return template


async def template(h: Harness) -> tuple[str, dict[str, Any]]:
    """A captured template holding SETUP_FILE: its id and the capture metadata."""
    session = await start(h)
    assert (await sh(h, session["providerLeaseId"], f"echo prepared > {SETUP_FILE}"))[
        "exit_code"
    ] == 0
    captured = await capture(h, session)
    return captured["templateRef"], captured["metadata"]


def template_config(ref: str, **config: Any) -> dict[str, Any]:
    return {"snapshot": ref, **config}
