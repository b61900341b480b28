"""Stream relay rate of the emulator: 256 MiB of stdout through ``connect`` vs a plain pipe.

A managed process runs ``head -c 268435456 /dev/zero`` (gated on stdin so the reader is attached
before the first byte) and a plain httpx client reads ``connect`` to the end, parsing every NDJSON
line and decoding its base64 payload. The baseline is ``head -c 256MiB /dev/zero | cat >
/dev/null`` on the same machine. The emulator runs as its own process (the CLI), as in use.

Prints the decoded rate, the wire-only rate (the client counts base64 without decoding it, which
isolates the emulator's side), the baseline and the ratios (goal >= 0.5).

    .venv/bin/python bench/emulator_stream.py [--mib 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import binascii
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import msgspec

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key"
MIB = 1024 * 1024


def baseline_rate(total: int) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", f"head -c {total} /dev/zero | cat > /dev/null"], check=True)
    return total / (time.perf_counter() - started)


class Frame(msgspec.Struct):
    type: str
    seq: int = 0
    data_base64: str = ""


async def relay_rate(base_url: str, total: int, decode: bool) -> float:
    decoder = msgspec.json.Decoder(Frame)
    async with httpx.AsyncClient(
        base_url=base_url, headers={"X-Api-Key": KEY}, timeout=120.0
    ) as client:
        created = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        sandbox_id = created.json()["data"]["id"]
        proc = await client.post(
            f"/v1/sandboxes/{sandbox_id}/processes",
            json={"cmd": "/bin/bash", "args": ["-c", f"cat >/dev/null; head -c {total} /dev/zero"]},
        )
        url = f"/v1/sandboxes/{sandbox_id}/processes/{proc.json()['data']['process_id']}"
        received = 0
        seq = 0
        async with client.stream("GET", f"{url}/connect") as response:
            await client.post(f"{url}/stdin/close")
            started = time.perf_counter()
            pending = bytearray()
            async for chunk in response.aiter_raw():
                pending += chunk
                end = pending.rfind(b"\n")
                if end < 0:
                    continue
                lines = pending[:end].split(b"\n")
                del pending[: end + 1]
                for line in lines:
                    frame = decoder.decode(line)
                    if frame.type != "data":
                        continue
                    if frame.seq != seq + 1:
                        raise RuntimeError(f"gap after seq {seq}: {frame.seq}")
                    seq = frame.seq
                    if decode:
                        received += len(binascii.a2b_base64(frame.data_base64))
                    else:
                        b64 = frame.data_base64
                        received += len(b64) * 3 // 4 - b64[-2:].count("=")
            elapsed = time.perf_counter() - started
        await client.delete(f"/v1/sandboxes/{sandbox_id}")
    if received != total:
        raise RuntimeError(f"received {received} bytes, expected {total}")
    return total / elapsed


def start_emulator() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "provider.emulator", "--quiet", "--api-key", KEY],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def main(mib: int, rounds: int) -> None:
    total = mib * MIB
    proc, base_url = start_emulator()
    try:
        decoded = [await relay_rate(base_url, total, decode=True) for _ in range(rounds)]
        wire = [await relay_rate(base_url, total, decode=False) for _ in range(rounds)]
    finally:
        proc.terminate()
        proc.wait()
    base = statistics.median(baseline_rate(total) for _ in range(rounds))
    best_decoded = statistics.median(decoded)
    best_wire = statistics.median(wire)
    print(f"cpus: {os.cpu_count()}  payload: {mib} MiB  rounds: {rounds} (medians)")
    print(f"baseline  head | cat        : {base / MIB:8.1f} MiB/s")
    print(f"connect, decoded by client  : {best_decoded / MIB:8.1f} MiB/s")
    print(f"connect, wire only          : {best_wire / MIB:8.1f} MiB/s")
    print(f"ratio decoded/baseline: {best_decoded / base:.2f}  (goal >= 0.5)")
    print(f"ratio wire/baseline: {best_wire / base:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.mib, args.rounds)
