"""The fault matrix (issue 8, item 2): every CreateOS endpoint the worker uses x every fault.

Each cell injects one fault through the emulator's admin API into the first matching request of one
host call and checks the outcome docs/protocol.md prescribes (see ``fault_cells.expected``) and that
no sandbox, process tree or host pid is left behind. ``bench/fault_matrix.py`` runs the same cells
and prints the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from provider.emulator import Emulator
from tests.emulator.helpers import LOST_STREAM_LEAK
from tests.reliability.fault_cells import CELLS, KNOWN_EMULATOR_BUGS, Cell
from tests.reliability.fault_runner import matrix_harness, run_cell

pytestmark = pytest.mark.anyio


PARAMS = [
    pytest.param(
        cell,
        id=cell.id,
        marks=[pytest.mark.skip(reason=KNOWN_EMULATOR_BUGS[cell.id])]
        if cell.id in KNOWN_EMULATOR_BUGS
        else [LOST_STREAM_LEAK]
        if cell.site.kind == "exec-stream" and cell.fault.name == "lost"
        else [],
    )
    for cell in CELLS
]


@pytest.mark.parametrize("cell", PARAMS)
async def test_fault_cell(cell: Cell, emulator: Emulator, tmp_path: Path) -> None:
    async with matrix_harness(emulator, tmp_path / "state") as h:
        result = await run_cell(h, cell, tmp_path)
    assert (result.observed, result.leaks) == (cell.expected, []), result.detail
