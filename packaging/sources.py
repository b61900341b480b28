"""What the package builder reads from the repository: the pins, the release record, the versions.

Stdlib only, and nothing from provider/: the builder must run before anything is installed.
Every check raises SourceError with a message that says which file to fix.
"""

from __future__ import annotations

import json
import platform
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PINS_FILE = REPO_ROOT / "packaging" / "pins.toml"
RUNTIME_PREFIX = "paperclip-createos-runtime-"
# Paperclip's discovery takes paperclip-plugin-* packages for plugins: only the main one may be.
PLUGIN_PREFIX = "paperclip-plugin-"
# Keys of the repo's package.json copied into the main package; any other key is refused, so that
# nobody adds (say) "dependencies" there and expects the built package to carry them.
CARRIED_KEYS = ("name", "version", "description", "license", "type", "paperclipPlugin")
OPTIONAL_KEYS = ("author", "repository", "homepage", "bugs", "keywords", "engines")
MAIN_FILES = ["manifest.js", "manifest.json", "shim.mjs", "provider/", "python/"]


class SourceError(Exception):
    """The repository's files are incomplete or disagree; the message says what to fix."""


@dataclass(frozen=True)
class Platform:
    key: str
    os: str
    cpu: str
    libc: str | None
    pip_tags: tuple[str, ...]

    @property
    def package(self) -> str:
        return RUNTIME_PREFIX + self.key


@dataclass(frozen=True)
class Pins:
    pythons: tuple[str, ...]
    pure: dict[str, str]
    compiled: dict[str, str]
    platforms: dict[str, Platform]
    raw: dict[str, Any]  # pins.toml as read: the lock records it to notice stale locks


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    dist: str
    runtimes: tuple[str, ...]


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from exc


def _json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from exc
    return data


def load_pins(path: Path = PINS_FILE) -> Pins:
    raw = _toml(path)
    try:
        platforms = {
            key: Platform(key, p["os"], p["cpu"], p.get("libc"), tuple(p["pip"]))
            for key, p in raw["platforms"].items()
        }
        pins = Pins(tuple(raw["pythons"]), dict(raw["pure"]), dict(raw["compiled"]), platforms, raw)
    except (KeyError, TypeError) as exc:
        raise SourceError(f"{path}: missing or malformed entry {exc}") from exc
    for plat in platforms.values():
        if plat.package.startswith(PLUGIN_PREFIX):
            raise SourceError(f"{path}: {plat.package} would be discovered as a plugin")
        if (plat.os == "linux") != (plat.libc is not None) or not plat.pip_tags:
            raise SourceError(f"{path}: platform {plat.key} needs pip tags, and libc iff linux")
    if set(pins.pure) & set(pins.compiled):
        raise SourceError(f"{path}: a project is pinned both pure and compiled")
    return pins


def load_release(root: Path = REPO_ROOT) -> Release:
    record = _toml(root / "release.toml")
    try:
        publish = record["publish"]
        release = Release(
            record["name"], record["version"], publish["dist"], tuple(publish["runtimes"])
        )
        main = publish["main"]
    except (KeyError, TypeError) as exc:
        raise SourceError(f"release.toml: missing or malformed entry {exc}") from exc
    if main != release.name:
        raise SourceError(f"release.toml: publish.main is {main!r}, name is {release.name!r}")
    return release


def check_versions(root: Path, release: Release) -> None:
    """Refuse unless pyproject.toml, manifest.json and package.json carry release.toml's version."""
    found = {
        "release.toml": release.version,
        "pyproject.toml": _toml(root / "pyproject.toml").get("project", {}).get("version"),
        "manifest.json": _json(root / "manifest.json").get("version"),
        "package.json": _json(root / "package.json").get("version"),
    }
    if len(set(found.values())) != 1:
        shown = ", ".join(f"{file} {version}" for file, version in found.items())
        raise SourceError(f"versions disagree ({shown}): release.toml is the one to follow")
    name = _json(root / "package.json").get("name")
    if name != release.name:
        raise SourceError(f"package.json names {name!r}, release.toml {release.name!r}")


def check_publish_set(release: Release, pins: Pins) -> None:
    """release.toml's runtimes must be exactly the platform packages pins.toml describes."""
    built = {plat.package for plat in pins.platforms.values()}
    if set(release.runtimes) != built or len(release.runtimes) != len(built):
        raise SourceError(
            f"release.toml publish.runtimes {sorted(release.runtimes)} != the platform packages "
            f"of packaging/pins.toml {sorted(built)}"
        )


def main_package_json(root: Path, release: Release, pins: Pins) -> dict[str, Any]:
    source = _json(root / "package.json")
    unknown = set(source) - set(CARRIED_KEYS) - set(OPTIONAL_KEYS) - {"files"}
    if unknown:
        raise SourceError(
            f"package.json has keys the builder does not carry into the npm package: "
            f"{sorted(unknown)} (teach packaging/sources.py about them)"
        )
    missing = [key for key in CARRIED_KEYS if key not in source]
    if missing:
        raise SourceError(f"package.json lacks {missing}")
    data = {key: source[key] for key in (*CARRIED_KEYS, *OPTIONAL_KEYS) if key in source}
    data["files"] = list(MAIN_FILES)
    data["optionalDependencies"] = {
        pins.platforms[key].package: release.version for key in sorted(pins.platforms)
    }
    return data


def runtime_package_json(
    plat: Platform, release: Release, pins: Pins, license_: str
) -> dict[str, Any]:
    where = "/".join(filter(None, (plat.os, plat.cpu, plat.libc)))
    projects = ", ".join(sorted(pins.compiled))
    data: dict[str, Any] = {
        "name": plat.package,
        "version": release.version,
        "description": (
            f"Compiled Python dependencies ({projects}) of {release.name} for {where}, "
            f"CPython {pins.pythons[0]}-{pins.pythons[-1]}"
        ),
        "license": license_,
        "os": [plat.os],
        "cpu": [plat.cpu],
    }
    if plat.libc is not None:
        data["libc"] = [plat.libc]
    data["files"] = [f"{cp_dir(python)}/" for python in pins.pythons]
    return data


def cp_dir(python: str) -> str:
    """'3.11' -> 'cp311', the folder (and wheel tag) of one CPython minor version."""
    return "cp" + python.replace(".", "")


def host_platform(pins: Pins) -> Platform:
    cpus = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    cpu = cpus.get(platform.machine().lower(), platform.machine())
    if sys.platform == "linux":
        libc = "gnu" if platform.libc_ver()[0] == "glibc" else "musl"
        key = f"linux-{cpu}-{libc}"
    else:
        key = f"{sys.platform}-{cpu}"
    if key not in pins.platforms:
        raise SourceError(f"this machine ({key}) is none of the platforms in packaging/pins.toml")
    return pins.platforms[key]


def select_platforms(pins: Pins, spec: str) -> list[Platform]:
    """'all', 'host' or a comma-separated list of platform keys."""
    if spec == "all":
        return [pins.platforms[key] for key in sorted(pins.platforms)]
    if spec == "host":
        return [host_platform(pins)]
    keys = [key.strip() for key in spec.split(",") if key.strip()]
    unknown = [key for key in keys if key not in pins.platforms]
    if unknown or not keys:
        raise SourceError(f"unknown platforms {unknown}: choose from {sorted(pins.platforms)}")
    return [pins.platforms[key] for key in dict.fromkeys(keys)]
