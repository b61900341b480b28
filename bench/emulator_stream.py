"""Stream relay rate of the emulator: 256 MiB of stdout through ``connect`` vs a plain pipe.

A managed process runs ``head -c 268435456 /dev/zero`` (gated on stdin so the reader is attached
before the first byte) and a client reads ``connect`` to the end. The baseline is
``head -c 256MiB /dev/zero | cat > /dev/null`` on the same machine. The emulator runs as its own
process (the CLI), as in use. Two clients:

- ``raw``: a plain socket reading the HTTP response to EOF without parsing it (it checks the
  exit frame at the end): the emulator's relay capacity;
- ``httpx``: httpx + msgspec + binascii, checking every seq and decoding every payload byte,
  i.e. what the worker's stream reader costs on top.

Prints the rates, the baseline and the ratios (goal >= 0.5 for the relay).

    .venv/bin/python bench/emulator_stream.py [--mib 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import binascii
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import msgspec

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key"
MIB = 1024 * 1024


class Frame(msgspec.Struct):
    type: str
    seq: int = 0
    data_base64: str = ""


def baseline_rate(total: int) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", f"head -c {total} /dev/zero | cat > /dev/null"], check=True)
    return total / (time.perf_counter() - started)


async def gated_process(client: httpx.AsyncClient, sandbox_id: str, total: int) -> str:
    proc = await client.post(
        f"/v1/sandboxes/{sandbox_id}/processes",
        json={"cmd": "/bin/bash", "args": ["-c", f"cat >/dev/null; head -c {total} /dev/zero"]},
    )
    return f"/v1/sandboxes/{sandbox_id}/processes/{proc.json()['data']['process_id']}"


def raw_read(base_url: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` with Connection: close and read to EOF; answers (bytes, last 200 bytes)."""
    parts = urlsplit(base_url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY}\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode())
    buffer = bytearray(4 * MIB)
    size = 0
    tail = b""
    while True:
        got = sock.recv_into(buffer)
        if not got:
            break
        size += got
        tail = (tail + bytes(buffer[max(0, got - 200) : got]))[-200:]
    sock.close()
    return size, tail


async def raw_rate(client: httpx.AsyncClient, base_url: str, sandbox_id: str, total: int) -> float:
    url = await gated_process(client, sandbox_id, total)
    async with anyio.create_task_group() as tg:
        result: list[tuple[int, bytes]] = []

        async def read() -> None:
            result.append(await anyio.to_thread.run_sync(raw_read, base_url, f"{url}/connect"))

        tg.start_soon(read)
        await anyio.sleep(0.2)  # the reader is attached; open the gate
        started = time.perf_counter()
        await client.post(f"{url}/stdin/close")
    elapsed = time.perf_counter() - started
    size, tail = result[0]
    if b'{"type":"exit","exit_code":0}' not in tail or size < total * 4 // 3:
        raise RuntimeError(f"incomplete stream ({size} bytes)")
    return total / elapsed


async def httpx_rate(client: httpx.AsyncClient, sandbox_id: str, total: int) -> float:
    decoder = msgspec.json.Decoder(Frame)
    url = await gated_process(client, sandbox_id, total)
    received = 0
    seq = 0
    async with client.stream("GET", f"{url}/connect") as response:
        await client.post(f"{url}/stdin/close")
        started = time.perf_counter()
        pending = bytearray()
        async for chunk in response.aiter_raw():
            pending += chunk
            start = 0
            with memoryview(pending) as view:
                while (end := pending.find(b"\n", start)) >= 0:
                    frame = decoder.decode(view[start:end])
                    start = end + 1
                    if frame.type != "data":
                        continue
                    if frame.seq != seq + 1:
                        raise RuntimeError(f"gap after seq {seq}: {frame.seq}")
                    seq = frame.seq
                    received += len(binascii.a2b_base64(frame.data_base64))
            del pending[:start]
        elapsed = time.perf_counter() - started
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
        async with httpx.AsyncClient(
            base_url=base_url, headers={"X-Api-Key": KEY}, timeout=300.0
        ) as client:
            created = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            sandbox_id = created.json()["data"]["id"]
            raw = [await raw_rate(client, base_url, sandbox_id, total) for _ in range(rounds)]
            parsed = [await httpx_rate(client, sandbox_id, total) for _ in range(rounds)]
    finally:
        proc.terminate()
        proc.wait()
    base = statistics.median(baseline_rate(total) for _ in range(rounds))
    relay = statistics.median(raw)
    worker = statistics.median(parsed)
    load = os.getloadavg()[0]
    print(
        f"cpus: {os.cpu_count()}  load: {load:.1f}  payload: {mib} MiB  rounds: {rounds} (medians)"
    )
    print(f"baseline  head | cat              : {base / MIB:8.1f} MiB/s")
    print(f"connect, raw socket client        : {relay / MIB:8.1f} MiB/s payload")
    print(f"connect, httpx+msgspec+a2b client : {worker / MIB:8.1f} MiB/s payload")
    print(f"ratio relay/baseline: {relay / base:.2f}  (goal >= 0.5)")
    print(f"ratio httpx client/baseline: {worker / base:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.mib, args.rounds)
