"""Publish the npm packages `make package` built (`make publish`): runtimes first, then the plugin.

    python packaging/publish.py [--dist DIR] [--platforms all|host|KEY,...] [--registry URL]
                                [--token-env NAME]

Without ``--registry`` it is a dry run: ``npm publish --dry-run`` of every tarball of
release.toml's publish set (npm still asks the registry whether the version exists, and
publishes nothing). ``--platforms`` narrows the runtimes as for packaging/build.py (the e2e test
publishes the plugin and this machine's runtime only). With ``--registry`` it
publishes to that registry with the token in the environment variable ``--token-env`` (default
``NPM_TOKEN``). The token never appears on a command line, in a file or in the output: npm reads
it from a temporary user config that holds only ``${NPM_TOKEN}``, which npm expands itself.

Before anything is sent, every tarball of the publish set must be in the dist folder and carry
the name and version release.toml says (a stale or partial ``dist/`` is refused whole). The
runtime packages go first: the plugin's ``optionalDependencies`` name each of them at this
version, so the plugin must never be visible before them. The first failure stops the run, and
the output says which packages were published before it and which were not. Stdlib only, and
nothing from provider/ is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import sources
from sources import Pins, Release, SourceError

ROOT = sources.REPO_ROOT
TOKEN_ENV = "NPM_TOKEN"  # noqa: S105  (the variable's name, not a token)
EXIT_FAILED = 1


class PublishError(Exception):
    """One package could not be published; ``published`` lists the ones that were."""

    def __init__(self, message: str, published: list[str], left: list[str]) -> None:
        done = ", ".join(published) or "none"
        rest = ", ".join(left) or "none"
        super().__init__(f"{message}\npublished before it: {done}\nnot published: {rest}")
        self.published = published


@dataclass(frozen=True)
class Tarball:
    name: str
    path: Path


def publish_set(release: Release, pins: Pins, dist: Path, platforms: str) -> list[Tarball]:
    """The tarballs in publish order (runtimes, then main), each checked against release.toml."""
    chosen = {plat.package for plat in sources.select_platforms(pins, platforms)}
    names = [*(name for name in release.runtimes if name in chosen), release.name]
    wanted = [Tarball(name, dist / f"{name}-{release.version}.tgz") for name in names]
    missing = [t.path.name for t in wanted if not t.path.is_file()]
    if missing:
        raise SourceError(
            f"{dist} lacks {', '.join(missing)}: run `make package` first (it builds every "
            "package of release.toml's publish set)"
        )
    for tarball in wanted:
        found = _package_json(tarball.path)
        if (found.get("name"), found.get("version")) != (tarball.name, release.version):
            raise SourceError(
                f"{tarball.path.name} holds {found.get('name')}@{found.get('version')}, not "
                f"{tarball.name}@{release.version}: rebuild it with `make package`"
            )
    return wanted


def _package_json(path: Path) -> dict[str, object]:
    try:
        with tarfile.open(path, "r:gz") as tgz:
            member = tgz.extractfile("package/package.json")
            if member is None:
                raise KeyError("package/package.json")
            data = json.loads(member.read())
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise SourceError(f"{path} is not an npm package tarball ({exc})") from exc
    if not isinstance(data, dict):
        raise SourceError(f"{path}: package/package.json is not an object")
    return data


def check_registry(url: str) -> str:
    """An http(s) registry URL without credentials, normalised to end with ``/``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceError(f"REGISTRY must be an http(s) URL, got {url!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise SourceError("REGISTRY must not carry credentials, a query or a fragment")
    return url if url.endswith("/") else url + "/"


def write_user_config(folder: Path, registry: str, token_env: str) -> Path:
    """A user npmrc whose auth line names the variable; npm substitutes its value."""
    parts = urlsplit(registry)
    scope = f"//{parts.netloc}{parts.path}"
    config = folder / "npmrc"
    config.write_text(f"registry={registry}\n{scope}:_authToken=${{{token_env}}}\n")
    config.chmod(0o600)
    return config


def npm_command(tarball: Path, registry: str | None, user_config: Path | None) -> list[str]:
    npm = shutil.which("npm")
    if npm is None:
        raise SourceError("npm is not on PATH: it publishes the packages")
    command = [npm, "publish", str(tarball), "--access", "public", "--ignore-scripts"]
    if registry is None:
        return [*command, "--dry-run"]
    assert user_config is not None
    return [*command, "--registry", registry, "--userconfig", str(user_config)]


def publish(
    tarballs: list[Tarball], registry: str | None, token_env: str, env: dict[str, str]
) -> list[str]:
    """Publish (or dry-run) each tarball in order; the names done, or PublishError."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env):
        raise SourceError(f"--token-env must name an environment variable, got {token_env!r}")
    token = env.get(token_env, "")
    if registry is not None and not token:
        raise SourceError(f"REGISTRY is set but ${token_env} is empty: export the npm token")
    npm_env = env | {"npm_config_update_notifier": "false", "npm_config_fund": "false"}
    published: list[str] = []
    with tempfile.TemporaryDirectory(prefix="paperclip-publish-") as tmp:
        user_config = None
        if registry is not None:
            user_config = write_user_config(Path(tmp), registry, token_env)
        for index, tarball in enumerate(tarballs):
            command = npm_command(tarball.path, registry, user_config)
            done = subprocess.run(
                command, env=npm_env, capture_output=True, text=True, check=False, cwd=tmp
            )
            if done.returncode != 0:
                detail = _error_lines(done.stderr or done.stdout)
                if token:
                    detail = detail.replace(token, "[REDACTED]")
                left = [t.name for t in tarballs[index:]]
                raise PublishError(
                    f"npm publish of {tarball.path.name} failed ({done.returncode}):\n{detail}",
                    published,
                    left,
                )
            published.append(tarball.name)
            verb = "would publish" if registry is None else "published"
            print(f"{verb} {tarball.path.name}", flush=True)
    return published


def _error_lines(output: str) -> str:
    """npm's ``npm error`` lines (its notices list every file first), else the output's end."""
    errors = [line for line in output.splitlines() if line.startswith(("npm error", "npm ERR!"))]
    return "\n".join(errors)[-3000:] if errors else output.strip()[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dist", type=Path, help="tarball folder (default: release.toml's dist)")
    parser.add_argument("--platforms", default="all", help="all (default), host, or KEY,KEY")
    parser.add_argument("--registry", help="publish for real to this registry (default: dry run)")
    parser.add_argument("--token-env", default=TOKEN_ENV, help="variable holding the npm token")
    args = parser.parse_args(argv)
    try:
        release = sources.load_release(ROOT)
        sources.check_versions(ROOT, release)
        pins = sources.load_pins()
        sources.check_publish_set(release, pins)
        dist = (args.dist or ROOT / release.dist).resolve()
        registry = None if not args.registry else check_registry(args.registry)
        tarballs = publish_set(release, pins, dist, args.platforms)
        done = publish(tarballs, registry, args.token_env, dict(os.environ))
    except (SourceError, PublishError) as exc:
        print(f"packaging/publish.py: {exc}", file=sys.stderr)
        return EXIT_FAILED
    where = "dry run, nothing published" if registry is None else registry
    print(f"{len(done)} packages ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
