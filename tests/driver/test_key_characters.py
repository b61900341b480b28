"""An API key that is not printable ASCII is refused, named, never echoed, with no request.

Such a key used to pass validation and then fail inside httpx, which cannot encode it as the
``X-Api-Key`` header: probe and acquire answered "internal worker error". Now validation
refuses it, and every runtime call refuses it again before any request (a config stored before
this check still reaches the worker).
"""

from __future__ import annotations

import json

import pytest

from provider.config import parse_config, resolve_api_key, validate_config
from provider.errors import ConfigError
from tests.driver.conftest import Harness

pytestmark = pytest.mark.anyio

BAD_KEYS = [
    "sk-clé-SECRET",  # Latin-1: httpx's ASCII header encoding fails
    "sk-💥-SECRET",  # outside the BMP
    "sk-\u00a0SECRET",  # a no-break space pasted from a web page
    "sk-\u200bSECRET",  # a zero-width space
    "sk-with space-SECRET",
    "sk-\x7fSECRET",
    "sk-\tSECRET",
]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_validate_probe_and_acquire_refuse_the_key_by_name(
    harness: Harness, key: str
) -> None:
    validated = validate_config(harness.config(apiKey=key))
    assert validated["ok"] is False
    errors = validated["errors"]
    assert isinstance(errors, list) and len(errors) == 1
    message = errors[0]
    assert isinstance(message, str) and message.startswith("apiKey ")
    assert "printable ASCII" in message
    assert "SECRET" not in json.dumps(validated)

    before = await harness.request_count()
    probed = await harness.methods.probe(harness.call(apiKey=key))
    assert probed["ok"] is False, probed
    assert "printable ASCII" in probed["summary"]
    assert "SECRET" not in json.dumps(probed)
    with pytest.raises(ConfigError, match="printable ASCII") as caught:
        await harness.methods.acquire(harness.acquire_params(apiKey=key))
    assert "SECRET" not in str(caught.value)
    assert await harness.request_count() == before  # refused before any request


@pytest.mark.parametrize("key", BAD_KEYS)
def test_the_environment_fallback_key_is_refused_too(key: str) -> None:
    official = parse_config({"shape": "s-1vcpu-1gb"})
    with pytest.raises(ConfigError, match="CREATEOS_API_KEY holds") as caught:
        resolve_api_key(official, {"CREATEOS_API_KEY": key})
    assert "SECRET" not in str(caught.value)


def test_a_key_of_visible_ascii_is_kept_verbatim() -> None:
    key = "sk-LIVE_a1/b2+c3=~!#$%&*"
    config = parse_config({"shape": "s-1vcpu-1gb", "apiKey": f"  {key}\n"})
    assert resolve_api_key(config, {}) == key
    official = parse_config({"shape": "s-1vcpu-1gb"})
    assert resolve_api_key(official, {"CREATEOS_API_KEY": key}) == key
