"""The host-style params every test that calls the driver shares, and a state-folder reader.

:func:`environment_call` is the one builder of a call's common params (driver key, company,
environment, config); tests add the verb's own fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def environment_call(
    base_url: str,
    api_key: str,
    *,
    company_id: str = "company-rel",
    environment_id: str = "env-rel",
    timeout_ms: int = 120_000,
    **config: Any,
) -> dict[str, Any]:
    """The common params of a driver call against ``base_url`` with ``api_key`` (``config``
    overrides or adds config fields)."""
    return {
        "driverKey": "createos",
        "companyId": company_id,
        "environmentId": environment_id,
        "config": {
            "apiUrl": base_url,
            "apiKey": api_key,
            "shape": "s-1vcpu-1gb",
            "timeoutMs": timeout_ms,
            "reuseLease": False,
            **config,
        },
    }


def state_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the worker's state folder: the journal and its WAL)."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
