"""The repo tools' layout, pinned: devtools/ has no import circle, and the shipped package never
imports it (the npm package carries provider/ only, tests/packaging/test_build.py)."""

from __future__ import annotations

from tests.test_layers import MODULES, _circles, load_modules

DEVTOOLS = load_modules("devtools")


def test_devtools_has_no_import_circle_not_even_a_late_one() -> None:
    # Every import counts here, TYPE_CHECKING and function-level ones too: a tool has no reason
    # for a late binding, and the demo's old circle (demo -> walkthrough -> session -> demo)
    # went through a TYPE_CHECKING import.
    every = {name: {t for t in m.every if t != "devtools"} for name, m in DEVTOOLS.items()}
    assert _circles(every) == []


def test_the_loader_reads_devtools_imports() -> None:
    assert "devtools.demo_session" in DEVTOOLS["devtools.demo_walkthrough"].eager
    assert "provider" in DEVTOOLS["devtools.demo"].external


def test_nothing_shipped_imports_devtools() -> None:
    users = sorted(name for name, module in MODULES.items() if "devtools" in module.external)
    assert users == []
