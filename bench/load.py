"""Load: one real worker, 20 leases running commands concurrently for a minute, rate limit on.

The worker (``python -m provider`` over pipes, its real token-bucket request pacing) works
against the emulator with its 300-requests-per-minute limit switched on, through a relay that
timestamps every request start on the wire (tests/reliability/load_run.py). Prints commands
completed, the observed request rate, the spacing of request starts and the 429s the emulator
answered, and writes bench/results/load.json. Exit status 1 when a command failed or a 429 was
answered.

    .venv/bin/python bench/load.py [--leases 20] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import anyio

from devtools.host_peer import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))  # the load run lives with the tests

from tests.reliability.load_run import run_load

RESULT_PATH = REPO_ROOT / "bench" / "results" / "load.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    started = time.monotonic()
    report = anyio.run(run_load, args.leases, args.seconds)
    wall = time.monotonic() - started
    r = report
    print(f"leases: {r.leases}, command window: {r.duration_s:.0f} s, wall time {wall:.0f} s")
    print(f"commands started: {r.commands_started}, completed: {r.commands_completed}, "
          f"failed: {len(r.command_failures)}")  # fmt: skip
    print(f"requests in the window: {r.requests_in_window} "
          f"({r.request_rate_per_min:.1f} per minute); whole run: {r.requests_total}, "
          f"most in any 60 s: {r.max_in_60s_window} (limit 300)")  # fmt: skip
    print(f"request starts on the wire: smallest gap {r.min_start_gap_ms:.1f} ms, "
          f"at most {r.max_ahead_of_bound_ms:.1f} ms "
          f"ahead of the pacer's bound (40 + 4 per second)")  # fmt: skip
    print(f"emulator: {r.emulator_requests} requests logged, {r.emulator_429s} answered 429; "
          f"smallest gap between logged (handled) requests "
          f"{r.emulator_log_min_gap_ms:.1f} ms")  # fmt: skip
    print(f"left in the emulator: {r.leaked or 'nothing'}")
    for failure in r.command_failures[:10]:
        print(f"  failure: {failure}")
    RESULT_PATH.parent.mkdir(exist_ok=True)
    RESULT_PATH.write_text(json.dumps({**r.as_dict(), "wall_s": round(wall, 1)}, indent=2) + "\n")
    sys.exit(1 if r.command_failures or r.emulator_429s or r.leaked else 0)


if __name__ == "__main__":
    main()
