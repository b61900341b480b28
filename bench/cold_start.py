"""Cold start through the real Paperclip worker manager: our worker vs a stdlib echo worker.

Time from ``startWorker`` to a ready worker (spawn of the shim, Python start-up, ``initialize``
answered), measured inside the Node peer, for this worker and for bench/echo_worker.py behind the
same shim, interleaved in the same run. Prints both medians and the ratio (goal: <= 1.5).

Our worker answers ``initialize`` before it imports its async machinery (provider.rpc.handshake),
so the script also reports the time to the first *served* call (``health`` sent right after the
start): that one includes the deferred imports.

    .venv/bin/python bench/cold_start.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import anyio
from _common import median_ms, start_and_stop

from devtools.host_peer import REPO_ROOT, HostPeer

GOAL_RATIO = 1.5


def _echo_package(root: Path) -> Path:
    """A package folder with our shim.mjs and .venv whose ``provider`` is the echo worker."""
    root.mkdir()
    shutil.copy(REPO_ROOT / "shim.mjs", root / "shim.mjs")
    (root / ".venv").symlink_to(REPO_ROOT / ".venv")
    (root / "provider").mkdir()
    (root / "provider" / "__init__.py").write_text("")
    shutil.copy(REPO_ROOT / "bench" / "echo_worker.py", root / "provider" / "__main__.py")
    return root / "shim.mjs"


# Our worker without the early ``initialize``: everything imported before the first line is read.
_LATE_INIT_MAIN = """\
import ctypes, signal

ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # as provider.__main__ does

import anyio
from provider.app import build_dispatcher
from provider.rpc.handshake import guard_stdout
from provider.rpc.runner import serve_stdio

fd = guard_stdout()
anyio.run(serve_stdio, fd, build_dispatcher())
"""


def _late_init_package(root: Path) -> Path:
    """Our shim and code, but a ``__main__`` that answers initialize from the dispatcher."""
    root.mkdir()
    shutil.copy(REPO_ROOT / "shim.mjs", root / "shim.mjs")
    (root / ".venv").symlink_to(REPO_ROOT / ".venv")
    (root / "provider").mkdir()
    (root / "provider" / "__init__.py").write_text(
        f"__path__.append({str(REPO_ROOT / 'provider')!r})\n"
    )
    (root / "provider" / "__main__.py").write_text(_LATE_INIT_MAIN)
    return root / "shim.mjs"


async def measure(rounds: int, warmup: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        echo_shim = _echo_package(Path(tmp) / "echo")
        late_shim = _late_init_package(Path(tmp) / "late")
        ready: dict[str, list[float]] = {"ours": [], "echo": [], "late": []}
        first: dict[str, list[float]] = {"ours": [], "echo": [], "late": []}
        async with HostPeer(log_file=Path(tmp) / "peer.log", cwd=Path(tmp)) as peer:
            for index in range(warmup + rounds):
                contenders: list[tuple[str, Path | None]] = [
                    ("ours", None),
                    ("echo", echo_shim),
                    ("late", late_shim),
                ]
                shift = index % len(contenders)  # rotate so no contender always runs first
                for plugin_id, entrypoint in contenders[shift:] + contenders[:shift]:
                    ready_ms, first_ms = await start_and_stop(
                        peer, plugin_id, entrypoint_path=entrypoint
                    )
                    if index >= warmup:
                        ready[plugin_id].append(ready_ms)
                        first[plugin_id].append(first_ms)
    return {
        "rounds": rounds,
        "ours_median_ms": median_ms(ready["ours"]),
        "echo_median_ms": median_ms(ready["echo"]),
        "ratio": round(median_ms(ready["ours"]) / median_ms(ready["echo"]), 3),
        "goal_ratio": GOAL_RATIO,
        "ours_first_call_median_ms": median_ms(first["ours"]),
        "echo_first_call_median_ms": median_ms(first["echo"]),
        "first_call_ratio": round(median_ms(first["ours"]) / median_ms(first["echo"]), 3),
        "late_init_median_ms": median_ms(ready["late"]),
        "late_init_first_call_median_ms": median_ms(first["late"]),
        "ours_ms": [round(x, 1) for x in ready["ours"]],
        "echo_ms": [round(x, 1) for x in ready["echo"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    result = anyio.run(measure, args.rounds, args.warmup)
    print(f"cold start, median of {args.rounds} (startWorker -> ready, real worker manager):")
    print(f"  this worker : {result['ours_median_ms']} ms")
    print(f"  echo worker : {result['echo_median_ms']} ms")
    print(f"  ratio       : {result['ratio']} (goal <= {GOAL_RATIO})")
    print("startWorker -> first call (health) answered:")
    print(f"  this worker : {result['ours_first_call_median_ms']} ms")
    print(f"  echo worker : {result['echo_first_call_median_ms']} ms")
    print(f"  ratio       : {result['first_call_ratio']}")
    print("this worker without the early initialize (for comparison):")
    print(f"  ready       : {result['late_init_median_ms']} ms")
    print(f"  first call  : {result['late_init_first_call_median_ms']} ms")
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "cold_start.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
