"""The host-style params of a driver call, built one way for tests, benches, live tests and the
demo, and a state-folder reader.

A call's common params are the driver key, the company, the environment and the config
(:func:`common_params`; :func:`call_config` builds a config, :func:`environment_call` both at
once). A verb on a lease adds the lease the way the host passes it: :func:`with_lease` for execute
and sync, :func:`lease_ref` for release, resume and destroy, :func:`route_params` for the login
and duplex opens; :func:`bash` is the one way a script is run. Callers pass their own company and
environment ids where the defaults do not suit them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

DRIVER_KEY: Final = "createos"
SHAPE: Final = "s-1vcpu-1gb"
COMPANY_ID: Final = "company-rel"
ENVIRONMENT_ID: Final = "env-rel"


def call_config(
    api_url: str,
    api_key: str,
    *,
    shape: str = SHAPE,
    timeout_ms: int = 120_000,
    reuse_lease: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A config for ``api_url`` with ``api_key``; ``extra`` (config field names) overrides or
    adds fields."""
    return {
        "apiUrl": api_url,
        "apiKey": api_key,
        "shape": shape,
        "timeoutMs": timeout_ms,
        "reuseLease": reuse_lease,
        **extra,
    }


def common_params(
    config: Mapping[str, Any],
    *,
    company_id: str = COMPANY_ID,
    environment_id: str = ENVIRONMENT_ID,
) -> dict[str, Any]:
    """The params every environment verb takes: driver key, company, environment, config."""
    return {
        "driverKey": DRIVER_KEY,
        "companyId": company_id,
        "environmentId": environment_id,
        "config": dict(config),
    }


def environment_call(
    base_url: str,
    api_key: str,
    *,
    company_id: str = COMPANY_ID,
    environment_id: str = ENVIRONMENT_ID,
    timeout_ms: int = 120_000,
    **config: Any,
) -> dict[str, Any]:
    """The common params of a driver call against ``base_url`` with ``api_key`` (``config``
    overrides or adds config fields)."""
    return common_params(
        call_config(base_url, api_key, timeout_ms=timeout_ms, **config),
        company_id=company_id,
        environment_id=environment_id,
    )


def validate_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """``environmentValidateConfig``'s params: the host sends no company or environment."""
    return {"driverKey": DRIVER_KEY, "config": dict(config)}


def with_lease(common: Mapping[str, Any], lease: Mapping[str, Any]) -> dict[str, Any]:
    """``common`` call params plus the lease as the host passes it (execute, sync)."""
    return {**common, "lease": {**lease, "expiresAt": None}}


def lease_ref(common: Mapping[str, Any], lease: Mapping[str, Any]) -> dict[str, Any]:
    """``common`` call params plus the lease id and metadata (release, resume, destroy)."""
    return {
        **common,
        "providerLeaseId": lease["providerLeaseId"],
        "leaseMetadata": lease["metadata"],
    }


def route_params(
    common: Mapping[str, Any], lease: Mapping[str, Any], route: str, **extra: Any
) -> dict[str, Any]:
    """A login or duplex open on ``lease`` for the host route ``route`` (no config: the worker
    finds the lease by id in its journal)."""
    return {
        "hostRouteId": route,
        "driverKey": common["driverKey"],
        "companyId": common["companyId"],
        "environmentId": common["environmentId"],
        "providerLeaseId": lease["providerLeaseId"],
        **extra,
    }


def bash(leased: Mapping[str, Any], script: str, **extra: Any) -> dict[str, Any]:
    """``environmentExecute``'s params running ``script`` with ``bash -c`` (``leased``: the
    :func:`with_lease` params; ``extra``: cwd, env, timeoutMs...)."""
    return {**leased, "command": "bash", "args": ["-c", script], **extra}


def state_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the worker's state folder: the journal and its WAL)."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
