"""Build the npm packages operators install (`make package`): the plugin and its runtimes.

    python packaging/build.py [--out DIR] [--platforms all|host|KEY,...] [--update-lock]

The main package (paperclip-plugin-createos) carries the shim, the manifest, provider/ and, in
python/, packaging/bootstrap.py plus every pure-Python dependency unpacked. One runtime package
per platform (paperclip-createos-runtime-<key>, npm picks the matching one by os/cpu/libc) carries
the compiled dependencies unpacked per CPython version in cp311/ ... cp314/. So an install needs
Node and Python 3.11+ and nothing else: no pip, no network, no build step.

Wheels come from the lock (packaging/wheels.lock.json, every file name and sha256) through the
cache (.cache/wheels/); `--update-lock` regenerates the lock from packaging/pins.toml instead of
building. Each package is staged in a temporary folder and packed with `npm pack`. Stdlib only,
and nothing from provider/ is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sources
import wheels
from sources import Pins, Platform, Release, SourceError
from wheels import Wanted, WheelError

ROOT = sources.REPO_ROOT
LOCK_FILE = ROOT / "packaging" / "wheels.lock.json"
CACHE_DIR = ROOT / ".cache" / "wheels"
BOOTSTRAP = ROOT / "packaging" / "bootstrap.py"
COPIED = ("manifest.js", "manifest.json", "shim.mjs")
SKIPPED_DIRS = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class Packed:
    file: Path
    size: int
    unpacked: int
    entries: int


def wanted_wheels(pins: Pins, platforms: list[Platform]) -> list[Wanted]:
    """The pure wheels, then the compiled ones of every given platform and CPython version."""
    wanted = [Wanted(project, version) for project, version in pins.pure.items()]
    for plat in platforms:
        for python in pins.pythons:
            for project, version in pins.compiled.items():
                wanted.append(Wanted(project, version, plat.key, python, plat.pip_tags))
    return wanted


def copy_tree(source: Path, dest: Path) -> None:
    """Copy a source tree without bytecode caches; symlinks are refused, not followed."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if SKIPPED_DIRS & set(rel.parts) or path.suffix in SKIPPED_SUFFIXES:
            continue
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise SourceError(f"{path} is not a regular file: the package cannot carry it")
        if path.is_dir():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / rel)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def stage_main(
    stage: Path, package_json: dict[str, Any], files: dict[Wanted, Path], bootstrap: Path
) -> None:
    write_json(stage / "package.json", package_json)
    for name in COPIED:
        shutil.copy2(ROOT / name, stage / name)
    copy_tree(ROOT / "provider", stage / "provider")
    if not bootstrap.is_file():
        raise SourceError(f"{bootstrap} is missing: the main package needs python/bootstrap.py")
    (stage / "python").mkdir()
    shutil.copy2(bootstrap, stage / "python" / "bootstrap.py")
    for want, path in files.items():
        if want.python is None:
            wheels.unpack(path, stage / "python", pure=True)


def stage_runtime(
    stage: Path,
    plat: Platform,
    release: Release,
    pins: Pins,
    files: dict[Wanted, Path],
    license_: str,
) -> None:
    write_json(stage / "package.json", sources.runtime_package_json(plat, release, pins, license_))
    for python in pins.pythons:
        (stage / sources.cp_dir(python)).mkdir()
    for want, path in files.items():
        if want.platform == plat.key and want.python is not None:
            wheels.unpack(path, stage / sources.cp_dir(want.python), pure=False)


def npm_pack(stage: Path, out: Path, expected: str) -> Packed:
    """`npm pack` the staged folder into out; refuses a tarball that misses a staged file."""
    npm = shutil.which("npm")
    if npm is None:
        raise SourceError("npm is not on PATH: it packs the packages")
    env = os.environ | {"npm_config_update_notifier": "false", "npm_config_fund": "false"}
    command = [npm, "pack", "--json", "--ignore-scripts", "--pack-destination", str(out)]
    done = subprocess.run(command, cwd=stage, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SourceError(f"npm pack failed in {stage}:\n{done.stderr.strip()[-2000:]}")
    (report,) = json.loads(done.stdout)
    staged = {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}
    packed = {entry["path"] for entry in report["files"]}
    if staged != packed:
        raise SourceError(
            f"npm pack of {expected} left out {sorted(staged - packed)[:10]} "
            f"and added {sorted(packed - staged)[:10]}"
        )
    if report["filename"] != expected:
        raise SourceError(f"npm pack wrote {report['filename']}, expected {expected}")
    tarball = out / report["filename"]
    return Packed(tarball, tarball.stat().st_size, report["unpackedSize"], report["entryCount"])


def build(
    release: Release, pins: Pins, out: Path, platforms: list[Platform], cache: Path, bootstrap: Path
) -> list[Packed]:
    every = wanted_wheels(pins, list(pins.platforms.values()))
    locked = wheels.read_lock(LOCK_FILE, pins.raw, every)
    needed = wanted_wheels(pins, platforms)
    files = wheels.ensure([locked[want] for want in needed], cache)
    out.mkdir(parents=True, exist_ok=True)
    packed = []
    main_json = sources.main_package_json(ROOT, release, pins)  # read and checked once
    with tempfile.TemporaryDirectory(prefix="paperclip-package-") as tmp:
        stage = Path(tmp) / "main"
        stage.mkdir()
        stage_main(stage, main_json, files, bootstrap)
        packed.append(npm_pack(stage, out, f"{release.name}-{release.version}.tgz"))
        for plat in platforms:
            stage = Path(tmp) / plat.key
            stage.mkdir()
            stage_runtime(stage, plat, release, pins, files, main_json["license"])
            packed.append(npm_pack(stage, out, f"{plat.package}-{release.version}.tgz"))
    return packed


def load() -> tuple[Release, Pins]:
    release = sources.load_release(ROOT)
    sources.check_versions(ROOT, release)
    pins = sources.load_pins()
    sources.check_publish_set(release, pins)
    return release, pins


def update_lock(cache: Path) -> None:
    _, pins = load()
    locked = wheels.lock_wheels(wanted_wheels(pins, list(pins.platforms.values())), cache)
    wheels.write_lock(LOCK_FILE, pins.raw, locked)
    print(f"wrote {LOCK_FILE.relative_to(ROOT)}: {len(locked)} wheels")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="output folder (default: release.toml's dist)")
    parser.add_argument("--platforms", default="all", help="all (default), host, or KEY,KEY")
    parser.add_argument("--update-lock", action="store_true", help="regenerate the lock only")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="wheel cache folder")
    parser.add_argument("--bootstrap", type=Path, default=BOOTSTRAP, help="python/bootstrap.py")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.update_lock:
            update_lock(args.cache.resolve())
            return 0
        release, pins = load()
        out = (args.out or ROOT / release.dist).resolve()
        platforms = sources.select_platforms(pins, args.platforms)
        packed = build(
            release, pins, out, platforms, args.cache.resolve(), args.bootstrap.resolve()
        )
    except (SourceError, WheelError) as exc:
        print(f"packaging/build.py: {exc}", file=sys.stderr)
        return 1
    for item in packed:
        print(
            f"{item.file.name:58} {item.size / 1e6:6.2f} MB packed"
            f" {item.unpacked / 1e6:6.2f} MB unpacked {item.entries:5} files"
        )
    print(f"built {len(packed)} packages in {out} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
