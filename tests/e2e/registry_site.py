"""Pieces of the install-by-name e2e test: interpreters, the build, the publish, the workspace.

The test publishes what ``packaging/build.py --platforms host`` builds to a real npm registry
(verdaccio) with ``packaging/publish.py`` (``make publish``), then has the real server install
the plugin by name with a chosen ``python3`` first on its PATH.
"""

from __future__ import annotations

import os
import platform
import stat
import subprocess
import sys
from pathlib import Path

import anyio

from devtools.e2e_server import REPO_ROOT

MAIN = "paperclip-plugin-createos"
RUNTIME_PREFIX = "paperclip-createos-runtime-"
BUILD_BUDGET_S = 300  # about 5 s with a warm wheel cache; the first run downloads about 20 MB
PUBLISH_BUDGET_S = 180
# Tarfile's extraction filters (the 'data' filter) arrived in 3.11.4: older 3.11 patch releases
# take the worker's own extraction path, which this test must cover.
FILTERS_SINCE = (3, 11, 4)
OLD_PYTHONS = (Path("/usr/bin/python3"), Path("/usr/bin/python3.11"))

# What the agent leaves in its workspace (run by sh in the sandbox; dash's printf takes octal
# escapes): bytes that are not text, several modes, links (relative, into a folder, dangling,
# and an absolute one leaving the tree, as a virtualenv's bin/python) and an empty folder.
# EXPECTED_TREE is what the host must then hold, exactly. Directory modes are not carried
# (tarfile's data filter ignores them, and so must the extraction without it): every folder
# gets the server's default, 0o777 less its umask (DIR_MODE).
GOOD_SCRIPT = """
mkdir -p tree/sub tree/empty
printf 'a\\000b\\377\\r\\n' > tree/bin.dat && chmod 0640 tree/bin.dat
printf '#!/bin/sh\\necho hi\\n' > tree/sub/run.sh && chmod 0755 tree/sub/run.sh
printf 'only me' > tree/private && chmod 0600 tree/private
ln -s sub/run.sh tree/to-run
ln -s ../bin.dat tree/sub/up
ln -s no-such-file tree/dangling
ln -s /usr/bin/python3 tree/python
chmod 0750 tree/sub
"""
_UMASK = next(
    int(line.split()[1], 8)
    for line in Path("/proc/self/status").read_text().splitlines()
    if line.startswith("Umask:")
)  # the server inherits it; read, not set (os.umask would change it for a moment)
DIR_MODE = 0o777 & ~_UMASK
EXPECTED_TREE: dict[str, tuple[str, int, bytes | str | None]] = {
    "tree": ("dir", DIR_MODE, None),
    "tree/bin.dat": ("file", 0o640, b"a\x00b\xff\r\n"),
    "tree/private": ("file", 0o600, b"only me"),
    "tree/sub": ("dir", DIR_MODE, None),  # 0o750 in the sandbox
    "tree/sub/run.sh": ("file", 0o755, b"#!/bin/sh\necho hi\n"),
    "tree/sub/up": ("link", 0o777, "../bin.dat"),
    "tree/to-run": ("link", 0o777, "sub/run.sh"),
    "tree/dangling": ("link", 0o777, "no-such-file"),
    "tree/python": ("link", 0o777, "/usr/bin/python3"),
    "tree/empty": ("dir", DIR_MODE, None),
}
# A FIFO in the workspace (it could block a host reader): the archive of the sync back must be
# refused whole. (A link leaving the workspace is no longer hostile: it comes back as a link.)
HOSTILE_SCRIPT = "mkfifo pipe && echo kept > beside-it"


def host_key() -> str:
    """This machine's runtime package key, spelled like packaging/pins.toml's platforms."""
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    arch = cpu[platform.machine().lower()]
    system = platform.system().lower()
    if system == "linux":
        return f"linux-{arch}-{'gnu' if platform.libc_ver()[0] == 'glibc' else 'musl'}"
    return f"{system}-{arch}"


def version_of(python: Path) -> tuple[int, int, int]:
    probe = "import sys; print('%d %d %d' % sys.version_info[:3])"
    done = subprocess.run(
        [str(python), "-I", "-c", probe], capture_output=True, text=True, env={}, check=True
    )
    major, minor, micro = (int(part) for part in done.stdout.split())
    return major, minor, micro


def old_system_python() -> Path:
    """A system CPython 3.11 older than 3.11.4 (Debian 12's is 3.11.2), or AssertionError."""
    seen = {}
    for candidate in OLD_PYTHONS:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            version = version_of(candidate)
            seen[str(candidate)] = version
            if version[:2] >= (3, 11) and version < FILTERS_SINCE:
                return candidate
    raise AssertionError(
        f"no CPython 3.11.0-3.11.3 among {[str(p) for p in OLD_PYTHONS]} (found {seen}): this "
        "test must run a sync out without tarfile's extraction filters"
    )


def newer_python() -> Path:
    """This test run's own interpreter, outside its venv (pyenv shims need a HOME)."""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidate = Path(sys.base_prefix) / "bin" / minor
    return candidate if candidate.is_file() else Path(os.path.realpath(sys.executable))


def python_bin(folder: Path, python: Path) -> Path:
    """A folder holding ``python3`` -> ``python``, to go first on the server's PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python3").symlink_to(python)
    return folder


async def build(out: Path, version: str) -> None:
    """``packaging/build.py --platforms host --out <out>``: the main and this host's runtime."""
    command = [sys.executable, str(REPO_ROOT / "packaging" / "build.py")]
    command += ["--platforms", "host", "--out", str(out)]
    with anyio.fail_after(BUILD_BUDGET_S):
        done = await anyio.run_process(command, cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-3000:]
    runtime = f"{RUNTIME_PREFIX}{host_key()}"
    assert sorted(p.name for p in out.glob("*.tgz")) == sorted(
        [f"{MAIN}-{version}.tgz", f"{runtime}-{version}.tgz"]
    )


async def publish(dist: Path, registry: str, token: str, node_dir: Path) -> str:
    """``make publish`` for this host's packages, for real, to ``registry``; its stdout."""
    command = [sys.executable, str(REPO_ROOT / "packaging" / "publish.py")]
    command += ["--dist", str(dist), "--platforms", "host", "--registry", registry]
    # npm under Node 24 (first on PATH); the token only in the environment.
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env |= {"NPM_TOKEN": token, "PATH": f"{node_dir}{os.pathsep}{env.get('PATH', '')}"}
    with anyio.fail_after(PUBLISH_BUDGET_S):
        done = await anyio.run_process(command, cwd=REPO_ROOT, env=env, check=False)
    output = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    assert token not in output
    assert done.returncode == 0, output[-3000:]
    return output


def tree_of(workspace: Path) -> dict[str, tuple[str, int, bytes | str | None]]:
    """What is below ``workspace/tree`` (and the folder itself): kind, mode bits, content."""
    found: dict[str, tuple[str, int, bytes | str | None]] = {}
    for path in [workspace / "tree", *sorted((workspace / "tree").rglob("*"))]:
        info = path.lstat()
        rel = path.relative_to(workspace).as_posix()
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            found[rel] = ("link", mode, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[rel] = ("dir", mode, None)
        else:
            found[rel] = ("file", mode, path.read_bytes())
    return found
