"""The npm packages `make package` builds (packaging/): pins, lock, refusals and package layout.

The layout tests build the main package and this machine's runtime package once per session
(`packaging/build.py --platforms host`) with the shared wheel cache (.cache/wheels/): the first
run on a machine downloads the host's wheels (about 20 MB), later runs need no network.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.packaging.conftest import host_key

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGING = REPO_ROOT / "packaging"
PINS: dict[str, Any] = tomllib.loads((PACKAGING / "pins.toml").read_text())
LOCK: dict[str, Any] = json.loads((PACKAGING / "wheels.lock.json").read_text())
RELEASE: dict[str, Any] = tomllib.loads((REPO_ROOT / "release.toml").read_text())
VERSION: str = RELEASE["version"]
MAIN = RELEASE["name"]
RUNTIME_PREFIX = "paperclip-createos-runtime-"
CP_DIRS = ["cp" + python.replace(".", "") for python in PINS["pythons"]]
EXTENSION = re.compile(r"\.(cpython-3\d+[^/]*\.so|pyd)$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release_tuple(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    assert match, version
    return tuple(int(part) for part in match.group(0).split("."))


def suffix(version: str) -> str:
    return re.sub(r"^[\d.]+", "", version)


def satisfies(version: str, specifier: str) -> bool:
    """A small PEP 440 check, enough for the specifiers of pyproject and the pinned wheels."""
    have = release_tuple(version)
    for clause in filter(None, (part.strip() for part in specifier.split(","))):
        match = re.fullmatch(r"(==|!=|>=|<=|~=|>|<)\s*(\d[\w.]*?)(\.\*)?", clause)
        assert match, f"unhandled specifier {clause!r}"
        op, bound, wildcard = match.groups()
        want = release_tuple(bound)
        if wildcard:
            assert op in ("==", "!="), clause
            ok = (have[: len(want)] == want) == (op == "==")
        else:
            width = max(len(have), len(want))
            a, b = (t + (0,) * (width - len(t)) for t in (have, want))
            ok = {
                "==": a == b and suffix(version) == suffix(bound),
                "!=": a != b,
                ">=": a >= b,
                "<=": a <= b,
                ">": a > b,
                "<": a < b,
                "~=": a >= b and have[: len(want) - 1] == want[:-1],
            }[op]
        if not ok:
            return False
    return True


def marker_holds(marker: str, python: str) -> bool | None:
    """Evaluate python_version clauses joined by `and`; None for an extra (never installed)."""
    if "extra" in marker:
        return None
    for clause in marker.split(" and "):
        match = re.fullmatch(
            r"\s*python_version\s*(==|!=|>=|<=|>|<)\s*[\"']([\d.]+)[\"']\s*", clause
        )
        assert match, f"unhandled marker {marker!r}: teach this test about it"
        if not satisfies(python, match[1] + match[2]):
            return False
    return True


def load(module: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module of packaging/, imported the way `python packaging/build.py` sees its siblings."""
    monkeypatch.syspath_prepend(str(PACKAGING))
    return importlib.import_module(module)


# -- pins and lock -----------------------------------------------------------------------------


def test_lock_covers_every_pure_dep_and_every_platform_python_pair() -> None:
    expected = {(norm(p), v, None, None) for p, v in PINS["pure"].items()}
    expected |= {
        (norm(p), v, plat, python)
        for plat in PINS["platforms"]
        for python in PINS["pythons"]
        for p, v in PINS["compiled"].items()
    }
    found = [(w["project"], w["version"], w["platform"], w["python"]) for w in LOCK["wheels"]]
    assert sorted(found, key=str) == sorted(expected, key=str)
    assert LOCK["pins"] == PINS, "pins.toml changed since the lock: run make package-lock"
    assert len(PINS["platforms"]) == 5 and PINS["pythons"] == ["3.11", "3.12", "3.13", "3.14"]
    for wheel in LOCK["wheels"]:
        assert re.fullmatch(r"[0-9a-f]{64}", wheel["sha256"]), wheel


def test_the_builder_accepts_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    build, sources = load("build", monkeypatch), load("sources", monkeypatch)
    pins = sources.load_pins()
    wanted = build.wanted_wheels(pins, list(pins.platforms.values()))
    locked = load("wheels", monkeypatch).read_lock(build.LOCK_FILE, pins.raw, wanted)
    assert len(locked) == len(LOCK["wheels"])


def test_package_names_and_the_publish_set() -> None:
    runtimes = [RUNTIME_PREFIX + key for key in PINS["platforms"]]
    assert MAIN.startswith("paperclip-plugin-")
    for name in runtimes:
        assert not name.startswith("paperclip-plugin-"), name
    assert sorted(RELEASE["publish"]["runtimes"]) == sorted(runtimes)
    assert RELEASE["publish"]["main"] == MAIN


def test_pins_match_pyproject_ranges() -> None:
    pinned = {norm(p): v for p, v in (PINS["pure"] | PINS["compiled"]).items()}
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for requirement in pyproject["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9][\w.-]*)\s*([^;\[]*)", requirement)
        assert match, f"unhandled requirement {requirement!r}"
        name, specifier = norm(match[1]), match[2]
        assert name in pinned, f"{name} is a dependency but not pinned in packaging/pins.toml"
        assert satisfies(pinned[name], specifier), f"{name} {pinned[name]} vs {specifier}"


def test_satisfies_and_marker_helpers() -> None:
    assert satisfies("0.28.1", ">=0.28,<0.29") and not satisfies("0.29.0", ">=0.28,<0.29")
    assert satisfies("1.0.9", "==1.*") and not satisfies("2.0", "==1.*")
    assert satisfies("2.50.5", "==2.50.5") and not satisfies("4.15.0", ">=4.16.0")
    assert marker_holds('python_version < "3.15"', "3.14") is True
    assert marker_holds('python_version < "3.11"', "3.11") is False
    assert marker_holds('extra == "cli"', "3.11") is None


# -- refusals ----------------------------------------------------------------------------------


def make_wheel(path: Path, members: dict[str, str], purelib: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo-1.0.dist-info/WHEEL", f"Root-Is-Purelib: {str(purelib).lower()}\n")
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def test_unpack_lays_out_like_pip_target_and_refuses_what_pip_would_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = load("wheels", monkeypatch)
    good = make_wheel(
        tmp_path / "good.whl", {"demo/__init__.py": "", "demo-1.0.data/purelib/x.py": ""}
    )
    written = wheels.unpack(good, tmp_path / "out", pure=True)
    assert sorted(map(str, written)) == ["demo-1.0.dist-info/WHEEL", "demo/__init__.py", "x.py"]
    assert (tmp_path / "out" / "x.py").is_file()
    with pytest.raises(wheels.WheelError, match="overwrite"):
        wheels.unpack(good, tmp_path / "out", pure=True)
    bad = {
        "so": {"demo/_speed.cpython-311-x86_64-linux-gnu.so": ""},
        "escape": {"../evil.py": ""},
        "scripts": {"demo-1.0.data/scripts/run": ""},
    }
    for label, members in bad.items():
        wheel = make_wheel(tmp_path / f"{label}.whl", members)
        with pytest.raises(wheels.WheelError):
            wheels.unpack(wheel, tmp_path / label, pure=True)
    platlib = make_wheel(tmp_path / "plat.whl", {"demo/__init__.py": ""}, purelib=False)
    with pytest.raises(wheels.WheelError, match="not pure"):
        wheels.unpack(platlib, tmp_path / "plat", pure=True)


def test_a_cached_wheel_with_the_wrong_sha256_is_refused_before_any_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = load("wheels", monkeypatch)
    entry = LOCK["wheels"][0]
    (tmp_path / entry["file"]).write_bytes(b"not the wheel")
    want = wheels.Wanted(entry["project"], entry["version"])
    with pytest.raises(wheels.WheelError, match="refusing"):
        wheels.ensure([wheels.Locked(want, entry["file"], entry["sha256"])], tmp_path)


def test_disagreeing_versions_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = load("sources", monkeypatch)
    for name in ("release.toml", "pyproject.toml", "manifest.json", "package.json"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    release = sources.load_release(tmp_path)
    sources.check_versions(tmp_path, release)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(manifest | {"version": "9.9.9"}))
    with pytest.raises(sources.SourceError, match="versions disagree"):
        sources.check_versions(tmp_path, release)


# -- the built packages ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def main_tgz(built: dict[str, Path]) -> Iterator[tarfile.TarFile]:
    with tarfile.open(built[f"{MAIN}-{VERSION}.tgz"]) as tgz:
        yield tgz


@pytest.fixture(scope="session")
def runtime_tgz(built: dict[str, Path]) -> Iterator[tarfile.TarFile]:
    with tarfile.open(built[f"{RUNTIME_PREFIX}{host_key()}-{VERSION}.tgz"]) as tgz:
        yield tgz


def names(tgz: tarfile.TarFile) -> set[str]:
    return {m.name.removeprefix("package/") for m in tgz.getmembers() if m.isfile()}


def read(tgz: tarfile.TarFile, name: str) -> str:
    member = tgz.extractfile(f"package/{name}")
    assert member is not None, name
    return member.read().decode()


def test_built_exactly_the_main_and_the_host_runtime_package(built: dict[str, Path]) -> None:
    assert sorted(built) == sorted(
        [f"{MAIN}-{VERSION}.tgz", f"{RUNTIME_PREFIX}{host_key()}-{VERSION}.tgz"]
    )


def test_main_package_layout(main_tgz: tarfile.TarFile) -> None:
    files = names(main_tgz)
    for needed in ("python/bootstrap.py", "python/httpx/__init__.py", "provider/__main__.py"):
        assert needed in files, needed
    for name in ("manifest.js", "manifest.json", "shim.mjs"):
        assert read(main_tgz, name) == (REPO_ROOT / name).read_text(), name
    assert read(main_tgz, "python/bootstrap.py") == (PACKAGING / "bootstrap.py").read_text()
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", ".pyo"))]
    assert not [f for f in files if EXTENSION.search(f)], "compiled files in the main package"
    source = {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "provider").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }
    assert {f for f in files if f.startswith("provider/")} == source
    tops = {f.split("/")[1] for f in files if f.startswith("python/") and f.count("/") > 1}
    for project, version in PINS["pure"].items():
        assert f"{project.replace('-', '_')}-{version}.dist-info" in tops, project


#: What the main package holds at its top, and the Python packages of provider/ in it: the
#: worker, the emulator and the operator commands, nothing the repo keeps for itself (devtools/,
#: tests/, bench/, live_tests/ stay in the checkout). A new package of provider/ is added here.
MAIN_TOP = {"manifest.js", "manifest.json", "package.json", "provider", "python", "shim.mjs"}
SHIPPED_PACKAGES = {
    "provider",
    "provider.createos",
    "provider.doctor",
    "provider.driver",
    "provider.driver.commands",
    "provider.driver.core",
    "provider.driver.interactive",
    "provider.driver.leases",
    "provider.driver.setup",
    "provider.driver.transfer",
    "provider.emulator",
    "provider.rpc",
    "provider.shell",
}
REPO_ONLY = {"devtools", "tests", "bench", "live_tests", "packaging", "host", "__pycache__"}


def test_main_package_carries_the_worker_and_nothing_the_repo_keeps(
    main_tgz: tarfile.TarFile,
) -> None:
    files = names(main_tgz)
    assert {f.split("/")[0] for f in files} == MAIN_TOP
    packages = {
        f.removesuffix("/__init__.py").replace("/", ".")
        for f in files
        if f.startswith("provider/") and f.endswith("/__init__.py")
    }
    assert packages == SHIPPED_PACKAGES
    ours = [f for f in files if not f.startswith("python/")]
    assert [f for f in ours if REPO_ONLY & set(f.split("/"))] == []
    # python/ holds the bootstrap and the unpacked dependencies: every other top-level name
    # there is one a shipped wheel's RECORD lists.
    recorded = {
        line.split(",", 1)[0].split("/", 1)[0]
        for f in files
        if re.fullmatch(r"python/[^/]+\.dist-info/RECORD", f)
        for line in read(main_tgz, f).splitlines()
    }
    tops = {f.split("/")[1] for f in files if f.startswith("python/")}
    assert tops - recorded == {"bootstrap.py"}


def test_main_package_json(main_tgz: tarfile.TarFile) -> None:
    data = json.loads(read(main_tgz, "package.json"))
    repo = json.loads((REPO_ROOT / "package.json").read_text())
    for key in ("name", "version", "type", "paperclipPlugin", "description", "license"):
        assert data[key] == repo[key], key
    assert data["files"] == ["manifest.js", "manifest.json", "shim.mjs", "provider/", "python/"]
    assert data["optionalDependencies"] == {
        RUNTIME_PREFIX + key: VERSION for key in PINS["platforms"]
    }
    assert "dependencies" not in data and "scripts" not in data


def test_host_runtime_package(runtime_tgz: tarfile.TarFile) -> None:
    data = json.loads(read(runtime_tgz, "package.json"))
    os_, cpu, *libc = host_key().split("-")
    assert data["name"] == RUNTIME_PREFIX + host_key() and data["version"] == VERSION
    assert data["os"] == [os_] and data["cpu"] == [cpu]
    assert data.get("libc") == ([{"gnu": "glibc", "musl": "musl"}[libc[0]]] if libc else None)
    assert data["files"] == [f"{cp}/" for cp in CP_DIRS]
    files = names(runtime_tgz)
    assert {f.split("/")[0] for f in files} == {*CP_DIRS, "package.json"}
    for cp in CP_DIRS:
        for module in ("pydantic_core/_pydantic_core", "msgspec/_core"):
            found = [f for f in files if f.startswith(f"{cp}/{module}.") and EXTENSION.search(f)]
            assert len(found) == 1, (cp, module, found)
            assert f".{cp.replace('cp', 'cpython-')}" in found[0], found[0]
        for project, version in PINS["compiled"].items():
            assert f"{cp}/{project.replace('-', '_')}-{version}.dist-info/METADATA" in files


def requirements(tgz: tarfile.TarFile, folder: str) -> dict[str, tuple[str, list[str]]]:
    """{project: (version, Requires-Dist lines)} of the .dist-info folders directly in folder."""
    found = {}
    for name in names(tgz):
        match = re.fullmatch(rf"{folder}/([^/]+)-([^/-]+)\.dist-info/METADATA", name)
        if match:
            lines = read(tgz, name).split("\n\n", 1)[0].splitlines()
            needs = [
                line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")
            ]
            found[norm(match[1])] = (match[2], needs)
    return found


def test_shipped_dependencies_are_closed_under_requires_dist(
    main_tgz: tarfile.TarFile, runtime_tgz: tarfile.TarFile
) -> None:
    pure = requirements(main_tgz, "python")
    assert sorted(pure) == sorted(norm(project) for project in PINS["pure"])
    for python, cp in zip(PINS["pythons"], CP_DIRS, strict=True):
        shipped = pure | requirements(runtime_tgz, cp)
        for project, (_, needs) in shipped.items():
            for need in needs:
                match = re.fullmatch(
                    r"([A-Za-z0-9][\w.-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?", need
                )
                assert match, need
                marker = match[3]
                if marker is not None and not marker_holds(marker, python):
                    continue
                name = norm(match[1])
                assert name in shipped, f"{project} needs {need} on {python}: not shipped"
                assert satisfies(shipped[name][0], match[2]), f"{project} needs {need}"
