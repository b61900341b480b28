"""Install by name from a real npm registry on the full Paperclip server, timed per ``python3``.

Runs the scenario of tests/e2e/test_package_install_e2e.py (its assertions included) once per
interpreter and round: build this host's packages, publish them to verdaccio on loopback with
``packaging/publish.py``, ``paperclipai plugin install paperclip-plugin-createos`` with the
interpreter as the server's ``python3``, probe an environment on the emulator, one agent
heartbeat whose workspace syncs back, a refused hostile sync back, uninstall. Figures:

- ``install``: the ``plugin install`` CLI call (npm from the registry, then the worker's first
  start until the server answered);
- ``first start``: from the shim's fork to that answer (no bytecode yet: CPython compiles and
  writes it into the package folder);
- ``probe``: ``environment probe`` of a saved environment (a sandbox created and deleted);
- ``heartbeat``: one agent heartbeat, invoke to final status (sync in, the stub CLI, sync back).

Default interpreters: the system CPython older than 3.11.4 (Debian 12's ``/usr/bin/python3``,
3.11.2) and this run's own (3.11.7 here). The first run installs the server and verdaccio.

    .venv/bin/python bench/package_install.py [--python PATH ...] [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import anyio
from _common import save_result

from tests.e2e.registry_site import newer_python, old_system_python, version_of
from tests.e2e.test_package_install_e2e import install_by_name

FIGURES = ("install_s", "first_start_s", "probe_s", "heartbeat_s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", type=Path, action="append", help="python3 for the server")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    pythons = args.python or [old_system_python(), newer_python()]
    results: dict[str, dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for python in pythons:  # interpreters alternate round by round
            label = f"{python} ({'.'.join(map(str, version_of(python)))})"
            timings = await install_by_name(python)
            print(f"round {round_ + 1} {label}: {timings}", flush=True)
            for name in FIGURES:
                results.setdefault(label, {}).setdefault(name, []).append(timings[name])
    print(f"\n| python3 | {' | '.join(name.removesuffix('_s') for name in FIGURES)} (s, median) |")
    print(f"| --- |{' --- |' * len(FIGURES)}")
    for label, figures in results.items():
        cells = " | ".join(f"{statistics.median(figures[name]):.2f}" for name in FIGURES)
        print(f"| {label} | {cells} |")
    print(f"wrote {save_result('package_install', results)}")


if __name__ == "__main__":
    anyio.run(main)
