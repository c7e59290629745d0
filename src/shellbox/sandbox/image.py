"""The sandbox image: a Debian 12 root filesystem built with mmdebstrap, shared read-only.

The recipe (suite, packages, post-steps) is hashed; an image lives in
``<image_dir>/<profile>-<hash>/rootfs`` (``<state>/images`` by default) and is rebuilt only
when the recipe changes. After the build its owners are shifted by ``idmap.IMAGE_UID_BASE``;
each container sees it through an id-mapped mount that shifts them on to its own uid range,
and the tree is only ever used as an overlay lower layer (never written).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from shellbox.errors import ImageBuildError
from shellbox.sandbox.idmap import IMAGE_UID_BASE
from shellbox.sandbox.oci import SANDBOX_UID

Profile = Literal["minimal", "full"]
RECIPE_VERSION = 4
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_PACKAGES = (
    "bash",
    "coreutils",
    "python3",
    "python3-pip",
    "python3-venv",
    "ca-certificates",
    "curl",
    "git",
    "procps",
    "less",
    "jq",
    "zip",
    "unzip",
    "file",
    "findutils",
    "grep",
    "sed",
    "tar",
    "gzip",
    "xz-utils",
    "bzip2",
    "iproute2",
    "netbase",
    # OpenAI's hosted shell has Node.js in its default image, and agents reach for it.
    "nodejs",
)
FULL_PACKAGES = (
    "npm",
    "openjdk-17-jdk-headless",
    "php8.2-cli",
    "ruby",
    "golang-go",
    "build-essential",
)
PROFILES: dict[str, tuple[str, ...]] = {
    "minimal": BASE_PACKAGES,
    "full": BASE_PACKAGES + FULL_PACKAGES,
}
# mmdebstrap's own stage lines, and how far along the whole build each one is.
STAGES = (
    ("I: automatically chosen", 2, "resolving"),
    ("I: running apt-get update", 5, "updating package lists"),
    ("I: downloading packages", 10, "downloading packages"),
    ("I: extracting archives", 35, "extracting archives"),
    ("I: installing essential packages", 45, "installing essential packages"),
    ("I: installing remaining packages", 60, "installing packages"),
    ("I: cleaning package lists", 88, "cleaning up"),
    ("I: success", 90, "finishing the image"),
)
EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)


def recipe(profile: Profile) -> dict[str, object]:
    return {
        "version": RECIPE_VERSION,
        "suite": SUITE,
        "mirrors": list(MIRRORS),
        "packages": sorted(PROFILES[profile]),
        "excludes": list(EXCLUDES),
        "uid_base": IMAGE_UID_BASE,
        "sandbox_uid": SANDBOX_UID,
    }


def recipe_hash(profile: Profile) -> str:
    blob = json.dumps(recipe(profile), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class Image:
    profile: Profile
    path: Path  # the rootfs

    @property
    def ready(self) -> bool:
        return (self.path.parent / "complete").exists()


def image_for(image_dir: Path, profile: Profile) -> Image:
    return Image(profile, image_dir / f"{profile}-{recipe_hash(profile)}" / "rootfs")


def ensure_image(
    image_dir: Path, profile: Profile = "minimal", *, out: TextIO | None = None, force: bool = False
) -> Image:
    """Return the image for ``profile``, building it first if it is missing."""
    image = image_for(image_dir, profile)
    if image.ready and not force:
        return image
    build_image(image_dir, profile, out=out if out is not None else sys.stderr)
    return image


def build_image(image_dir: Path, profile: Profile, *, out: TextIO) -> Image:
    image = image_for(image_dir, profile)
    final = image.path.parent
    if shutil.which("mmdebstrap") is None:
        msg = "mmdebstrap is not installed; run ./scripts/setup.sh (apt-get install mmdebstrap)"
        raise ImageBuildError(msg)
    work = final.parent / f".build-{final.name}-{os.getpid()}"
    if work.exists():
        remove_build_dir(work)
    work.mkdir(parents=True)
    rootfs = work / "rootfs"
    bar = ProgressBar(out, f"building sandbox image ({profile})")
    # mmdebstrap (root mode) mounts /dev, /proc and /sys inside the tree it builds. In a
    # private mount namespace those mounts die with it, even when the build is killed, so
    # removing the half-built tree can never reach the host's /dev through them.
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        f"--include={','.join(PROFILES[profile])}",
        '--aptopt=Acquire::Check-Valid-Until "false"',
        '--aptopt=APT::Install-Recommends "false"',
        *(f"--dpkgopt={e}" for e in EXCLUDES),
        # Maintainer scripts (openjdk's update-alternatives) link man pages into man1 and fail
        # when the directory is missing, which excluding /usr/share/man would make it.
        '--setup-hook=mkdir -p "$1/usr/share/man/man1"',
        SUITE,
        str(rootfs),
        *MIRRORS,
    ]
    log_path = work / "mmdebstrap.log"
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
            )
            assert proc.stderr is not None
            for line in proc.stderr:
                log.write(line)
                for prefix, percent, label in STAGES:
                    if line.startswith(prefix):
                        bar.update(percent, label)
            if proc.wait() != 0:
                kept = final.parent / f"{final.name}.failed.log"
                shutil.copyfile(log_path, kept)
                raise ImageBuildError(build_failure(log_path.read_text(), kept))
        bar.update(92, "adding the sandbox user")
        _finish_rootfs(rootfs)
        bar.update(95, "shifting ownership into the user namespace")
        shift_ownership(rootfs, IMAGE_UID_BASE)
        (work / "recipe.json").write_text(json.dumps(recipe(profile), indent=2))
        (work / "complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        os.chmod(work, 0o755)
        if final.exists():
            remove_build_dir(final)
        work.rename(final)
        bar.done("sandbox image ready")
    except BaseException:
        bar.close()
        remove_build_dir(work)
        raise
    return image


def build_failure(log: str, kept: Path) -> str:
    """What went wrong, from mmdebstrap's log: its error lines (dpkg and apt say there which
    package failed and why), the last lines, and where the whole log was kept."""
    lines = log.splitlines()
    errors = [ln for ln in lines if ln.startswith(("E: ", "dpkg: error")) or " error: " in ln]
    shown = list(dict.fromkeys(errors[:12] + lines[-5:]))
    return "mmdebstrap failed:\n" + "\n".join(shown) + f"\n(the whole log: {kept})"


def remove_build_dir(path: Path) -> None:
    """Remove a (half-)built image tree without ever descending into a mount point.

    A build interrupted by an older version, or mmdebstrap run outside our mount namespace,
    can leave /dev, /proc or /sys mounted inside the tree: unmount those first (deepest
    first), then remove only what lives on the tree's own file system.
    """
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f if line.split()[4].startswith(prefix)]
    for mountpoint in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)
    device = os.lstat(path).st_dev

    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.lstat(p).st_dev == device:
                os.unlink(p)
        for name in dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if st.st_dev != device:
                msg = f"refusing to remove {p}: it is on another file system (a mount?)"
                raise ImageBuildError(msg)
            if os.path.islink(p):
                os.unlink(p)
            else:
                os.rmdir(p)
    os.rmdir(path)


def _finish_rootfs(rootfs: Path) -> None:
    """Add the sandbox user and the mount points the runtime binds."""
    subprocess.run(
        [
            "chroot",
            str(rootfs),
            "useradd",
            "--create-home",
            "--uid",
            str(SANDBOX_UID),
            "--user-group",
            "--shell",
            "/bin/bash",
            "user",
        ],
        check=True,
        capture_output=True,
    )
    for d in ("mnt/data", "mnt/skills", "opt/shellbox/agent", "run/shellbox"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chown(rootfs / "mnt/data", SANDBOX_UID, SANDBOX_UID)
    (rootfs / "etc/hosts").write_text(
        "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost\n"
    )
    (rootfs / "etc/hostname").write_text("sandbox\n")
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    (rootfs / "etc/resolv.conf").write_text("")
    # pip refuses system-wide installs on Debian 12 (PEP 668); the sandbox user's --user
    # installs are what agents expect from a hosted shell.
    (rootfs / "etc/pip.conf").write_text("[global]\nbreak-system-packages = true\n")
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def shift_ownership(root: Path, base: int) -> None:
    """Add ``base`` to every uid and gid under ``root`` (symlinks included, not followed)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            mode = st.st_mode
            os.lchown(p, st.st_uid + base, st.st_gid + base)
            if not os.path.islink(p) and mode & 0o6000:
                os.chmod(p, mode & 0o7777)  # chown clears setuid/setgid bits: put them back
    st = os.lstat(root)
    os.lchown(root, st.st_uid + base, st.st_gid + base)


class ProgressBar:
    """A one-line progress bar on a terminal, plain stage lines otherwise."""

    WIDTH = 30

    def __init__(self, out: TextIO, title: str) -> None:
        self.out = out
        self.title = title
        self.percent = 0
        self.label = "starting"
        self.start = time.monotonic()
        self.tty = out.isatty()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if self.tty:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        else:
            self._line()

    def _render(self) -> str:
        filled = self.WIDTH * self.percent // 100
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.start
        return f"{self.title} [{bar}] {self.percent:3d}% {self.label} ({elapsed:.0f}s)"

    def _line(self, end: str = "\n") -> None:
        with self._lock:
            prefix = "\r\x1b[2K" if self.tty else ""
            self.out.write(prefix + self._render() + end)
            self.out.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            self._line(end="")

    def update(self, percent: int, label: str) -> None:
        self.percent = max(self.percent, percent)
        self.label = label
        if not self.tty:
            self._line()

    def done(self, label: str) -> None:
        self.update(100, label)
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._line()
