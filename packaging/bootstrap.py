# Start of the worker in an installed npm package (python/bootstrap.py there).
#
# shim.mjs runs `python3 -I python/bootstrap.py` when the package has no .venv (an operator's
# install by package name). Isolated mode (-I) keeps the server user's site-packages and
# PYTHON* variables out; this file then builds the import path from shipped files only:
#
#   <package>/             provider/ (the worker's source)
#   <package>/python/      the pure-Python dependencies, unpacked at build time
#   <runtime>/cp3XY/       the compiled ones (pydantic_core, msgspec) for this CPython, from the
#                          platform package npm installed beside ours (PAPERCLIP_CREATEOS_RUNTIME)
#
# Nothing is downloaded, built or unpacked here: the only file CPython may write is its own
# bytecode cache, which it writes atomically (a temp file, then a rename) inside the package
# folder, so a killed start leaves nothing half-made and an upgrade or uninstall removes it.
#
# Every check runs before the worker starts, so a Python that cannot run it never answers
# `initialize` half-working: stderr says what is missing and how to fix it, and the host shows
# the plugin's error state. This file must stay parseable by old Pythons (no f-strings, no
# annotations) so that it can say "too old" instead of failing with a SyntaxError.
import os
import sys

MYPY = False
if MYPY:  # type comments only: this file must parse on Pythons without annotations
    from typing import NoReturn  # noqa: F401  (used by the type comments)

NAME = "paperclip-plugin-createos"
MINIMUM = (3, 11)
# What an operator can do on the server. Developer hints (a source checkout) live in the README.
FIX = (
    "install CPython 3.11 or newer (3.11 to 3.14 are shipped) on the Paperclip server as "
    "python3 on the server's PATH, then restart the server or enable the plugin again"
)
REINSTALL = (
    "reinstall the plugin by name (paperclipai plugin uninstall, then plugin install) with npm's "
    "optional dependencies on (no --omit=optional, no omit=optional in the npm config), then "
    "restart the server or enable the plugin again"
)
SHIPPED = ("linux-x64-gnu", "linux-arm64-gnu", "linux-x64-musl", "darwin-arm64", "darwin-x64")
EXIT_UNUSABLE = 78  # EX_CONFIG: the host's environment cannot run this worker


def fail(message):
    # type: (str) -> NoReturn
    sys.stderr.write(NAME + ": " + message + "\n")
    sys.stderr.flush()
    sys.exit(EXIT_UNUSABLE)


def platform_key():
    # type: () -> str
    """The runtime packages' platform key (what shim.mjs computes), for a start by hand."""
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        os.uname()[4].lower(), os.uname()[4].lower()
    )
    system = os.uname()[0].lower()  # not sys.platform: type checkers fold that to one branch
    if system == "linux":
        musl = any(
            os.path.exists(p) for p in ("/lib/ld-musl-x86_64.so.1", "/lib/ld-musl-aarch64.so.1")
        )
        return "linux-%s-%s" % (machine, "musl" if musl else "gnu")
    return "%s-%s" % (system, machine)


def sibling_runtime(package, platform):
    # type: (str, str) -> str
    """Run by hand (the attach helper: python3 -I <package>/python/bootstrap.py shell ...),
    nobody resolved the runtime package: look for it beside ours in node_modules."""
    candidate = os.path.join(os.path.dirname(package), "paperclip-createos-runtime-" + platform)
    return candidate if os.path.isdir(candidate) else ""


def main():
    # type: () -> None
    version = sys.version_info
    found = "%d.%d.%d" % (version[0], version[1], version[2])
    if tuple(version[:2]) < MINIMUM:
        fail(
            "Python %s at %s is too old: the worker needs Python 3.11 or newer; %s."
            % (found, sys.executable, FIX)
        )
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(here)
    platform = os.environ.get("PAPERCLIP_CREATEOS_PLATFORM") or platform_key()
    runtime = os.environ.get("PAPERCLIP_CREATEOS_RUNTIME") or sibling_runtime(package, platform)
    if not runtime or not os.path.isdir(runtime):
        if platform in SHIPPED:
            fail(
                "the runtime package paperclip-createos-runtime-%s is not installed beside the "
                "plugin (npm leaves optional dependencies out with --omit=optional): %s."
                % (platform, REINSTALL)
            )
        fail(
            "this platform (%s) has no shipped runtime (shipped: %s): run the Paperclip server "
            "on one of those platforms." % (platform, ", ".join(SHIPPED))
        )
    tag = "cp%d%d" % (version[0], version[1])
    compiled = os.path.join(runtime, tag)
    if not os.path.isdir(compiled):
        shipped = sorted(n for n in os.listdir(runtime) if n.startswith("cp") and n[2:].isdigit())
        fail(
            "the runtime package for %s has no build for Python %s (it ships %s); %s."
            % (platform, found, ", ".join(shipped) or "none", FIX)
        )
    sys.path[0:0] = [package, here, compiled]
    try:
        import msgspec  # noqa: F401  (the compiled dependencies must load before anything runs)
        import pydantic_core  # noqa: F401
    except ImportError as exc:
        fail(
            "the runtime for %s and Python %s does not load on this machine (%s): %s."
            % (platform, found, exc, REINSTALL)
        )
    import runpy

    runpy.run_module("provider", run_name="__main__", alter_sys=True)


main()
