"""Extraction run for real under a CPython older than 3.11.4, whose tarfile has no ``data``
filter (Debian 12's ``/usr/bin/python3`` is 3.11.2): a good archive lands exactly as it does
here, hostile ones are refused. Fails, never skips, when no such interpreter is found."""

from __future__ import annotations

import json
import subprocess
import sysconfig
from pathlib import Path

import pytest

import provider
from provider.driver.transfer.archive import extract_archive
from tests.driver.archive_helpers import HOSTILE, entry, sample_archive, snapshot, write_tar

CANDIDATES = ("/usr/bin/python3", "/usr/bin/python3.11")
_PROBE = (
    "import sys, tarfile; print(sys.version_info[:3] < (3, 11, 4), hasattr(tarfile, 'data_filter'))"
)
# Runs in the old interpreter: extract each (archive, target) pair, print what happened.
_SCRIPT = """
import json, sys, tarfile
sys.path[:0] = json.loads(sys.argv[1])
from pathlib import Path
from provider.driver.transfer.archive import extract_archive
from provider.errors import TransferError
results = {"version": list(sys.version_info[:3]), "data_filter": hasattr(tarfile, "data_filter")}
for archive, target in json.loads(sys.argv[2]):
    try:
        results[archive] = extract_archive(Path(archive), Path(target), mode=None)
    except TransferError as exc:
        results[archive] = type(exc).__name__
print(json.dumps(results))
"""


def _old_python() -> str:
    for candidate in CANDIDATES:
        if not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-I", "-c", _PROBE], capture_output=True, text=True, check=True
        )
        if probe.stdout.split() == ["True", "False"]:
            return candidate
    pytest.fail(
        f"no CPython older than 3.11.4 at {' or '.join(CANDIDATES)}: this test needs one "
        "(Debian 12's python3 is 3.11.2; install it with apt-get install python3)"
    )


def _run_old(pairs: list[tuple[Path, Path]]) -> dict[str, object]:
    """Extract each pair under the old interpreter, importing this checkout and the venv's
    packages (cp311 wheels, which load on every 3.11)."""
    paths = [str(Path(provider.__file__).parents[1]), sysconfig.get_paths()["purelib"]]
    pairs_json = json.dumps([[str(a), str(t)] for a, t in pairs])
    done = subprocess.run(
        [_old_python(), "-I", "-c", _SCRIPT, json.dumps(paths), pairs_json],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_extraction_under_a_python_without_the_data_filter(tmp_path: Path) -> None:
    good = sample_archive(tmp_path)
    hostile = {
        case: write_tar(tmp_path / f"{index}.tar", [entry("ok", data=b"ok"), *members])
        for index, (case, members) in enumerate(sorted(HOSTILE.items()))
    }
    pairs = [(good, tmp_path / "old" / "target")]
    pairs += [(archive, tmp_path / "refused" / case) for case, archive in hostile.items()]
    results = _run_old(pairs)
    assert results.pop("data_filter") is False
    version = results.pop("version")
    assert isinstance(version, list)
    assert version < [3, 11, 4]
    assert results.pop(str(good)) == 8
    assert results == {str(archive): "ArchiveRefused" for archive in hostile.values()}
    assert not (tmp_path / "refused").exists()
    here = tmp_path / "here"
    extract_archive(good, here, mode=None)
    assert snapshot(tmp_path / "old" / "target", inodes=False) == snapshot(here, inodes=False)
