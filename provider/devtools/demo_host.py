"""``python -m provider.devtools.demo_host``: the worker under the real Paperclip worker manager.

Installs the peer if needed, lets the host load this package (package.json -> manifest.js ->
shim.mjs -> python -m provider), then shows what the host sees: the start-up, supportedMethods,
``health``, config validation (valid and refused), a clean stop with no process left.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from provider.devtools.host_peer import HostPeer, PeerCallError, pid_alive, wait_until_gone

VALID_CONFIG: dict[str, Any] = {
    "apiUrl": "http://127.0.0.1:8790/v1/",
    "apiKey": "emu-key",
    "shape": "s-1vcpu-1gb",
    "archiveOnRelease": True,
}
INVALID_CONFIG: dict[str, Any] = {"apiUrl": "http://remote.example", "timeoutMs": "500"}


def _show(title: str, value: Any) -> None:
    print(f"\n== {title}")
    print(json.dumps(value, indent=2) if not isinstance(value, str) else value)


async def run_demo() -> int:
    async with HostPeer() as peer:
        print(f"real Paperclip worker manager (2026.916.1) from {peer.peer_dir}")
        info = await peer.start_worker()
        shim_pid, worker_pid = peer.shim_pid(), peer.worker_pid()
        _show(
            "startWorker",
            {
                "manifestId": info.manifest_id,
                "entrypoint": info.entrypoint_path,
                "shimPid": shim_pid,
                "pythonWorkerPid": worker_pid,
                "readyAfterMs": round(info.start_ms, 1),
                "supportedMethods": info.supported_methods,
            },
        )
        _show("health", await peer.call("health", {}))
        _show(
            "environmentValidateConfig (valid)",
            await peer.call(
                "environmentValidateConfig", {"driverKey": "createos", "config": VALID_CONFIG}
            ),
        )
        _show(
            "environmentValidateConfig (refused)",
            await peer.call(
                "environmentValidateConfig", {"driverKey": "createos", "config": INVALID_CONFIG}
            ),
        )
        try:
            await peer.call("noSuchMethod", {})
        except PeerCallError as exc:
            _show("an unknown method", f"JSON-RPC error {exc.code}: {exc.message}")
        await peer.stop_worker()
        gone = [pid for pid in (shim_pid, worker_pid) if pid is not None]
        for pid in gone:
            await wait_until_gone(pid, 15)
        left = [pid for pid in gone if pid_alive(pid)]
        _show("stopWorker", {"processesLeft": left})
        return 1 if left else 0


def main() -> None:
    sys.exit(anyio.run(run_demo))


if __name__ == "__main__":
    main()
