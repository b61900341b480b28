"""Sandbox create-to-first-command latency of the emulator (median of 20).

Each round times ``POST /v1/sandboxes`` followed by a buffered ``exec`` of ``true`` (the first
command), through a plain httpx client against the emulator running as its own process (the
CLI). The baseline is the isolation floor: a bare ``bwrap`` launch of ``/usr/bin/true`` with the
same namespaces. Real CreateOS quotes 30-100 ms for a create.

    .venv/bin/python bench/emulator_latency.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx

from provider.emulator.bwrap import GUEST_UID, probe_runtime

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key"


def bare_bwrap_ms() -> float:
    runtime = probe_runtime()
    argv = [runtime.bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid"]
    argv += ["--unshare-ipc", "--unshare-uts", "--die-with-parent", "--as-pid-1"]
    argv += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib"]
    argv += ["/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev"]
    argv += ["/usr/bin/true"]
    uid = runtime.drop_to_uid
    started = time.perf_counter()
    subprocess.run(argv, check=True, user=uid, group=uid, extra_groups=None if uid is None else [])
    return (time.perf_counter() - started) * 1000


async def one_round(client: httpx.AsyncClient) -> tuple[float, float]:
    started = time.perf_counter()
    created = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    created.raise_for_status()
    sandbox_id = created.json()["data"]["id"]
    after_create = time.perf_counter()
    ran = await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "true"})
    ran.raise_for_status()
    assert ran.json()["data"]["result"]["exit_code"] == 0
    done = time.perf_counter()
    await client.delete(f"/v1/sandboxes/{sandbox_id}")
    return (after_create - started) * 1000, (done - started) * 1000


async def main(rounds: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "provider.emulator", "--quiet", "--api-key", KEY],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    base_url = proc.stdout.readline().strip()
    try:
        async with httpx.AsyncClient(
            base_url=base_url, headers={"X-Api-Key": KEY}, timeout=60.0
        ) as client:
            await one_round(client)  # warm-up (imports, first bwrap)
            results = [await one_round(client) for _ in range(rounds)]
    finally:
        proc.terminate()
        proc.wait()
    bare = [bare_bwrap_ms() for _ in range(rounds)]
    create_ms = [r[0] for r in results]
    total_ms = sorted(r[1] for r in results)
    median = statistics.median(total_ms)
    bare_median = statistics.median(bare)
    print(f"rounds: {rounds}  guest uid: {probe_runtime().drop_to_uid or 'current'} ({GUEST_UID=})")
    print(f"create only           : median {statistics.median(create_ms):7.1f} ms")
    print(
        f"create + first exec   : median {median:7.1f} ms  "
        f"(min {total_ms[0]:.1f}, p90 {total_ms[int(0.9 * (len(total_ms) - 1))]:.1f})"
    )
    print(f"bare bwrap true       : median {bare_median:7.1f} ms")
    print(f"ratio create+exec / bare bwrap: {median / bare_median:.2f}")
    print(f"ratio create+exec / 100 ms (CreateOS upper quote): {median / 100:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    anyio.run(main, parser.parse_args().rounds)
