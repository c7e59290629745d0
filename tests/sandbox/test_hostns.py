"""The OCI runtime's mount namespace: the fast path (the owning process entered a private
namespace once) and the fallback (a process with threads: each call sets one up itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sandbox_helpers import IMAGE_DIR, REPO, TIME_SCALE

from shellbox.sandbox import OciRuntime, hostns

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, threading
    from pathlib import Path
    from shellbox.sandbox import ContainerSpec, ExecRequest, create_runtime, hostns
    from shellbox.settings import Settings

    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()  # a thread: no unshare possible

    async def main() -> None:
        state, image = Path(sys.argv[1]), Path(sys.argv[2])
        rt = create_runtime(Settings(state_dir=state, runtime={"image_dir": image}))
        assert not hostns.in_private_namespace()
        await rt.create(ContainerSpec(id="fallback"))
        await rt.start("fallback")
        [r] = await rt.run("fallback", ExecRequest(["id -u; echo ok > f"], 10000, 100))
        print(r.stdout.strip(), (rt.data_dir("fallback") / "f").read_text().strip())
        await rt.destroy("fallback")
        mounts = Path("/proc/self/mountinfo").read_text()
        print("clean" if "fallback" not in mounts else "mount left")

    asyncio.run(main())
    stop.set()
    """
)


FAST = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from shellbox.sandbox import create_runtime, hostns
    from shellbox.settings import Settings

    before = os.readlink("/proc/self/ns/mnt")
    create_runtime(Settings(state_dir=Path(sys.argv[1]), runtime={"image_dir": sys.argv[2]}))
    print(hostns.in_private_namespace(), before != os.readlink("/proc/self/ns/mnt"))
    """
)


def test_a_single_threaded_owner_enters_a_private_mount_namespace(
    host_state_dir: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FAST, str(host_state_dir), str(IMAGE_DIR)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_this_process_is_in_a_namespace_of_its_own_or_says_it_is_not(
    runtime: OciRuntime,
) -> None:
    parent = Path(f"/proc/{os.getppid()}/ns/mnt").readlink()  # whoever started pytest
    separate = Path("/proc/self/ns/mnt").readlink() != parent
    assert hostns.in_private_namespace() == separate


def test_a_process_with_threads_falls_back_to_a_namespace_per_call(
    host_state_dir: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(host_state_dir), str(IMAGE_DIR)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1000", "ok", "clean"]


ROOM = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from shellbox.sandbox import create_runtime
    from shellbox.settings import Settings

    rt = create_runtime(Settings(state_dir=Path(sys.argv[1]), runtime={"image_dir": sys.argv[2]}))
    mode = rt.cgroups.mode.value
    if mode == "hybrid":  # only there does a tmpfs stand in for /sys/fs/cgroup/unified
        st = os.statvfs("/sys/fs/cgroup/unified")
        print(mode, rt.uid_ranges.count, st.f_blocks * st.f_frsize, st.f_files)
    else:
        print(mode, rt.uid_ranges.count, 0, 0)
    """
)


def test_the_cgroup2_stand_in_has_room_for_every_container_the_host_may_hold(
    host_state_dir: Path,
) -> None:
    """On hybrid hosts crun writes a page per running container into the tmpfs that stands in
    for /sys/fs/cgroup/unified: it must hold as many as the host may (runtime.uid_range_count),
    not a fixed 64 (``size=256k``), past which creates failed with ENOSPC."""
    out = subprocess.run(
        [sys.executable, "-c", ROOM, str(host_state_dir), str(IMAGE_DIR)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    mode, count, size, inodes = out.stdout.split()
    if mode != "hybrid":  # no stand-in: crun writes to the real cgroup2 or v1 hierarchies
        return
    assert int(size) >= int(count) * 4096 and int(inodes) >= int(count) * 2, out.stdout


SHARED_IMAGES = textwrap.dedent(
    """
    import asyncio, ctypes, os, sys
    from pathlib import Path
    from shellbox.sandbox import ContainerSpec, ExecRequest, create_runtime, idmap
    from shellbox.settings import Settings

    MS_BIND, MS_REC, MS_PRIVATE, MS_SHARED = 0x1000, 0x4000, 1 << 18, 1 << 20
    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret, what):
        if ret:
            raise OSError(ctypes.get_errno(), what)

    state, images, shared, n = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    # This test's own namespace (the host's mounts stay as they are), where the image
    # directory is a shared mount of its own: a systemd host with the image on another
    # filesystem than the state directory (the v2 guest's work disk).
    check(libc.unshare(0x20000), "unshare")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    check(libc.mount(images.encode(), shared.encode(), None, MS_BIND, None), "bind")
    check(libc.mount(None, shared.encode(), None, MS_SHARED, None), "make it shared")

    async def main() -> None:
        rt = create_runtime(Settings(state_dir=state, runtime={"image_dir": shared}))
        ids = [f"shared-{i}" for i in range(n)]

        async def one(cid: str) -> None:
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)

        try:
            starts = await asyncio.gather(*(one(c) for c in ids), return_exceptions=True)
            print("starts:", [type(e).__name__ + ": " + str(e) for e in starts if e] or "ok")
            outs = await asyncio.gather(
                *(rt.run(c, ExecRequest(["echo ok"], 20_000, 100)) for c in ids)
            )
            print("runs:", "ok" if all(r[0].stdout == "ok\\n" for r in outs) else outs)
            # The id-mapped image is private: what is mounted on it (the overlay) does not
            # propagate back onto the image in the source's peers.
            target = state / "target"
            target.mkdir()
            idmap.mount_image(str(rt.image_rootfs), str(target), 0x7000_0000)
            check(libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, None), "tmpfs")
            print("image covered:", os.path.ismount(rt.image_rootfs))
        finally:
            for cid in ids:
                await rt.destroy(cid)

    asyncio.run(main())
    """
)


def test_starts_at_once_with_the_image_on_a_shared_mount_of_its_own(
    host_state_dir: Path, tmp_path: Path
) -> None:
    """The id-mapped image each start mounts is a clone of the image's mount: left in that
    mount's peer group, the overlay mounted on it was propagated back onto the image itself
    (in every namespace holding a peer, the host's too), so that the next start's clone of
    the image was that overlay and could not be id-mapped ("Invalid argument" on Debian 12's
    systemd host, where mounts are shared and the image was on a disk of its own)."""
    shared = tmp_path / "images"
    shared.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", SHARED_IMAGES, str(host_state_dir), str(IMAGE_DIR.resolve()),
         str(shared), "3"],
        capture_output=True, text=True, cwd=REPO, timeout=120 * TIME_SCALE,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["starts: ok", "runs: ok", "image covered: False"]
