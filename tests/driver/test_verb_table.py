"""Each verb is declared once (provider/driver/verb_table.py): the handshake's list
(provider/verbs.py), the table, the lazy method table and the manifest's capability flags name
the same verbs, every row decodes into a type of core/params.py, and a call parses its config
once."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from provider import verbs
from provider.config import API_KEY_ENV, DEFAULT_API_URL
from provider.driver import methods
from provider.driver.core import params
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService
from provider.driver.verb_table import BY_SHORT_NAME, VERB_TABLE
from provider.errors import InvalidParams

pytestmark = pytest.mark.anyio

MANIFEST = Path(__file__).resolve().parents[2] / "manifest.json"
#: The verb groups the manifest declares by a flag (docs/protocol.md H10.1); the lease verbs
#: need none.
TEMPLATE_VERBS = {
    "supportsTemplateCapture": "environmentCaptureTemplate",
    "supportsTemplateDelete": "environmentDeleteTemplate",
}
FLAGGED = {
    "supportsLoginPty": verbs.LOGIN_PTY_VERBS,
    "duplexCommandStream": verbs.DUPLEX_VERBS,
    "supportsInteractiveSetup": tuple(
        verb for verb in verbs.SETUP_VERBS if verb not in TEMPLATE_VERBS.values()
    ),
    **{flag: (verb,) for flag, verb in TEMPLATE_VERBS.items()},
}


def declared_flags() -> set[str]:
    (driver,) = json.loads(MANIFEST.read_text())["environmentDrivers"]
    flags = {**driver, **driver["sandboxCapabilities"]}
    return {flag for flag in FLAGGED if flags.get(flag) is True}


def disagreements(listed: Sequence[str], table: Sequence[str], flags: set[str]) -> Iterator[str]:
    """Every way the handshake's list, the verb table and the manifest's flags disagree."""
    if list(listed) != list(table):
        yield f"provider/verbs.py lists {list(listed)}, the verb table serves {list(table)}"
    flagged = {verb for flag in flags for verb in FLAGGED[flag]}
    for verb in sorted(set(table) - set(verbs.LEASE_VERBS) - flagged):
        yield f"{verb} is served but the manifest declares no flag for it"
    for verb in sorted(flagged - set(table)):
        yield f"the manifest declares {verb} but the table does not serve it"


def test_the_list_the_table_and_the_manifest_agree() -> None:
    table = [verb.name for verb in VERB_TABLE]
    assert list(disagreements(verbs.SERVED_VERBS, table, declared_flags())) == []


@pytest.mark.parametrize(
    ("listed", "table", "flags"),
    [
        (verbs.SERVED_VERBS[:-1], verbs.SERVED_VERBS, set(FLAGGED)),  # not in the list
        (verbs.SERVED_VERBS, verbs.SERVED_VERBS[:-1], set(FLAGGED)),  # not in the table
        (verbs.SERVED_VERBS, verbs.SERVED_VERBS, set(FLAGGED) - {"supportsLoginPty"}),  # no flag
        (verbs.LEASE_VERBS, verbs.LEASE_VERBS, set(FLAGGED)),  # a flag without its verbs
    ],
)
def test_a_verb_missing_from_any_one_of_them_is_found(
    listed: Sequence[str], table: Sequence[str], flags: set[str]
) -> None:
    assert list(disagreements(listed, table, flags)) != []


async def test_the_lazy_method_table_serves_the_list() -> None:
    async def ignore(*args: Any) -> None:
        return None

    assert list(methods.method_table(ignore, ignore)) == list(verbs.SERVED_VERBS)


def test_every_row_decodes_into_a_params_type_and_has_its_own_short_name() -> None:
    assert {verb.params.__module__ for verb in VERB_TABLE} == {params.__name__}
    assert len(BY_SHORT_NAME) == len(VERB_TABLE)


def service(environ: Mapping[str, str] | None = None) -> DriverService:
    async def ignore(*args: Any) -> None:
        return None

    runtime = DriverRuntime(environ=environ if environ is not None else {})
    return DriverService(runtime, notify=ignore, log=ignore)


async def test_a_row_refuses_params_of_the_wrong_type_naming_its_verb_and_the_field() -> None:
    table = service().table()
    with pytest.raises(InvalidParams, match=r"loginPtyInput: .*\$\.data") as refused:
        await table["loginPtyInput"]({"workerSessionId": "s-1", "data": 12345})
    assert "12345" not in str(refused.value)
    with pytest.raises(InvalidParams, match="needs a config object"):
        await table["environmentValidateConfig"]({})


class CountingEnviron(dict[str, str]):
    """The worker's environment, counting reads of the API key (one per parsed config)."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        if key == API_KEY_ENV:
            self.reads += 1
        return super().get(key, default)


async def test_a_call_parses_its_config_once() -> None:
    """Realize checks the lease and registers it for terminal opens with one binding (it bound
    twice before the verb table); no request is made."""
    environ = CountingEnviron({API_KEY_ENV: "key-from-env"})
    call = {
        "companyId": "c-1",
        "environmentId": "e-1",
        "config": {"apiUrl": DEFAULT_API_URL, "shape": "s-1vcpu-1gb"},
    }
    metadata = {
        "provider": "createos",
        "companyId": "c-1",
        "environmentId": "e-1",
        "apiUrl": DEFAULT_API_URL,
    }
    realized = await service(environ).realize(
        {**call, "lease": {"providerLeaseId": "sb-1", "metadata": metadata}}
    )
    assert realized["cwd"] == "/paperclip-workspace"
    assert environ.reads == 1
