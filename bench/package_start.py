"""Start of the installed npm package through the real Paperclip worker manager.

Time from ``startWorker`` to a ready worker (``initialize`` answered), measured inside the Node
peer, and to the first served call (``health`` sent right after the start, as in
bench/cold_start.py), for:

- ``first``: the installed package's first start: a fresh copy of a fresh install each round,
  no ``__pycache__`` yet, so CPython compiles and writes the bytecode of everything it imports
  (the copy is made outside the timed window; its files are in the page cache, as right after
  ``npm install``);
- ``warm``: the same install started again (bytecode cached in the package folders);
- ``checkout``: this source checkout (``.venv``), the baseline, in the same run.

Contenders rotate round by round. The packages are built with ``packaging/build.py --platforms
host`` (wheel cache .cache/wheels) and installed with the host's flags (``npm install
<name>@<tgz> <runtime tgz> --prefix <dir> --save --ignore-scripts``, plus ``--offline``). The
host gives the worker its own PATH: the peer runs with ``<bin>:/usr/bin:/bin`` where ``<bin>``
holds ``node`` and ``python3`` -> the checkout venv's base interpreter (``--python`` to choose
another), so both layouts run the same CPython. Goals (issue): first start under 1 s, warm
start under 0.1 s more than the checkout.

    .venv/bin/python bench/package_start.py [--rounds 10] [--warmup 1] [--python PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from _common import median_ms, save_result, start_and_stop

from devtools.host_peer import REPO_ROOT, HostPeer, ensure_peer_installed

GOAL_FIRST_MS = 1000.0
GOAL_WARM_EXTRA_MS = 100.0
RELEASE: dict[str, Any] = tomllib.loads((REPO_ROOT / "release.toml").read_text())
MAIN: str = RELEASE["name"]
VERSION: str = RELEASE["version"]
RUNTIME_PREFIX = "paperclip-createos-runtime-"
NPM_FLAGS = ("--save", "--ignore-scripts", "--offline", "--no-audit", "--no-fund")
CONTENDERS = ("first", "warm", "checkout")


def base_python() -> Path:
    """The interpreter behind this script's venv (run it with .venv/bin/python: the checkout's)."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return candidate if candidate.is_file() else Path(os.path.realpath(sys.executable))


def build(out: Path) -> dict[str, Path]:
    command = [sys.executable, str(REPO_ROOT / "packaging" / "build.py"), "--platforms", "host"]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"packaging/build.py failed:\n{done.stderr}")
    return {path.name: path for path in out.glob("*.tgz")}


def package_sizes(tarballs: dict[str, Path]) -> list[dict[str, Any]]:
    sizes = []
    for name, path in sorted(tarballs.items()):
        with tarfile.open(path) as tgz:
            files = [member for member in tgz.getmembers() if member.isfile()]
        sizes.append(
            {
                "package": name.removesuffix(f"-{VERSION}.tgz"),
                "tgz_bytes": path.stat().st_size,
                "unpacked_bytes": sum(member.size for member in files),
                "files": len(files),
            }
        )
    return sizes


def install(prefix: Path, tarballs: dict[str, Path]) -> Path:
    """Both packages into ``prefix`` as the host installs by name; the main package folder."""
    main = tarballs[f"{MAIN}-{VERSION}.tgz"]
    (runtime,) = (path for name, path in tarballs.items() if name.startswith(RUNTIME_PREFIX))
    prefix.mkdir(parents=True)
    command = ["npm", "install", f"{MAIN}@{main}", str(runtime), "--prefix", str(prefix)]
    done = subprocess.run(
        [*command, *NPM_FLAGS], cwd=prefix.parent, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"npm install failed:\n{done.stdout}{done.stderr}")
    return prefix / "node_modules" / MAIN


def bytecode_files(prefix: Path) -> int:
    return sum(1 for _ in prefix.rglob("__pycache__/*.pyc"))


@contextmanager
def host_path(path: str) -> Iterator[None]:
    """PATH for the peer driver while it is spawned: the manager hands it to every worker."""
    saved = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        yield
    finally:
        os.environ["PATH"] = saved


async def measure(rounds: int, warmup: int, python: Path) -> dict[str, Any]:
    peer_dir = await ensure_peer_installed()  # with this shell's PATH (npm, if not installed)
    with tempfile.TemporaryDirectory(prefix="bench-package-") as tmp:
        root = Path(tmp)
        tarballs = build(root / "dist")
        sizes = package_sizes(tarballs)
        template = install(root / "template" / "plugins", tarballs).parents[1]
        warm = install(root / "warm" / "plugins", tarballs)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        node = shutil.which("node")
        if node is None:
            raise SystemExit("node is not on PATH")
        (bin_dir / "node").symlink_to(os.path.realpath(node))
        (bin_dir / "python3").symlink_to(python)
        cwd = root / "server-cwd"
        cwd.mkdir()
        ready: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        first_call: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        written: list[int] = []
        async with AsyncExitStack() as stack:
            with host_path(os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])):
                peer = await stack.enter_async_context(
                    HostPeer(peer_dir=peer_dir, log_file=root / "peer.log", cwd=cwd)
                )
            await start_and_stop(
                peer, "warm", package_root=warm
            )  # writes the warm install's bytecode
            for index in range(warmup + rounds):
                fresh = root / f"first-{index}"
                shutil.copytree(template, fresh, symlinks=True)  # outside the timed window
                roots = {
                    "first": fresh / "node_modules" / MAIN,
                    "warm": warm,
                    "checkout": REPO_ROOT,
                }
                shift = index % len(CONTENDERS)  # rotate so no contender always runs first
                for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                    ready_ms, call_ms = await start_and_stop(peer, name, package_root=roots[name])
                    if index >= warmup:
                        ready[name].append(ready_ms)
                        first_call[name].append(call_ms)
                written.append(bytecode_files(fresh))
                shutil.rmtree(fresh)
    medians = {name: median_ms(ready[name]) for name in CONTENDERS}
    call_medians = {name: median_ms(first_call[name]) for name in CONTENDERS}
    return {
        "rounds": rounds,
        "python": str(python),
        "sizes": sizes,
        "ready_median_ms": medians,
        "first_call_median_ms": call_medians,
        "warm_extra_ms": round(medians["warm"] - medians["checkout"], 1),
        "warm_first_call_extra_ms": round(call_medians["warm"] - call_medians["checkout"], 1),
        "first_extra_ms": round(medians["first"] - medians["checkout"], 1),
        "ratio_first": round(medians["first"] / medians["checkout"], 3),
        "ratio_warm": round(medians["warm"] / medians["checkout"], 3),
        "goal_first_ms": GOAL_FIRST_MS,
        "goal_warm_extra_ms": GOAL_WARM_EXTRA_MS,
        "bytecode_files_written_by_a_first_start": statistics.median(written),
        "ready_ms": {name: [round(x, 1) for x in ready[name]] for name in CONTENDERS},
        "first_call_ms": {name: [round(x, 1) for x in first_call[name]] for name in CONTENDERS},
    }


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--python", type=Path, default=None, help="python3 on the host's PATH")
    args = parser.parse_args()
    python = args.python.resolve() if args.python else base_python()
    result = anyio.run(measure, args.rounds, args.warmup, python)
    print("package sizes:")
    for size in result["sizes"]:
        print(
            f"  {size['package']:<42} {_mb(size['tgz_bytes']):>9} .tgz "
            f"{_mb(size['unpacked_bytes']):>9} unpacked {size['files']:>4} files"
        )
    ready, calls = result["ready_median_ms"], result["first_call_median_ms"]
    print(f"median of {args.rounds} (real worker manager, python3 = {python}):")
    print(f"  {'':<30} {'ready':>9} {'first call':>11}")
    labels = {
        "first": "installed, first start",
        "warm": "installed, warm start",
        "checkout": "source checkout (.venv)",
    }
    for name in CONTENDERS:
        print(f"  {labels[name]:<30} {ready[name]:>6} ms {calls[name]:>8} ms")
    print(
        f"  first start: {ready['first']} ms (goal < {GOAL_FIRST_MS:.0f} ms), "
        f"{result['first_extra_ms']} ms over the checkout (ratio {result['ratio_first']}), "
        f"{result['bytecode_files_written_by_a_first_start']} .pyc written"
    )
    print(
        f"  warm start: {result['warm_extra_ms']} ms over the checkout (goal < "
        f"{GOAL_WARM_EXTRA_MS:.0f} ms; ratio {result['ratio_warm']}); first call "
        f"{result['warm_first_call_extra_ms']} ms over"
    )
    save_result("package_start", result)


if __name__ == "__main__":
    main()
