"""The release record (release.toml) and the files it must agree with."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$")
PUBLISH_COMMANDS = ("npm publish", "twine upload", "uv publish", "hatch publish", "pnpm publish")


def release() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "release.toml").read_text())


def package_json(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "package.json").read_text())
    return data


def test_release_toml_records_directory_name_version_and_no_ci_publishing() -> None:
    record = release()
    assert set(record) == {
        "directory",
        "name",
        "version",
        "manifestId",
        "publishFromCi",
        "publish",
    }
    assert record["publishFromCi"] is False
    assert SEMVER.fullmatch(record["version"]), record["version"]
    directory = (REPO_ROOT / record["directory"]).resolve()
    assert not Path(record["directory"]).is_absolute()
    assert directory == REPO_ROOT or REPO_ROOT in directory.parents
    for needed in ("package.json", "manifest.json", "manifest.js", "shim.mjs", "provider"):
        assert (directory / needed).exists(), needed


def test_versions_agree_across_release_pyproject_manifest_and_package() -> None:
    record = release()
    directory = REPO_ROOT / record["directory"]
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    manifest = json.loads((directory / "manifest.json").read_text())
    versions = {
        "release.toml": record["version"],
        "pyproject.toml": pyproject["version"],
        "manifest.json": manifest["version"],
        "package.json": package_json(directory)["version"],
    }
    assert len(set(versions.values())) == 1, versions


def test_names_agree_where_they_name_the_same_thing() -> None:
    record = release()
    directory = REPO_ROOT / record["directory"]
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    manifest = json.loads((directory / "manifest.json").read_text())
    # The npm package and the Python distribution share the release name ...
    assert package_json(directory)["name"] == pyproject["name"] == record["name"]
    # ... the plugin id (Paperclip's plugin key) is the manifest's own, recorded beside it.
    assert manifest["id"] == record["manifestId"]
    assert manifest["environmentDrivers"][0]["driverKey"] == "createos"


def test_publish_set_is_the_main_package_and_one_runtime_per_pinned_platform() -> None:
    record = release()
    publish = record["publish"]
    assert set(publish) == {"dist", "main", "runtimes"}
    assert publish["main"] == record["name"]
    # The tarballs land in dist/ (make package): a relative, gitignored folder.
    assert not Path(publish["dist"]).is_absolute() and ".." not in Path(publish["dist"]).parts
    ignored = (REPO_ROOT / ".gitignore").read_text().split()
    assert f"{publish['dist']}/" in ignored or publish["dist"] in ignored
    # One runtime per platform of packaging/pins.toml, none taken for a plugin by the host.
    pins = tomllib.loads((REPO_ROOT / "packaging" / "pins.toml").read_text())
    runtimes = publish["runtimes"]
    assert len(runtimes) == len(set(runtimes)) == 5
    assert set(runtimes) == {f"paperclip-createos-runtime-{key}" for key in pins["platforms"]}
    for name in runtimes:
        assert not name.startswith("paperclip-plugin-"), name


def test_ci_does_not_publish_while_publish_from_ci_is_false() -> None:
    if release()["publishFromCi"]:  # pragma: no cover - flips when a maintainer enables it
        return
    ci_files = [REPO_ROOT / "Makefile", *sorted((REPO_ROOT / ".ci").rglob("*"))]
    for path in ci_files:
        if path.is_file():
            text = path.read_text(errors="replace")
            for command in PUBLISH_COMMANDS:
                assert command not in text, f"{path.relative_to(REPO_ROOT)} runs {command}"
