"""The package the host reads: manifest.json, package.json, versions in one place."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def _json(name: str) -> Any:
    return json.loads((REPO_ROOT / name).read_text())


def test_versions_agree_across_pyproject_manifest_package_and_release() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    release = tomllib.loads((REPO_ROOT / "release.toml").read_text())["version"]
    assert _json("manifest.json")["version"] == pyproject
    assert _json("package.json")["version"] == pyproject
    assert release == pyproject


def test_package_json_points_the_host_at_the_loader_and_the_shim() -> None:
    package = _json("package.json")
    assert package["type"] == "module"
    assert package["paperclipPlugin"] == {"manifest": "./manifest.js", "worker": "./shim.mjs"}
    assert (REPO_ROOT / "manifest.js").is_file()
    assert (REPO_ROOT / "shim.mjs").is_file()


def test_manifest_declares_one_createos_sandbox_provider() -> None:
    manifest = _json("manifest.json")
    assert manifest["id"] == "paperclip.createos-sandbox-provider"
    assert manifest["apiVersion"] == 1
    assert manifest["categories"] == ["automation"]
    assert manifest["capabilities"] == ["environment.drivers.register"]
    assert manifest["entrypoints"] == {"worker": "./shim.mjs"}
    assert "minimumHostVersion" not in manifest
    (driver,) = manifest["environmentDrivers"]
    assert driver["driverKey"] == "createos"
    assert driver["kind"] == "sandbox_provider"
    assert driver["supportsReusableLeases"] is True
    assert driver["sandboxCapabilities"] == {
        "incrementalSessionOutput": True,
        "duplexCommandStream": True,
        "concurrentSyncOperations": True,
    }
    assert driver["supportsLoginPty"] is True
    assert "supportsSetupTokenLogin" not in driver  # the deprecated alias must never disagree
    assert len(driver["displayName"]) <= 100
    assert len(driver["description"]) <= 500
    assert len(manifest["description"]) <= 500


def test_declared_interactive_features_match_the_served_verb_groups() -> None:
    """A flag without its verbs makes the host's close fail and kill the worker (login PTY,
    duplex) or its setup calls fail with 422; verbs without the flag are never used
    (docs/protocol.md H10.1). Each group is served whole or not at all, and every declared
    flag has its verbs. Every group ships, so every served group has its flag declared."""
    from provider.driver.methods import VERBS

    (driver,) = _json("manifest.json")["environmentDrivers"]
    groups = {
        "supportsLoginPty": ("loginPtyOpen", "loginPtyInput", "loginPtyStop", "loginPtyClose"),
        "duplexCommandStream": (
            "duplexChannelOpen",
            "duplexChannelWrite",
            "duplexChannelStop",
            "duplexChannelClose",
        ),
        "supportsInteractiveSetup": (
            "environmentStartInteractiveSetup",
            "environmentGetInteractiveSetup",
            "environmentCancelInteractiveSetup",
        ),
        "supportsTemplateCapture": ("environmentCaptureTemplate",),
        "supportsTemplateDelete": ("environmentDeleteTemplate",),
    }
    declared = {flag: driver.get(flag) is True for flag in groups}
    declared["duplexCommandStream"] = (
        driver["sandboxCapabilities"].get("duplexCommandStream") is True
    )
    for flag, verbs in groups.items():
        served = [verb in VERBS for verb in verbs]
        assert all(served) == any(served), flag  # a group is served whole
        assert declared[flag] == all(served), flag  # a flag exactly when its verbs are served
    assert all(declared.values()), declared  # every group ships
    # capture and delete happen only within setup sessions
    if declared["supportsTemplateCapture"] or declared["supportsTemplateDelete"]:
        assert declared["supportsInteractiveSetup"]


def test_template_declarations_name_our_connection_and_binding() -> None:
    """The setup and template flags and their companions (docs/protocol.md H10.1,
    8): our connection type, the snapshot binding that unsets the image
    fields, and the API URL as the template's identity."""
    (driver,) = _json("manifest.json")["environmentDrivers"]
    assert driver["supportsInteractiveSetup"] is True
    assert driver["interactiveSetupConnectionTypes"] == ["createos_shell"]
    assert driver["supportsTemplateCapture"] is True
    assert driver["templateRefKind"] == "snapshot"
    assert driver["templateConfigBinding"] == {
        "field": "snapshot",
        "unsetFields": ["rootfs", "rootfsByAdapter"],
    }
    assert driver["templateIdentityPaths"] == ["apiUrl"]
    assert driver["supportsTemplateDelete"] is True
    properties = driver["configSchema"]["properties"]
    binding = driver["templateConfigBinding"]
    for field in (binding["field"], *binding["unsetFields"], *driver["templateIdentityPaths"]):
        assert field in properties, field  # the binding names fields the config has


def test_the_config_schema_describes_every_normalized_field() -> None:
    """Checklist 60: each stored field has a title, a description and its range or default."""
    from provider.config import parse_config

    (driver,) = _json("manifest.json")["environmentDrivers"]
    properties = driver["configSchema"]["properties"]
    normalized = parse_config({"apiUrl": "http://127.0.0.1:1", "shape": "s-1vcpu-1gb"})
    assert set(properties) == set(normalized.normalized())
    for name, schema in properties.items():
        assert schema["title"] and schema["description"], name
    assert properties["egressAllowlist"]["maxItems"] == 256
    assert properties["egressAllowlist"]["default"] == []
    window = properties["autoPauseAfterSeconds"]
    assert (window["minimum"], window["maximum"], window["default"]) == (0, 86400, 600)
    assert "1-59 are refused" in window["description"]
    assert properties["rootfsByAdapter"]["additionalProperties"] == {"type": "string"}
