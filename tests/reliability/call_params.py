"""Params and state helpers of the reliability runs that drive a real worker process through
:class:`~provider.devtools.stdio_host.StdioHost`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def environment_call(
    base_url: str,
    api_key: str,
    *,
    company_id: str = "company-rel",
    environment_id: str = "env-rel",
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
            "timeoutMs": 120_000,
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
