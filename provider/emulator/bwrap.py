"""Bubblewrap launcher: the guest filesystem view, the sandbox command line and the self-test.

Every sandbox is one long-lived ``bwrap`` whose payload is the in-guest supervisor
(``guest_supervisor.py``) running as pid 1 of a new PID namespace. The guest sees the host's
``/usr`` (and the usual ``/bin``, ``/lib`` symlinks) read-only, a synthetic ``/etc`` with a few
host files bound read-only, fresh ``/proc`` and ``/dev``, and three writable binds of the
sandbox's host-side state dir: ``/paperclip-workspace``, ``/tmp`` and ``/root`` (HOME). A
folder image (``images.py``) adds read-only binds on top of that view. The synthetic
``/etc/profile`` (read by login shells, ``bash -lc``, which is how the worker runs commands) puts
``$HOME/.local/bin`` first on ``PATH`` (creating it when missing), so tests can install fake agent
CLIs there; other processes get :data:`GUEST_PATH`.

When the emulator runs as root, bwrap itself runs as an unprivileged host uid (``GUEST_UID``)
inside a user namespace mapping it to guest uid 0, so guest "root" has no power on the host.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GUEST_UID = 65534
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # non-login shells
HOME_BIN = ".local/bin"  # under HOME: first on PATH in login shells (see write_guest_etc)
SUPERVISOR_GUEST_DIR = "/run/createos"  # the supervisor and its helper modules
SUPERVISOR_GUEST_PATH = f"{SUPERVISOR_GUEST_DIR}/supervisor.py"
INSTALL_HINT = (
    "the CreateOS emulator needs bubblewrap (bwrap) with working user and PID namespaces; "
    "install it with `apt-get install bubblewrap`"
)

# Host /etc entries the guest may read (bound read-only when they exist).
HOST_ETC = (
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "resolv.conf",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "terminfo",
)
ROOT_LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"))
OPTIONAL_ROOT_LINKS = (("usr/lib64", "/lib64"), ("usr/lib32", "/lib32"), ("usr/libx32", "/libx32"))


class BwrapUnavailable(RuntimeError):
    """bwrap is missing or cannot create the namespaces a sandbox needs."""


def check_reachable(path: Path, runtime: GuestRuntime) -> None:
    """Raise ValueError when bwrap (running as the guest uid) could not reach ``path``."""
    if runtime.drop_to_uid is None:
        return
    done = subprocess.run(
        ["test", "-x", str(path)],
        check=False,
        user=runtime.drop_to_uid,
        group=runtime.drop_to_uid,
        extra_groups=[],
    )
    if done.returncode != 0:
        raise ValueError(
            f"data dir {path} is not reachable by uid {runtime.drop_to_uid}, which runs the "
            "sandboxes: every parent directory needs o+x; choose another data dir"
        )


@dataclass(frozen=True)
class GuestRuntime:
    """How sandboxes are launched on this host (decided once by :func:`probe_runtime`)."""

    bwrap: str
    python: str  # interpreter path inside the guest
    python_bind: tuple[str, str] | None  # (host dir, guest dir) when python is not under /usr
    drop_to_uid: int | None  # host uid bwrap runs as (root hosts), None = current user


def _guest_python() -> tuple[str, tuple[str, str] | None]:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists():
            return candidate, None
    prefix = Path(sys.base_prefix)
    return "/opt/createos-python/bin/python3", (str(prefix), "/opt/createos-python")


def write_guest_etc(etc_dir: Path, hostname: str) -> None:
    """Write the synthetic /etc files of one sandbox (bound read-only into the guest)."""
    etc_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "hostname": f"{hostname}\n",
        "hosts": f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n::1 localhost\n",
        "profile": (
            "# Login shells: the guest's writable ~/.local/bin (fake agent CLIs) comes first.\n"
            f'export PATH="${{HOME:-/root}}/{HOME_BIN}:{GUEST_PATH}"\n'
            f'[ -d "${{HOME:-/root}}/{HOME_BIN}" ] || mkdir -p "${{HOME:-/root}}/{HOME_BIN}" '
            "2>/dev/null || :\n"
            "export LANG=C.UTF-8\n"
            "if [ -d /etc/profile.d ]; then\n"
            '  for f in /etc/profile.d/*.sh; do [ -r "$f" ] && . "$f"; done; unset f\n'
            "fi\n"
        ),
        "shells": "/bin/sh\n/bin/bash\n/usr/bin/bash\n",
    }
    for name, text in files.items():
        path = etc_dir / name
        path.write_text(text)
        path.chmod(0o644)
    (etc_dir / "profile.d").mkdir(exist_ok=True)
    etc_dir.chmod(0o755)


def sandbox_argv(
    runtime: GuestRuntime,
    *,
    fs_dir: Path,
    etc_dir: Path,
    supervisor: Path,
    hostname: str,
    ctrl_fd: int,
    unshare_net: bool,
    guest_agent: bool = False,
    image_mounts: Sequence[str] = (),
) -> list[str]:
    """The full bwrap command line of one sandbox (payload: the supervisor on ``ctrl_fd``,
    serving the guest agent when ``guest_agent``); ``image_mounts`` (from
    :func:`images.image_mounts`) overlay the sandbox's image. A host ``/etc`` entry that
    ``etc_dir`` also holds (``resolv.conf`` of a user-mode sandbox) is the sandbox's own."""
    argv = [runtime.bwrap, "--unshare-user", "--uid", "0", "--gid", "0"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if unshare_net:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--as-pid-1", "--new-session", "--hostname", hostname]
    argv += ["--ro-bind", "/usr", "/usr"]
    for target, link in ROOT_LINKS:
        argv += ["--symlink", target, link]
    for target, link in OPTIONAL_ROOT_LINKS:
        if Path("/" + target).is_dir():
            argv += ["--symlink", target, link]
    argv += image_mounts
    argv += ["--proc", "/proc", "--dev", "/dev", "--dir", "/run", "--dir", "/var/tmp"]
    argv += ["--dir", "/etc"]
    own = sorted(p.name for p in etc_dir.iterdir())
    for entry in own:
        argv += ["--ro-bind", str(etc_dir / entry), f"/etc/{entry}"]
    for name in HOST_ETC:
        if name not in own:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for guest in ("paperclip-workspace", "tmp", "root"):
        argv += ["--bind", str(fs_dir / guest), f"/{guest}"]
    if runtime.python_bind is not None:
        argv += ["--ro-bind", runtime.python_bind[0], runtime.python_bind[1]]
    argv += ["--ro-bind", str(supervisor.parent), SUPERVISOR_GUEST_DIR]  # with its helpers
    argv += ["--clearenv", "--setenv", "PATH", GUEST_PATH, "--setenv", "HOME", "/root"]
    argv += ["--setenv", "LANG", "C.UTF-8", "--chdir", "/"]
    argv += [runtime.python, "-I", "-S", SUPERVISOR_GUEST_PATH, str(ctrl_fd)]
    if guest_agent:
        argv.append("agent")
    return argv


def _try_runtime(runtime: GuestRuntime) -> str | None:
    """Run a tiny sandbox; None when it works, else the reason."""
    argv = [runtime.bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid"]
    argv += ["--unshare-uts", "--die-with-parent", "--as-pid-1", "--ro-bind", "/usr", "/usr"]
    for target, link in ROOT_LINKS + OPTIONAL_ROOT_LINKS:
        if Path("/" + target).is_dir():
            argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if runtime.python_bind is not None:
        argv += ["--ro-bind", runtime.python_bind[0], runtime.python_bind[1]]
    argv += [runtime.python, "-I", "-S", "-c", "import os; print(os.getpid())"]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            user=runtime.drop_to_uid,
            group=runtime.drop_to_uid,
            extra_groups=None if runtime.drop_to_uid is None else [],
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0 or done.stdout.strip() != "1":
        return (done.stderr.strip() or f"exit status {done.returncode}")[:300]
    return None


@functools.cache
def probe_runtime() -> GuestRuntime:
    """Find bwrap (``$CREATEOS_EMULATOR_BWRAP`` overrides) and check that it can build a
    sandbox here (cached per process)."""
    override = os.environ.get("CREATEOS_EMULATOR_BWRAP")
    if override:
        found = override if Path(override).is_file() else ""
    else:
        found = shutil.which("bwrap") or (
            "/usr/bin/bwrap" if Path("/usr/bin/bwrap").exists() else ""
        )
    if not found:
        raise BwrapUnavailable(f"bwrap not found: {INSTALL_HINT}")
    python, bind = _guest_python()
    reasons = []
    candidates = []
    if os.geteuid() == 0:
        candidates.append(GuestRuntime(found, python, bind, GUEST_UID))
    candidates.append(GuestRuntime(found, python, bind, None))
    for runtime in candidates:
        reason = _try_runtime(runtime)
        if reason is None:
            return runtime
        reasons.append(reason)
    raise BwrapUnavailable(f"bwrap cannot create a sandbox ({reasons[-1]}): {INSTALL_HINT}")
