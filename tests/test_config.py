"""Environment config: the rules of docs/protocol.md 1 (valid, invalid, normalized)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provider.config import (
    DEFAULT_API_URL,
    KNOWN_SHAPES,
    EnvironmentConfig,
    normalize_api_url,
    parse_config,
    resolve_api_key,
    validate_config,
)
from provider.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
BASE: dict[str, Any] = {
    "apiUrl": "http://127.0.0.1:8790",
    "apiKey": "emu-key",
    "shape": "s-1vcpu-1gb",
}
SECRET = "sk-live-SECRET-123"


# --- apiUrl normalization ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("https://API.sb.createos.sh:443/v1/", "https://api.sb.createos.sh"),
        ("http://127.0.0.1:8790/v1", "http://127.0.0.1:8790"),
        ("HTTPS://api.sb.createos.sh", "https://api.sb.createos.sh"),
        ("https://api.sb.createos.sh/", "https://api.sb.createos.sh"),
        ("https://h.example:8443/v1/", "https://h.example:8443"),
        ("http://localhost", "http://localhost"),
        ("http://localhost:80/", "http://localhost"),
        ("http://[::1]:8790", "http://[::1]:8790"),
        ("https://[2001:DB8::1]/v1", "https://[2001:db8::1]"),
        ("https://h.example/?", "https://h.example"),
        ("https://h.example#", "https://h.example"),
        # A gateway's path prefix is kept (both official SDKs keep one), /v1 and "/" dropped.
        ("https://gw.example.com/createos", "https://gw.example.com/createos"),
        ("https://GW.example.com:443/createos/v1", "https://gw.example.com/createos"),
        ("https://gw.example.com/createos/v1/", "https://gw.example.com/createos"),
        (
            "https://gw.example.com/Team_A/sandbox-api.v2~x/",
            "https://gw.example.com/Team_A/sandbox-api.v2~x",
        ),
        ("http://127.0.0.1:8790/api/v1", "http://127.0.0.1:8790/api"),
        ("https://h.example/other", "https://h.example/other"),
    ],
)
def test_api_url_is_reduced_to_its_origin_and_path_prefix(given: str, origin: str) -> None:
    assert normalize_api_url(given) == origin
    assert normalize_api_url(origin) == origin  # normalized once is normalized for good


@pytest.mark.parametrize(
    "given",
    [
        "https://user:pw@h.example",
        "https://@h.example",
        "https://h.example/?k=v",
        "https://h.example/#frag",
        "http://remote.example",
        "http://127.1:8790",  # IPv4 shorthand is not treated as loopback
        "http://127.0.0.2",
        "file:///var/run/x.sock",
        "https://h.example/v1/sandboxes",
        "https://h.example/V1",
        "https://h.example/v1/v1",
        "https://h.example//createos",
        "https://h.example/createos//",
        "https://h.example/a/../b",
        "https://h.example/./createos",
        "https://h.example/create%20os",
        "https://h.example/create;os",
        "https://h.example/" + "p" * 200,
        "http://remote.example/createos",
        "ftp://h.example",
        "h.example",
        "https://",
        "https://h.example:0",
        "https://h.example:65536",
        "https://h.example:port",
        "https://h.example:",
        "https://h ex.example",
        "https://h.ex\tample",
        "https://h.example\n",
        "https://h\u00e9.example",
        "https://[::1",
        "https://[fe80::1%25eth0]",
        "https://h.example\\@evil.example",
    ],
)
def test_api_url_refusals_state_the_accepted_form_without_repeating_the_url(given: str) -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_api_url(given)
    message = str(caught.value)
    assert caught.value.field == "apiUrl"
    assert "https://" in message
    assert "/v1" in message
    assert "127.0.0.1" in message
    if given != "https://":  # the accepted form itself starts with https://
        assert given.strip() not in message


# --- parse_config: defaults and normalization ----------------------------------------------------


def test_minimal_config_gets_every_default() -> None:
    config = parse_config({"shape": "s-1vcpu-1gb"})
    assert config == EnvironmentConfig(
        api_url=DEFAULT_API_URL,
        api_key=None,
        shape="s-1vcpu-1gb",
        rootfs=None,
        region=None,
        timeout_ms=300_000,
        reuse_lease=False,
        reuse_max_idle_seconds=86_400,
        reuse_max_kept_sandboxes=5,
    )


def test_full_config_is_trimmed_and_normalized_and_unknown_keys_are_dropped() -> None:
    raw = {
        "apiUrl": "  http://127.0.0.1:8790/v1/ ",
        "apiKey": " emu-key ",
        "shape": " s-2vcpu-4gb",
        "rootfs": "devbox:1 ",
        "region": " us ",
        "timeoutMs": 5000.0,
        "reuseLease": True,
        "reuseMaxIdleSeconds": 3600.0,
        "reuseMaxKeptSandboxes": 0,
        "egressAllowlist": [" GitHub.com ", "10.0.0.0/8", "github.com"],
        "autoPauseAfterSeconds": 60.0,
        "rootfsByAdapter": {" codex_local ": " ubuntu:26.04 "},
        "archiveOnRelease": True,
        "runnerLifecycleMode": "x",
        "bridgeRequestTimeoutMs": 1,
    }
    assert parse_config(raw).normalized() == {
        "apiUrl": "http://127.0.0.1:8790",
        "apiKey": "emu-key",
        "shape": "s-2vcpu-4gb",
        "rootfs": "devbox:1",
        "region": "us",
        "timeoutMs": 5000,
        "reuseLease": True,
        "reuseMaxIdleSeconds": 3600,
        "reuseMaxKeptSandboxes": 0,
        "egressAllowlist": ["github.com", "10.0.0.0/8"],
        "autoPauseAfterSeconds": 60,
        "rootfsByAdapter": {"codex_local": "ubuntu:26.04"},
        "snapshot": None,
    }


@pytest.mark.parametrize(
    "field",
    [
        "apiUrl",
        "apiKey",
        "rootfs",
        "region",
        "timeoutMs",
        "reuseLease",
        "reuseMaxIdleSeconds",
        "reuseMaxKeptSandboxes",
        "snapshot",
    ],
)
def test_null_means_absent(field: str) -> None:
    config = parse_config({**BASE, field: None})
    defaults = parse_config({k: v for k, v in BASE.items() if k != field})
    assert config == defaults


@pytest.mark.parametrize("timeout", [1, 86_400_000, 5000.0, 300_000])
def test_timeout_accepts_integers_in_range(timeout: float) -> None:
    assert parse_config({**BASE, "timeoutMs": timeout}).timeout_ms == int(timeout)


@pytest.mark.parametrize("seconds", [0, 600, 86_400, 2_592_000, 600.0, 0.0])
def test_reuse_max_idle_accepts_zero_or_the_range(seconds: float) -> None:
    config = parse_config({**BASE, "reuseMaxIdleSeconds": seconds})
    assert config.reuse_max_idle_seconds == int(seconds)
    assert isinstance(config.reuse_max_idle_seconds, int)


@pytest.mark.parametrize("count", [0, 1, 5, 100, 7.0])
def test_reuse_max_kept_accepts_zero_to_a_hundred(count: float) -> None:
    config = parse_config({**BASE, "reuseMaxKeptSandboxes": count})
    assert config.reuse_max_kept_sandboxes == int(count)
    assert isinstance(config.reuse_max_kept_sandboxes, int)


def test_reuse_bounds_default_to_a_day_and_five_sandboxes() -> None:
    config = parse_config(BASE)
    assert (config.reuse_max_idle_seconds, config.reuse_max_kept_sandboxes) == (86_400, 5)


def test_reuse_bound_messages_state_the_accepted_forms() -> None:
    with pytest.raises(ConfigError) as idle:
        parse_config({**BASE, "reuseMaxIdleSeconds": 59})
    assert "0 (no age bound)" in str(idle.value)
    assert "from 600 to 2592000" in str(idle.value)
    assert "default 86400" in str(idle.value)
    with pytest.raises(ConfigError) as kept:
        parse_config({**BASE, "reuseMaxKeptSandboxes": 101})
    assert "from 0 (no count bound) to 100" in str(kept.value)
    assert "default 5" in str(kept.value)


# --- parse_config: each invalid field ------------------------------------------------------------


INVALID_CASES: list[tuple[str, dict[str, Any]]] = [
    ("shape", {"apiUrl": BASE["apiUrl"], "apiKey": "k"}),
    ("shape", {**BASE, "shape": None}),
    ("shape", {**BASE, "shape": ""}),
    ("shape", {**BASE, "shape": "   "}),
    ("shape", {**BASE, "shape": 5}),
    ("shape", {**BASE, "shape": "s-1vcpu\x00-1gb"}),
    ("apiUrl", {**BASE, "apiUrl": 42}),
    ("apiUrl", {**BASE, "apiUrl": ""}),
    ("apiUrl", {**BASE, "apiUrl": "http://remote.example"}),
    ("apiKey", {**BASE, "apiKey": 12345}),
    ("apiKey", {**BASE, "apiKey": "  "}),
    ("apiKey", {**BASE, "apiKey": ["k"]}),
    ("rootfs", {**BASE, "rootfs": ""}),
    ("rootfs", {**BASE, "rootfs": {"name": "x"}}),
    ("region", {**BASE, "region": False}),
    ("timeoutMs", {**BASE, "timeoutMs": True}),
    ("timeoutMs", {**BASE, "timeoutMs": False}),
    ("timeoutMs", {**BASE, "timeoutMs": "500"}),
    ("timeoutMs", {**BASE, "timeoutMs": float("nan")}),
    ("timeoutMs", {**BASE, "timeoutMs": float("inf")}),
    ("timeoutMs", {**BASE, "timeoutMs": 1.5}),
    ("timeoutMs", {**BASE, "timeoutMs": 0}),
    ("timeoutMs", {**BASE, "timeoutMs": -1}),
    ("timeoutMs", {**BASE, "timeoutMs": 86_400_001}),
    ("timeoutMs", {**BASE, "timeoutMs": 10**30}),
    ("reuseLease", {**BASE, "reuseLease": "true"}),
    ("reuseLease", {**BASE, "reuseLease": 1}),
    ("reuseLease", {**BASE, "reuseLease": 0}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": True}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": False}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": "86400"}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": 1}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": 599}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": 600.5}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": -1}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": 2_592_001}),
    ("reuseMaxIdleSeconds", {**BASE, "reuseMaxIdleSeconds": float("nan")}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": True}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": "5"}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": -1}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": 101}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": 2.5}),
    ("reuseMaxKeptSandboxes", {**BASE, "reuseMaxKeptSandboxes": float("inf")}),
]


@pytest.mark.parametrize(("field", "raw"), INVALID_CASES)
def test_each_invalid_field_is_refused_naming_the_field(field: str, raw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert caught.value.field == field
    assert str(caught.value).startswith(field)


@pytest.mark.parametrize("raw", [None, [], "shape", 3])
def test_a_config_that_is_not_an_object_is_refused(raw: object) -> None:
    with pytest.raises(ConfigError, match="config must be a JSON object"):
        parse_config(raw)


def test_errors_never_contain_the_api_key() -> None:
    raw = {"apiUrl": f"https://{SECRET}@h.example", "apiKey": SECRET, "timeoutMs": "x"}
    result = validate_config(raw)
    assert result["ok"] is False
    assert SECRET not in json.dumps(result)
    with pytest.raises(ConfigError) as caught:
        resolve_api_key(parse_config({**BASE, "apiKey": SECRET + "\nx"}))
    assert SECRET not in str(caught.value)


# --- validate_config -----------------------------------------------------------------------------


def test_validate_returns_normalized_config_with_nulls_for_absent_optionals() -> None:
    assert validate_config(BASE) == {
        "ok": True,
        "normalizedConfig": {
            "apiUrl": "http://127.0.0.1:8790",
            "apiKey": "emu-key",
            "shape": "s-1vcpu-1gb",
            "rootfs": None,
            "region": None,
            "timeoutMs": 300_000,
            "reuseLease": False,
            "reuseMaxIdleSeconds": 86_400,
            "reuseMaxKeptSandboxes": 5,
            "egressAllowlist": [],
            "autoPauseAfterSeconds": 600,
            "rootfsByAdapter": {},
            "snapshot": None,
            "streamRunLogs": False,  # a host-owned flag we default (see config.py)
        },
    }


def test_validate_keeps_a_secret_reference_as_received() -> None:
    uuid = "0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21"
    result = validate_config({**BASE, "apiKey": uuid})
    assert result["ok"] is True
    assert result["normalizedConfig"]["apiKey"] == uuid  # type: ignore[index]


def test_validate_lists_every_problem_first_one_first() -> None:
    result = validate_config({"apiUrl": "http://remote.example", "timeoutMs": 0, "reuseLease": 1})
    assert result["ok"] is False
    errors = result["errors"]
    assert isinstance(errors, list)
    assert [e.split(" ")[0] for e in errors] == ["apiUrl", "shape", "timeoutMs", "reuseLease"]


def test_validate_refuses_a_non_default_endpoint_without_an_api_key() -> None:
    result = validate_config({"apiUrl": "http://127.0.0.1:8790", "shape": "s-1vcpu-1gb"})
    assert result["ok"] is False
    errors = result["errors"]
    assert isinstance(errors, list)
    (message,) = errors
    assert message.startswith("apiKey is required")
    assert "environment config" in message


def test_validate_warns_when_the_default_endpoint_has_no_api_key() -> None:
    result = validate_config({"shape": "s-1vcpu-1gb"})
    assert result["ok"] is True
    warnings = result["warnings"]
    assert isinstance(warnings, list)
    (warning,) = warnings
    assert "CREATEOS_API_KEY" in warning


def test_a_shape_outside_the_catalog_is_a_warning_not_an_error() -> None:
    result = validate_config({**BASE, "shape": "my-template-shape"})
    assert result["ok"] is True
    warnings = result["warnings"]
    assert isinstance(warnings, list)
    (warning,) = warnings
    assert "my-template-shape" in warning
    assert "catalog" in warning


# --- API key resolution (docs/protocol.md 1.4) ----------------------------------------------------


def test_config_key_always_wins() -> None:
    config = parse_config({"shape": "s-1vcpu-1gb", "apiKey": "from-config"})
    assert resolve_api_key(config, {"CREATEOS_API_KEY": "from-env"}) == "from-config"


def test_env_key_is_used_only_for_the_official_endpoint() -> None:
    official = parse_config({"shape": "s-1vcpu-1gb"})
    assert resolve_api_key(official, {"CREATEOS_API_KEY": "  from-env \n"}) == "from-env"


@pytest.mark.parametrize(
    "api_url",
    [
        "http://127.0.0.1:8790",
        "https://api.sb.createos.sh.evil.example",
        "https://api.sb.createos.sh:8443",
        "https://other.example",
    ],
)
def test_any_other_origin_without_a_config_key_is_refused_naming_the_fix(api_url: str) -> None:
    config = parse_config({"shape": "s-1vcpu-1gb", "apiUrl": api_url})
    with pytest.raises(ConfigError) as caught:
        resolve_api_key(config, {"CREATEOS_API_KEY": "from-env"})
    assert "add an apiKey to the environment config" in str(caught.value)


@pytest.mark.parametrize("env", [{}, {"CREATEOS_API_KEY": "   "}, {"CREATEOS_API_KEY": "a\x00b"}])
def test_missing_or_unusable_env_key_is_refused(env: dict[str, str]) -> None:
    fix = "set apiKey in the environment config or provide|CREATEOS_API_KEY holds a space"
    with pytest.raises(ConfigError, match=fix):
        resolve_api_key(parse_config({"shape": "s-1vcpu-1gb"}), env)


@pytest.mark.parametrize("key", ["line\nbreak", "carriage\rreturn"])
def test_config_key_with_line_breaks_is_refused(key: str) -> None:
    with pytest.raises(ConfigError):
        resolve_api_key(parse_config({**BASE, "apiKey": key}), {})


def test_default_environ_is_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREATEOS_API_KEY", "process-key")
    assert resolve_api_key(parse_config({"shape": "s-1vcpu-1gb"})) == "process-key"


def test_the_key_is_hidden_from_the_config_repr() -> None:
    assert SECRET not in repr(parse_config({**BASE, "apiKey": SECRET}))


# --- the manifest schema agrees with the parser --------------------------------------------------


def test_manifest_schema_lists_the_catalog_and_the_defaults() -> None:
    manifest = json.loads((REPO_ROOT / "manifest.json").read_text())
    schema = manifest["environmentDrivers"][0]["configSchema"]
    props = schema["properties"]
    assert tuple(props["shape"]["enum"]) == KNOWN_SHAPES
    assert props["apiUrl"]["default"] == DEFAULT_API_URL
    assert props["apiKey"]["format"] == "secret-ref"
    assert props["timeoutMs"]["default"] == 300_000
    assert (props["timeoutMs"]["minimum"], props["timeoutMs"]["maximum"]) == (1, 86_400_000)
    assert props["reuseLease"]["default"] is False
    idle, kept = props["reuseMaxIdleSeconds"], props["reuseMaxKeptSandboxes"]
    assert idle["type"] == kept["type"] == "integer"
    assert (idle["minimum"], idle["maximum"], idle["default"]) == (0, 2_592_000, 86_400)
    assert (kept["minimum"], kept["maximum"], kept["default"]) == (0, 100, 5)
    for prop in (idle, kept):
        assert prop["title"] and prop["description"]
    assert "600" in idle["description"]  # the schema cannot say "0 or 600..": the text does
    assert schema["required"] == ["apiUrl", "shape"]
    assert set(props) == {
        "apiUrl",
        "apiKey",
        "shape",
        "rootfs",
        "region",
        "timeoutMs",
        "reuseLease",
        "reuseMaxIdleSeconds",
        "reuseMaxKeptSandboxes",
        "egressAllowlist",
        "autoPauseAfterSeconds",
        "rootfsByAdapter",
        "snapshot",
    }
    assert props["snapshot"]["type"] == "string"


# --- egress, window, rootfs per adapter (checklist 58-59) ---------------------------------------


@pytest.mark.parametrize(
    ("rule", "normalized"),
    [
        ("github.com", "github.com"),
        ("*.example.com:443", "*.example.com:443"),
        ("203.0.113.7", "203.0.113.7"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("[2001:db8::1]:22", "[2001:db8::1]:22"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("*", "*"),
        (" Example.COM ", "example.com"),
        ("2001:DB8:0::1", "2001:db8::1"),
    ],
)
def test_egress_rules_in_every_accepted_form(rule: str, normalized: str) -> None:
    config = parse_config({**BASE, "egressAllowlist": ["pypi.org", rule]})
    assert config.egress_allowlist == ("pypi.org", normalized)


@pytest.mark.parametrize(
    "rule",
    [
        "http://x.com",
        "a..b",
        "10.0.0.1/8",
        "1.2.3.4:0",
        "10.0.0.0/33",
        "-x.com",
        42,
        "x.com.",
        "fe80::1%eth0",
        "1.2.3.4:080",
        "[10.0.0.1]:22",
        "two words",
        "",
        "a" * 300,
        "1.2.3.999",
    ],
)
def test_a_bad_egress_rule_is_refused_by_position_and_never_echoed(rule: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "egressAllowlist": ["github.com", rule]})
    message = str(caught.value)
    assert "egressAllowlist[1]" in message and "github.com, *.example.com" in message
    if isinstance(rule, str) and len(rule) > 3:
        assert rule not in message.replace("http://", "").replace("github.com, ", "")
    assert caught.value.field == "egressAllowlist"


def test_egress_allowlist_shape_limits_and_the_star_warning() -> None:
    for bad in ("github.com", {"a": 1}, ["x.com"] * 257):
        with pytest.raises(ConfigError, match="egressAllowlist"):
            parse_config({**BASE, "egressAllowlist": bad})
    result = validate_config({**BASE, "egressAllowlist": ["*", "github.com"]})
    assert result["ok"] is True
    warnings = result["warnings"]
    assert isinstance(warnings, list) and any("'*'" in w for w in warnings)
    assert parse_config({**BASE, "egressAllowlist": None}).egress_allowlist == ()


@pytest.mark.parametrize("seconds", [0, 60, 86_400, 600.0])
def test_auto_pause_accepts_zero_and_the_window_range(seconds: float) -> None:
    assert parse_config({**BASE, "autoPauseAfterSeconds": seconds}).auto_pause_after_seconds == int(
        seconds
    )


@pytest.mark.parametrize("seconds", [1, 59, 86_401, 60.5, True, "600", -60])
def test_auto_pause_refuses_everything_else(seconds: object) -> None:
    with pytest.raises(ConfigError, match=r"autoPauseAfterSeconds.*0 \(pause at release\)"):
        parse_config({**BASE, "autoPauseAfterSeconds": seconds})


def test_auto_pause_defaults_to_600() -> None:
    assert parse_config(BASE).auto_pause_after_seconds == 600


@pytest.mark.parametrize(
    "mapping",
    [
        "codex_local=ubuntu",
        ["codex_local"],
        {"": "ubuntu:26.04"},
        {"codex_local": ""},
        {"codex_local": "   "},
        {"codex\x00local": "ubuntu"},
        {"codex_local": "ubun\ttu"},
        {" codex_local": "a", "codex_local ": "b"},
        {"codex_local": 5},
        {f"adapter{n}": "x" for n in range(65)},
        {"codex_local": "x" * 201},
    ],
)
def test_rootfs_by_adapter_refusals(mapping: object) -> None:
    with pytest.raises(ConfigError, match="rootfsByAdapter") as caught:
        parse_config({**BASE, "rootfsByAdapter": mapping})
    assert caught.value.field == "rootfsByAdapter"


# --- snapshot (checklist 59) ---------------------------------------------------------------------


def test_snapshot_is_a_trimmed_sandbox_id_kept_in_the_normalized_config() -> None:
    config = parse_config({**BASE, "snapshot": " sb_01J8ZTEMPLATE-x "})
    assert config.snapshot == "sb_01J8ZTEMPLATE-x"
    assert config.normalized()["snapshot"] == "sb_01J8ZTEMPLATE-x"
    assert parse_config({**BASE, "snapshot": "a" * 200}).snapshot == "a" * 200
    # an empty rootfsByAdapter is not an image choice: it may stand beside a snapshot
    assert parse_config({**BASE, "snapshot": "sb_1", "rootfsByAdapter": {}}).snapshot == "sb_1"


@pytest.mark.parametrize(
    "value",
    ["sb 1", "sb/1", "../sb", "sb.1", "a" * 201, "", "   ", "sb\x00", 5, True, ["sb_1"], "ünï"],
)
def test_snapshot_refuses_a_non_identifier_without_echoing_it(value: object) -> None:
    with pytest.raises(ConfigError, match="snapshot") as caught:
        parse_config({**BASE, "snapshot": value})
    assert caught.value.field == "snapshot"
    if isinstance(value, str) and value.strip():
        assert value not in str(caught.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"rootfs": "devbox:1"},
        {"rootfsByAdapter": {"codex_local": "ubuntu:26.04"}},
        {"rootfs": "devbox:1", "rootfsByAdapter": {"codex_local": "ubuntu:26.04"}},
    ],
)
def test_snapshot_is_refused_together_with_an_image(extra: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="cannot be combined with rootfs") as caught:
        parse_config({**BASE, "snapshot": "sb_1", **extra})
    assert caught.value.field == "snapshot"
    result = validate_config({**BASE, "snapshot": "sb_1", **extra})
    assert result["ok"] is False
