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
import statistics
import tempfile
from pathlib import Path

import anyio

from provider.devtools.host_peer import REPO_ROOT, HostPeer

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


async def _start(peer: HostPeer, plugin_id: str, entrypoint: Path | None) -> tuple[float, float]:
    info = await peer.start_worker(plugin_id, entrypoint_path=entrypoint, first_call=("health", {}))
    await peer.stop_worker(plugin_id)
    assert info.first_call_ms is not None
    return info.start_ms, info.first_call_ms


def _median(samples: list[float]) -> float:
    return round(statistics.median(samples), 1)


async def measure(rounds: int, warmup: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        echo_shim = _echo_package(Path(tmp) / "echo")
        ready: dict[str, list[float]] = {"ours": [], "echo": []}
        first: dict[str, list[float]] = {"ours": [], "echo": []}
        async with HostPeer(log_file=Path(tmp) / "peer.log", cwd=Path(tmp)) as peer:
            for index in range(warmup + rounds):
                pair: list[tuple[str, Path | None]] = [("ours", None), ("echo", echo_shim)]
                if index % 2:
                    pair.reverse()  # alternate the order so neither always runs first
                for plugin_id, entrypoint in pair:
                    ready_ms, first_ms = await _start(peer, plugin_id, entrypoint)
                    if index >= warmup:
                        ready[plugin_id].append(ready_ms)
                        first[plugin_id].append(first_ms)
    return {
        "rounds": rounds,
        "ours_median_ms": _median(ready["ours"]),
        "echo_median_ms": _median(ready["echo"]),
        "ratio": round(_median(ready["ours"]) / _median(ready["echo"]), 3),
        "goal_ratio": GOAL_RATIO,
        "ours_first_call_median_ms": _median(first["ours"]),
        "echo_first_call_median_ms": _median(first["echo"]),
        "first_call_ratio": round(_median(first["ours"]) / _median(first["echo"]), 3),
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
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "cold_start.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
