"""Round trip of a trivial exec on the emulator: streamed (``/exec?stream=true``) and buffered.

One sandbox, then ``--rounds`` (50) execs of ``/bin/true`` back to back, unpaced, through one
keep-alive httpx client against the emulator running as its own process (the CLI); each round
is timed from the request to the stream's end (streamed: the ``exit_code`` frame then EOF).
The baseline is the same command spawned on the host (``posix_spawn`` + wait), the floor no
sandboxed exec can beat.

    .venv/bin/python bench/emulator_exec.py [--rounds 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import anyio
import httpx
from _common import API_KEY, SHAPE, emulator_process

BODY = {"cmd": "/bin/true"}


async def streamed(client: httpx.AsyncClient, path: str) -> float:
    started = time.perf_counter()
    async with client.stream("POST", path, params={"stream": "true"}, json=BODY) as response:
        frames = [json.loads(line) async for line in response.aiter_lines() if line]
    assert frames[-1] == {"exit_code": 0}, frames
    return (time.perf_counter() - started) * 1000


async def buffered(client: httpx.AsyncClient, path: str) -> float:
    started = time.perf_counter()
    response = await client.post(path, json=BODY)
    assert response.json()["data"]["result"]["exit_code"] == 0, response.text
    return (time.perf_counter() - started) * 1000


def host_spawn_ms() -> float:
    started = time.perf_counter()
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    os.waitpid(pid, 0)
    return (time.perf_counter() - started) * 1000


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"{name:<22}: median {statistics.median(ordered):6.2f} ms"
        f"  (min {ordered[0]:.2f}, p90 {p90:.2f})"
    )


async def main(rounds: int) -> None:
    async with emulator_process() as emu:
        headers = {"X-Api-Key": API_KEY}
        async with httpx.AsyncClient(base_url=emu.base_url, headers=headers, timeout=60) as client:
            created = await client.post("/v1/sandboxes", json={"shape": SHAPE})
            created.raise_for_status()
            path = f"/v1/sandboxes/{created.json()['data']['id']}/exec"
            for _ in range(5):  # warm-up: imports, first spawns, the connection
                await streamed(client, path)
                await buffered(client, path)
            stream_ms = [await streamed(client, path) for _ in range(rounds)]
            buffer_ms = [await buffered(client, path) for _ in range(rounds)]
    host_ms = [host_spawn_ms() for _ in range(rounds)]
    print(f"rounds: {rounds}, /bin/true, one keep-alive client, unpaced")
    print(summary("streamed exec", stream_ms))
    print(summary("buffered exec", buffer_ms))
    print(summary("host posix_spawn", host_ms))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    anyio.run(main, parser.parse_args().rounds)
