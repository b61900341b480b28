"""Image specs and folders are checked before the emulator serves; the overlay's bwrap plan."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from provider.emulator import Emulator
from provider.emulator.__main__ import parse_args
from provider.emulator.bwrap import probe_runtime
from provider.emulator.images import ImageCatalog, ImageError, image_mounts

from .image_fixtures import image_emulator, image_folder


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--image", "no-equals-sign"], "wants NAME=DIR"),
        (["--image", "empty-dir="], "wants NAME=DIR"),
        (["--image", "=/tmp"], "invalid image name ''"),
        (["--image", "Upper=/tmp"], "invalid image name 'Upper'"),
        (["--image=-dash=/tmp"], "invalid image name '-dash'"),
        (["--image", "a b=/tmp"], "invalid image name 'a b'"),
        ([f"--image={'a' * 201}=/tmp"], "at most 200 characters"),
        (["--image", "x=/tmp", "--image", "x=/usr"], "image x is given twice"),
        (["--image", "x=/nonexistent/createos-image"], "does not exist"),
        (["--image", "x=/etc/hostname"], "is not a directory"),
        (["--image", "x=/"], "would shadow /"),
    ],
)
def test_bad_image_flags_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --image" in err and message in err, err


def test_good_image_flags_are_parsed() -> None:
    with image_folder() as root:
        odd = root.parent / f"{root.name}=odd"  # only the first '=' splits
        odd.mkdir()
        try:
            args = parse_args(["--image", f"agent:1={root}", "--image", f"org/t.x-2={odd}"])
        finally:
            odd.rmdir()
        assert args.images == {"agent:1": str(root), "org/t.x-2": str(odd)}
    assert parse_args([]).images == {}


@pytest.mark.parametrize(
    ("top", "reason"),
    [
        ("tmp", "private writable tree"),
        ("root", "private writable tree"),
        ("paperclip-workspace", "private writable tree"),
        ("proc", "procfs"),
        ("dev", "/dev"),
        ("etc", "synthetic /etc"),
        ("run", "supervisor"),
        ("bin", "under DIR/usr"),
        ("lib64", "under DIR/usr"),
    ],
)
def test_images_shadowing_guest_mounts_are_refused(top: str, reason: str) -> None:
    with image_folder() as root:
        (root / top).mkdir()
        with pytest.raises(ImageError, match=f"would shadow /{top}, which is .*{reason}"):
            Emulator(images={"agent:1": root})


def test_constructor_checks_names_and_folders() -> None:
    with image_folder() as root:
        with pytest.raises(ImageError, match="invalid image name 'Agent'"):
            Emulator(images={"Agent": root})
        with pytest.raises(ImageError, match="does not exist"):
            Emulator(images={"agent:1": root / "missing"})
        (root / "opt" / "usr").mkdir()
        (root / "usr").rename(root / "opt" / "old-usr")
        (root / "usr").write_text("not a dir")
        with pytest.raises(ImageError, match="usr must be a real directory"):
            Emulator(images={"agent:1": root})
        (root / "usr").unlink()
        (root / "usr").symlink_to("opt/usr")
        with pytest.raises(ImageError, match="usr must be a real directory"):
            ImageCatalog({"agent:1": root})
        (root / "usr").unlink()
        relative = os.path.relpath(root)
        catalog = ImageCatalog({"agent:1": relative})
        image = catalog.get("agent:1")
        assert image is not None and image.root == root.resolve() and image.root.is_absolute()
        assert catalog.get("agent:2") is None


@pytest.mark.anyio
async def test_folder_unreachable_by_the_guest_uid_is_refused_at_start() -> None:
    if probe_runtime().drop_to_uid is None:
        pytest.skip("sandboxes run as the current user here")
    with tempfile.TemporaryDirectory(prefix="createos-img-private-") as private:
        root = Path(private) / "image"  # the parent stays 0700
        (root / "opt/agent").mkdir(parents=True)
        with pytest.raises(ImageError, match=r"not reachable by uid 65534.*chmod -R o\+rX"):
            async with image_emulator({"agent:1": root}):
                pass
        Path(private).chmod(0o755)
        (root / "opt").chmod(0o700)  # bound at /opt, but the guest could not list it
        with pytest.raises(ImageError, match=f"{root}/opt is not reachable"):
            async with image_emulator({"agent:1": root}):
                pass


def _host_usr(base: Path) -> Path:
    host = base / "host-usr"
    (host / "local/bin").mkdir(parents=True)
    (host / "local/bin/old").write_text("host")
    (host / "local/bin/py").symlink_to("old")
    (host / "share").mkdir()
    (host / "share/x").write_text("host")
    (host / "share/y").write_text("host")
    return host


def test_plan_binds_over_files_and_merges_directories(tmp_path: Path) -> None:
    host = _host_usr(tmp_path)
    image = tmp_path / "image"
    (image / "usr/local/bin").mkdir(parents=True)
    (image / "usr/local/bin/new").write_text("image")
    (image / "usr/local/bin/py").write_text("image")  # replaces a host symlink
    (image / "usr/share").mkdir()
    (image / "usr/share/x").write_text("image")  # file over file: no tmpfs
    (image / "opt/agent").mkdir(parents=True)
    (image / "link").symlink_to("opt/agent")
    ops = image_mounts(image, "t", host_usr=host)
    img, hst = str(image), str(host)
    mode = f"{(host / 'local/bin').stat().st_mode & 0o7777:04o}"
    assert ops == [
        *["--symlink", "opt/agent", "/link"],
        *["--ro-bind", f"{img}/opt", "/opt"],
        *["--perms", mode, "--tmpfs", "/usr/local/bin"],
        *["--ro-bind", f"{hst}/local/bin/old", "/usr/local/bin/old"],
        *["--ro-bind", f"{img}/usr/local/bin/new", "/usr/local/bin/new"],
        *["--ro-bind", f"{img}/usr/local/bin/py", "/usr/local/bin/py"],
        *["--remount-ro", "/usr/local/bin"],
        *["--ro-bind", f"{img}/usr/share/x", "/usr/share/x"],
    ]


def test_plan_creates_missing_directories_and_refuses_special_files(tmp_path: Path) -> None:
    host = _host_usr(tmp_path)
    image = tmp_path / "image"
    (image / "usr/games/bin").mkdir(parents=True)
    (image / "usr/share/y").mkdir(parents=True)  # a directory where the host has a file
    ops = image_mounts(image, "t", host_usr=host)
    img, hst = str(image), str(host)
    modes = [f"{p.stat().st_mode & 0o7777:04o}" for p in (host, host / "share")]
    assert ops == [
        *["--perms", modes[0], "--tmpfs", "/usr"],
        *["--ro-bind", f"{hst}/local", "/usr/local"],
        *["--ro-bind", f"{hst}/share", "/usr/share"],
        *["--ro-bind", f"{img}/usr/games", "/usr/games"],
        *["--remount-ro", "/usr"],
        *["--perms", modes[1], "--tmpfs", "/usr/share"],
        *["--ro-bind", f"{hst}/share/x", "/usr/share/x"],
        *["--ro-bind", f"{img}/usr/share/y", "/usr/share/y"],
        *["--remount-ro", "/usr/share"],
    ]
    os.mkfifo(image / "usr/share/pipe")
    with pytest.raises(ImageError, match="pipe is not a file, directory or symlink"):
        image_mounts(image, "t", host_usr=host)
