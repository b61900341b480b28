"""The rootfs catalog: image names mapped to the plain host view or to a local folder.

The built-in names (``devbox:1``, the default, and the rest of :data:`catalog.ROOTFS`) all give
the plain host view. An *extra* image ``NAME=DIR`` (CLI ``--image``, ``Emulator(images=...)``)
overlays the tree of ``DIR`` read-only at the same absolute paths in the guest:
``DIR/opt/agent/bin/claude`` appears as ``/opt/agent/bin/claude`` and
``DIR/usr/local/bin/tool`` as ``/usr/local/bin/tool``, while the host's other ``/usr`` files stay
visible. An extra image may reuse a built-in name to override it (``--image devbox:1=DIR`` puts
the folder into every sandbox created without a ``rootfs``).

bubblewrap 0.8.0 has no ``--overlay-src``, so the overlay is built from bind mounts (see
:func:`image_mounts`): every top-level entry of ``DIR`` except ``usr`` is one ``--ro-bind``;
``DIR/usr`` is merged into the host ``/usr`` directory by directory.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bwrap import GuestRuntime
from .catalog import DEFAULT_ROOTFS, ROOTFS

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._:/-]*")
MAX_NAME = 200
MAX_MOUNT_OPS = 12_000  # bwrap arguments of one image (a merge into /usr/bin takes ~3 per file)

_WRITABLE = "a private writable tree of every sandbox"
_LINKED = "a link into /usr in the guest; put these files under DIR/usr instead"
RESERVED: dict[str, str] = {
    "paperclip-workspace": _WRITABLE,
    "tmp": _WRITABLE,
    "root": _WRITABLE + " (HOME)",
    "proc": "the guest's own procfs",
    "dev": "the guest's own /dev",
    "etc": "the sandbox's synthetic /etc",
    "run": "where the guest supervisor lives",
    "var": "the guest's /var/tmp",
    **{name: _LINKED for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32")},
}


class ImageError(ValueError):
    """A bad image name, folder or spec (raised at emulator start-up, or at create)."""


@dataclass(frozen=True)
class Image:
    """One catalog entry; ``root`` is the folder overlaid read-only (None = plain host view)."""

    name: str
    description: str
    root: Path | None = None


def check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME_RE.fullmatch(name):
        raise ImageError(
            f"invalid image name {name!r}: use lowercase letters, digits and . _ : / - "
            f"(starting with a letter or digit), at most {MAX_NAME} characters"
        )
    return name


def check_folder(name: str, folder: Path | str) -> Path:
    """The folder of image ``name``, resolved to an absolute path, with its top level checked."""
    if not str(folder):
        raise ImageError(f"image {name}: the folder is empty (use --image NAME=DIR)")
    root = Path(folder).resolve()
    if not root.exists():
        raise ImageError(f"image {name}: folder {folder} does not exist")
    if not root.is_dir():
        raise ImageError(f"image {name}: {folder} is not a directory")
    for entry in _scan(root):
        reason = RESERVED.get(entry.name)
        if reason is not None:
            raise ImageError(
                f"image {name}: {entry.path} would shadow /{entry.name}, which is {reason}"
            )
    usr = root / "usr"
    if usr.is_symlink() or (usr.exists() and not usr.is_dir()):
        raise ImageError(f"image {name}: {usr} must be a real directory (merged into /usr)")
    return root


def parse_spec(text: str) -> tuple[str, str]:
    """``NAME=DIR`` (the CLI form) -> ``(NAME, DIR)``; the name is checked, the folder not yet."""
    name, sep, folder = text.partition("=")
    if not sep or not folder:
        raise ImageError(f"--image wants NAME=DIR, got {text!r}")
    return check_name(name), folder


def parse_specs(texts: Iterable[str]) -> dict[str, str]:
    """Every ``--image`` flag as a mapping; a name given twice is refused."""
    images: dict[str, str] = {}
    for text in texts:
        name, folder = parse_spec(text)
        if name in images:
            raise ImageError(f"image {name} is given twice (--image {name}=...)")
        images[name] = folder
    return images


class ImageCatalog:
    """The built-in names plus the extra folder images, validated at construction."""

    def __init__(self, extra: Mapping[str, Path | str] | None = None) -> None:
        self._images = {e["name"]: Image(e["name"], e["description"]) for e in ROOTFS}
        for name, folder in (extra or {}).items():
            check_name(name)
            root = check_folder(name, folder)
            self._images[name] = Image(name, "local folder image (read-only overlay)", root)

    def get(self, name: str) -> Image | None:
        return self._images.get(name)

    def names(self) -> list[str]:
        return list(self._images)

    def view(self) -> dict[str, Any]:
        """The body of ``GET /v1/rootfs``."""
        entries = [{"name": i.name, "description": i.description} for i in self._images.values()]
        return {"rootfs": self.names(), "default": DEFAULT_ROOTFS, "entries": entries}

    def check(self, runtime: GuestRuntime) -> None:
        """Start-up check of every folder image: mountable, and reachable by the guest uid."""
        for image in self._images.values():
            if image.root is None:
                continue
            if runtime.python_bind is not None:
                top = runtime.python_bind[1].strip("/").split("/")[0]
                if (image.root / top).exists():
                    raise ImageError(
                        f"image {image.name}: {image.root / top} would hide the guest's "
                        f"python at {runtime.python_bind[1]}"
                    )
            ops = image_mounts(image.root, image.name)
            sources = [ops[i + 1] for i, op in enumerate(ops) if op == "--ro-bind"]
            blocked = unreachable([image.root, *sources], runtime)
            if blocked is not None:
                raise ImageError(
                    f"image {image.name}: {blocked} is not reachable by uid "
                    f"{runtime.drop_to_uid}, which runs the sandboxes: every parent directory "
                    f"needs o+x and the files o+r (e.g. chmod -R o+rX {image.root}, and o+x on "
                    "its parents), or move the folder"
                )


def unreachable(paths: Iterable[Path | str], runtime: GuestRuntime) -> str | None:
    """The first of ``paths`` the guest uid cannot reach (or list, for folders), else None."""
    if runtime.drop_to_uid is None:
        return None
    script = 'for p; do [ -e "$p" ] && { [ ! -d "$p" ] || [ -r "$p" -a -x "$p" ]; } '
    script += '|| { printf %s "$p"; exit 1; }; done'
    done = subprocess.run(
        ["sh", "-c", script, "sh", *map(str, paths)],
        check=False,
        capture_output=True,
        text=True,
        user=runtime.drop_to_uid,
        group=runtime.drop_to_uid,
        extra_groups=[],
    )
    return None if done.returncode == 0 else (done.stdout or "the image folder")


# -- the overlay as bubblewrap arguments -----------------------------------------------------
def image_mounts(root: Path, name: str = "image", host_usr: Path = Path("/usr")) -> list[str]:
    """bwrap arguments overlaying ``root`` read-only on the guest, placed after the guest's
    ``--ro-bind /usr /usr`` and root links (blocking: it lists directories)."""
    ops: list[str] = []
    for entry in _scan(root):
        if entry.name == "usr":
            _merge(Path(entry.path), host_usr, "/usr", ops, name)
        else:
            ops += _place(entry, "/" + entry.name, name)
    if len(ops) > MAX_MOUNT_OPS:
        raise ImageError(
            f"image {name}: the overlay needs {len(ops) // 3} mounts (more than "
            f"{MAX_MOUNT_OPS // 3}); put its files into directories the host does not have"
        )
    return ops


def _merge(image_dir: Path, host_dir: Path, guest: str, ops: list[str], name: str) -> None:
    """Overlay ``image_dir`` on the (read-only bound) host dir shown at ``guest``.

    Entries that can be mounted over (file on file) get a bind; where the image adds or
    replaces an entry by another kind, ``guest`` becomes a tmpfs holding a bind or symlink per
    host and image entry, then remounted read-only. Directories on both sides recurse."""
    image = _scan(image_dir)
    host = {e.name: e for e in _scan(host_dir)}
    both = [e for e in image if _kind(e, name) == "dir" and _kind(host.get(e.name)) == "dir"]
    both_names = {e.name for e in both}
    fresh = [e for e in image if e.name not in both_names]
    if any(_kind(e, name) != "file" or _kind(host.get(e.name)) != "file" for e in fresh):
        mode = host_dir.stat().st_mode & 0o7777
        ops += ["--perms", f"{mode:04o}", "--tmpfs", guest]
        shadowed = {e.name for e in fresh}
        for entry in host.values():
            if entry.name not in shadowed:
                ops += _place(entry, f"{guest}/{entry.name}", name, host_side=True)
        for entry in fresh:
            ops += _place(entry, f"{guest}/{entry.name}", name)
        ops += ["--remount-ro", guest]
    else:
        for entry in fresh:
            ops += ["--ro-bind", entry.path, f"{guest}/{entry.name}"]
    for entry in both:
        _merge(Path(entry.path), host_dir / entry.name, f"{guest}/{entry.name}", ops, name)


def _place(entry: os.DirEntry[str], guest: str, name: str, *, host_side: bool = False) -> list[str]:
    if entry.is_symlink():
        return ["--symlink", str(Path(entry.path).readlink()), guest]
    if not host_side:
        _kind(entry, name)  # refuses fifos, sockets and devices in the image
    return ["--ro-bind", entry.path, guest]


def _kind(entry: os.DirEntry[str] | None, name: str | None = None) -> str:
    """dir, file, link, other or missing; ``name`` given: an image entry, 'other' refused."""
    if entry is None:
        return "missing"
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    if name is not None:
        raise ImageError(f"image {name}: {entry.path} is not a file, directory or symlink")
    return "other"


def _scan(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise ImageError(f"cannot list {path}: {exc.strerror or exc}") from exc
