"""The fault matrix as a report: every cell of tests/reliability/fault_cells.py, one table.

Runs each cell (site x fault) against one in-process emulator (reset between cells, a fresh
lease journal per cell), prints a table of observed outcomes per endpoint and fault with the
mismatches against the specified outcomes, then totals: cells run, outcomes, mismatches, leaks.
Writes bench/results/fault_matrix.json.

    .venv/bin/python bench/fault_matrix.py [--only SUBSTRING] [--markdown]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from devtools.host_peer import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))  # the cells live with the tests

from provider.emulator import Emulator
from tests.reliability.fault_cells import (
    CELLS,
    FAULTS,
    KNOWN_EMULATOR_BUGS,
    SITES,
    UNUSED_ENDPOINTS,
    Cell,
)
from tests.reliability.fault_runner import CellResult, matrix_harness, run_cell

SHORT = {"retried": "R", "surfaced": "S", "lost": "L", "expired": "E", "poisoned": "P", "ok": "ok"}
RESULT_PATH = REPO_ROOT / "bench" / "results" / "fault_matrix.json"


async def run_all(cells: list[Cell], progress: bool) -> list[CellResult]:
    results: list[CellResult] = []
    emulator = Emulator(api_keys=["test-key", "other-key"])
    async with emulator:
        for cell in cells:
            await emulator.admin.reset()
            with tempfile.TemporaryDirectory() as folder:
                async with matrix_harness(emulator, Path(folder) / "state") as h:
                    result = await run_cell(h, cell, Path(folder))
            results.append(result)
            if progress:
                mark = "pass" if result.passed else "FAIL"
                print(
                    f"{mark} {cell.id:42} expected {cell.expected:9} observed {result.observed}"
                    f"{' leaks: ' + ', '.join(result.leaks) if result.leaks else ''}"
                    f" ({result.seconds:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    leaked = emulator.leaked_host_pids()
    if leaked:
        print(f"host pids alive after the emulator stopped: {leaked}", file=sys.stderr)
    return results


def table(results: list[CellResult], markdown: bool) -> str:
    by_cell = {(r.cell.site.id, r.cell.fault.name): r for r in results}
    faults = [f for f in FAULTS if any(name == f for _, name in by_cell)]
    header = ["endpoint", "host call", *faults]
    rows = []
    for site in SITES:
        if not any(site.id == s for s, _ in by_cell):
            continue
        row = [site.endpoint, site.call]
        for name in faults:
            result = by_cell.get((site.id, name))
            if result is None:
                skipped = f"{site.id}.{name}" in KNOWN_EMULATOR_BUGS and name in site.faults
                row.append("skip*" if skipped else "")
                continue
            cell = SHORT.get(result.observed, result.observed)
            if not result.passed:
                cell = f"{cell}!={SHORT[result.cell.expected]}" + (" LEAK" if result.leaks else "")
            row.append(cell)
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [header, *rows])


def totals(results: list[CellResult], skipped: list[str]) -> dict[str, Any]:
    return {
        "cells_run": len(results),
        "faults_injected": sum(1 for r in results if r.cell.fault.name != "none"),
        "matching_spec": sum(1 for r in results if r.passed),
        "mismatches": [
            {"cell": r.cell.id, "expected": r.cell.expected, "observed": r.observed}
            for r in results
            if r.observed != r.cell.expected
        ],
        "outcomes": dict(collections.Counter(r.observed for r in results)),
        "leaks": {r.cell.id: r.leaks for r in results if r.leaks},
        "leaks_found": sum(len(r.leaks) for r in results),
        "skipped_emulator_bugs": skipped,
        "seconds": round(sum(r.seconds for r in results), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cells whose id contains this")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--quiet", action="store_true", help="no per-cell progress lines")
    args = parser.parse_args()
    wanted = [c for c in CELLS if args.only in c.id]
    cells = [c for c in wanted if c.id not in KNOWN_EMULATOR_BUGS]
    skipped = [c.id for c in wanted if c.id in KNOWN_EMULATOR_BUGS]
    started = time.monotonic()
    results = anyio.run(run_all, cells, not args.quiet)
    summary = totals(results, skipped)
    print(table(results, args.markdown))
    print()
    print("R retried (succeeded, request log shows the retry)  S surfaced (error, lease intact)")
    print("E expired (resume answered providerLeaseId null)  P poisoned (refused until destroy)")
    print("L lost (exec stream lost, its tree killed by token, confirmed; lease intact)")
    print("ok control run without fault  a!=b observed a, specified b  skip* emulator bug")
    for cell_id in skipped:
        print(f"  skip* {cell_id}: {KNOWN_EMULATOR_BUGS[cell_id]}")
    for endpoint, why in UNUSED_ENDPOINTS.items():
        print(f"  not in the matrix: {endpoint}: {why}")
    print()
    print(
        f"cells run: {summary['cells_run']} (faults injected: {summary['faults_injected']}), "
        f"matching the spec: {summary['matching_spec']}, mismatches: "
        f"{len(summary['mismatches'])}, leaks found: {summary['leaks_found']}, "
        f"skipped: {len(skipped)}, wall time {time.monotonic() - started:.0f} s"
    )
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["outcomes"].items())))
    if not args.only:
        RESULT_PATH.parent.mkdir(exist_ok=True)
        RESULT_PATH.write_text(json.dumps(summary, indent=2) + "\n")
    sys.exit(0 if not summary["mismatches"] and not summary["leaks_found"] else 1)


if __name__ == "__main__":
    main()
