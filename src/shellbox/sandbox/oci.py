"""Pure builders for the OCI bundle's ``config.json`` and its seccomp profile.

Every container runs in its own user namespace over a host uid range of its own
(``idmap.py``): container uid 0 is host uid ``uid_base`` and the sandbox user (1000) is
``uid_base + 1000``, so nothing in a container is root on the host, nor the owner of another
container's files.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from shellbox.sandbox.base import MEMORY_LIMIT_BYTES, ContainerSpec
from shellbox.sandbox.idmap import RANGE_SIZE

ID_MAP_SIZE = RANGE_SIZE
SANDBOX_UID = 1000  # must match agent/protocol.py SANDBOX_UID
AGENT_DIR = "/opt/shellbox/agent"  # where the agent's source is mounted read-only
SOCKET_DIR = "/run/shellbox"  # must match agent/protocol.py SOCKET_DIR
LISTEN_FD = 0  # the agent's listening socket: crun's stdin, inherited by a detached container
# Imported rather than run as a script, so that its byte code comes from ``__pycache__``.
AGENT_BOOTSTRAP = f"import sys; sys.path.insert(0, {AGENT_DIR!r}); import server; server.main()"
SECCOMP_BPF_ANNOTATION = "run.oci.seccomp_bpf_data"  # crun: a precompiled filter, base64
DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")
# The agent needs these to drop to uid 1000 and to kill a command's processes; commands lose
# them all when they drop to uid 1000 (no keep-caps, no ambient set, noNewPrivileges).
AGENT_CAPABILITIES = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"]
SANDBOX_PATH = "/home/user/.local/bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
NOFILE_LIMIT = 4096  # at or below the host's hard limit (20000 here: root lacks CAP_SYS_RESOURCE)


def build_config(
    spec: ContainerSpec,
    *,
    rootfs: Path,
    data_dir: Path,
    run_dir: Path,
    agent_dir: Path,
    cgroups_path: str,
    uid_base: int,
    seccomp: Mapping[str, Any] | None,
    seccomp_bpf: bytes | None = None,
    hosts_file: Path | None = None,
    netns_path: str | None = None,
) -> dict[str, Any]:
    """The bundle's ``config.json``. ``seccomp_bpf``, crun only: the profile already compiled
    (crun compiles the JSON profile on every start, ~25 ms here; see ``crun.py``).
    ``spec.mounts`` are bound as they are (the driver has put the skills, the files and the
    network's mounts there); ``netns_path``: the network namespace to join (None: a private
    one with loopback only)."""
    memory = MEMORY_LIMIT_BYTES[spec.memory_limit]
    period = 100_000
    mounts: list[dict[str, Any]] = [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        # A sysfs of the container's own network namespace: a bind of the host's /sys would
        # list the host's network interfaces (crun binds /sys only if this mount is refused).
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        # Read-write so the agent can make per-command cgroups in its delegated subtree.
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "rw"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={spec.tmp_size_mb}m"],
        },
        bind_mount(data_dir, "/mnt/data", read_only=False),
        bind_mount(run_dir, SOCKET_DIR, read_only=False, noexec=True),
        bind_mount(agent_dir, AGENT_DIR, read_only=True),
    ]
    if hosts_file is not None:
        mounts.append(bind_mount(hosts_file, "/etc/hosts", read_only=True, noexec=True, file=True))
    for m in spec.mounts:
        # Skill indexes and CA bundles are single files.
        single_file = not m.source.is_dir()
        mounts.append(bind_mount(m.source, m.destination, read_only=m.read_only, file=single_file))
    namespaces: list[dict[str, str]] = [
        {"type": "pid"},
        {"type": "ipc"},
        {"type": "uts"},
        {"type": "mount"},
        {"type": "user"},
        {"type": "cgroup"},
    ]
    if netns_path:
        namespaces.append({"type": "network", "path": netns_path})
    else:
        namespaces.append({"type": "network"})
    env = [
        f"PATH={SANDBOX_PATH}",
        "LANG=C.UTF-8",
        "HOME=/root",
        "PYTHONDONTWRITEBYTECODE=1",
        f"SHELLBOX_LISTEN_FD={LISTEN_FD}",
    ]
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/usr/bin/python3", "-I", "-S", "-c", AGENT_BOOTSTRAP],
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": AGENT_CAPABILITIES,
                "effective": AGENT_CAPABILITIES,
                "permitted": AGENT_CAPABILITIES,
                "inheritable": [],
                "ambient": [],
            },
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": NOFILE_LIMIT, "soft": NOFILE_LIMIT},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "uidMappings": [{"containerID": 0, "hostID": uid_base, "size": ID_MAP_SIZE}],
            "gidMappings": [{"containerID": 0, "hostID": uid_base, "size": ID_MAP_SIZE}],
            "cgroupsPath": cgroups_path,
            "resources": {
                "memory": {"limit": memory, "swap": memory},
                "pids": {"limit": spec.pids_limit},
                "cpu": {"quota": int(spec.cpus * period), "period": period},
            },
            "namespaces": namespaces,
            "maskedPaths": [
                "/proc/acpi",
                "/proc/asound",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/timer_stats",
                "/proc/sched_debug",
                "/proc/scsi",
                "/sys/firmware",
                "/sys/devices/virtual/powercap",
            ],
            "readonlyPaths": [
                "/proc/bus",
                "/proc/fs",
                "/proc/irq",
                "/proc/sys",
                "/proc/sysrq-trigger",
            ],
        },
    }
    if seccomp_bpf is not None:
        config["annotations"] = {SECCOMP_BPF_ANNOTATION: base64.b64encode(seccomp_bpf).decode()}
    elif seccomp is not None:
        config["linux"]["seccomp"] = dict(seccomp)
    return config


def bind_mount(
    source: Path, destination: str, *, read_only: bool, noexec: bool = False, file: bool = False
) -> dict[str, Any]:
    """A bind mount that is ``nosuid,nodev`` (and ``noexec`` when asked), with what it holds.

    crun 1.8.1 applies ``nosuid``/``nodev``/``noexec`` to a bind mount only when it is also
    read-only (it remounts only then); the recursive forms (``rnosuid``..., applied with
    ``mount_setattr``) take effect in crun and runc alike, on every mount under it too. They
    need a directory: a single file is bound read-only, which crun does remount.
    """
    flags = ["nosuid", "nodev", *(["noexec"] if noexec else [])]
    if file:
        if not read_only:
            msg = f"{destination}: a file is bound read-only only (crun drops its flags)"
            raise ValueError(msg)
        options = ["bind", *flags, "ro"]
    else:
        access = ["ro", "rro"] if read_only else ["rw"]
        options = ["rbind", *flags, *(f"r{f}" for f in flags), *access]
    return {"destination": destination, "type": "bind", "source": str(source), "options": options}


def hosts_file_text(hosts: Mapping[str, str]) -> str:
    """``/etc/hosts`` for a container: the image's two lines plus ``name -> address`` entries."""
    lines = ["127.0.0.1\tlocalhost sandbox", "::1\tlocalhost ip6-localhost"]
    lines += [f"{address}\t{name}" for name, address in sorted(hosts.items())]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=4)
def load_seccomp(path: Path = DEFAULT_SECCOMP, arch: str = "amd64") -> dict[str, Any] | None:
    """The Docker/podman default profile, resolved for our capabilities and architecture,
    then narrowed to what Docker's own profile grants a container without CAP_SYS_ADMIN."""
    if not path.exists():
        return None
    profile = convert_seccomp(json.loads(path.read_text()), set(AGENT_CAPABILITIES), arch)
    return refuse_kernel_surface(profile)


# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
# CLONE_NEWNET: Docker's mask for ``clone`` (2114060288). ``unshare`` also takes CLONE_NEWTIME
# (0x80, the exit-signal byte for ``clone``).
CLONE_NAMESPACES = 0x7E020000
UNSHARE_NAMESPACES = CLONE_NAMESPACES | 0x80
ENOSYS = 38
EPERM = 1
# What podman's profile (Debian's /usr/share/containers/seccomp.json) allows but Docker's
# default refuses a container without CAP_SYS_ADMIN (and without CAP_SYS_PTRACE, CAP_SYSLOG,
# CAP_SYS_BOOT, CAP_BPF, CAP_PERFMON): a nested user namespace is a full capability set over
# new mount, network and other namespaces, i.e. most of the kernel's attack surface.
REFUSED_SYSCALLS = (
    # namespaces: entered, created (``clone``/``unshare`` keep their flag-less uses, below)
    "setns",
    # mounts, old and new API
    "mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    # the kernel keyring (not namespaced), BPF, perf, userfaultfd, file handles
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "open_by_handle_at", "lookup_dcookie", "fanotify_init", "quotactl", "quotactl_fd",
    # other processes' descriptors, the kernel log, reboot, modules, kexec, swap
    "pidfd_getfd", "kcmp", "process_madvise", "syslog", "reboot", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "swapon", "swapoff",
    "acct", "sethostname", "setdomainname", "chroot",
)  # fmt: skip


def _iow(kind: int, nr: int, size: int) -> int:
    """``_IOW`` of <asm-generic/ioctl.h> (x86 and arm64 alike): write, 14-bit size."""
    return 1 << 30 | size << 16 | kind << 8 | nr


BTRFS_IOCTL_MAGIC = 0x94
BTRFS_VOL_ARGS_SIZE = 4096  # struct btrfs_ioctl_vol_args: __s64 fd; char name[4088]
BTRFS_VOL_ARGS_V2_SIZE = 4096  # struct btrfs_ioctl_vol_args_v2: 3 x __u64, 4 x __u64, name[4040]
# The ioctls that make a btrfs subvolume or snapshot: they need no privilege, only a directory
# one can write, and under regular qgroups a new subvolume has a qgroup of its own, outside
# the container's disk quota (see storage.py). Refused, with EPERM, on every kernel.
BTRFS_SUBVOLUME_IOCTLS = {
    "BTRFS_IOC_SNAP_CREATE": _iow(BTRFS_IOCTL_MAGIC, 1, BTRFS_VOL_ARGS_SIZE),
    "BTRFS_IOC_SUBVOL_CREATE": _iow(BTRFS_IOCTL_MAGIC, 14, BTRFS_VOL_ARGS_SIZE),
    "BTRFS_IOC_SNAP_CREATE_V2": _iow(BTRFS_IOCTL_MAGIC, 23, BTRFS_VOL_ARGS_V2_SIZE),
    "BTRFS_IOC_SUBVOL_CREATE_V2": _iow(BTRFS_IOCTL_MAGIC, 24, BTRFS_VOL_ARGS_V2_SIZE),
}


def refuse_kernel_surface(profile: Mapping[str, Any]) -> dict[str, Any]:
    """Docker's semantics for an unprivileged container on top of a converted profile:
    ``REFUSED_SYSCALLS`` answer EPERM, ``clone`` and ``unshare`` only without namespace
    flags, ``clone3`` ENOSYS (its flags sit in memory a filter cannot read; glibc then falls
    back to ``clone`` for threads and ``posix_spawn``)."""
    gated = {"clone", "clone3", "unshare", "ioctl", *REFUSED_SYSCALLS}
    syscalls: list[dict[str, Any]] = []
    for rule in profile.get("syscalls") or []:
        names = [n for n in rule["names"] if n not in gated]  # one rule per name, below
        if names:
            syscalls.append({**rule, "names": names})
    syscalls += [
        {"names": sorted(REFUSED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        *_only_without_flags("clone", CLONE_NAMESPACES),
        *_only_without_flags("unshare", UNSHARE_NAMESPACES),
        *_all_but_requests("ioctl", 1, sorted(BTRFS_SUBVOLUME_IOCTLS.values())),
    ]
    return {**profile, "syscalls": syscalls}


def _all_but_requests(name: str, index: int, refused: list[int]) -> list[dict[str, Any]]:
    """Allowed for every value of argument ``index`` but ``refused``, which answer EPERM.

    The kernel reads an ioctl request as a 32-bit ``unsigned int`` and the filter sees the
    whole 64-bit register, so only the low 32 bits are compared (masked): setting high bits
    cannot slip past. libseccomp lets an unconditional rule override every conditional one
    for the same syscall, so "allow the rest" is spelled out as rules that do not overlap:
    a binary trie over the 32 bits, one rule "these high bits match a refused value's and the
    next one differs from all of them" per branch no refused value takes (39 rules here)."""

    def masked(mask: int, value: int) -> list[dict[str, Any]]:
        return [{"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}]

    rules: list[dict[str, Any]] = []

    def split(values: list[int], bit: int, mask: int, prefix: int) -> None:
        if bit < 0:  # a refused value itself
            rules.append(
                {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
                 "args": masked(mask, prefix)}
            )  # fmt: skip
            return
        b = 1 << bit
        for side in (prefix, prefix | b):
            under = [v for v in values if v & b == side & b]
            if under:
                split(under, bit - 1, mask | b, side)
            else:
                rules.append(
                    {"names": [name], "action": "SCMP_ACT_ALLOW", "args": masked(mask | b, side)}
                )

    split(refused, 31, 0, 0)
    return rules


def _only_without_flags(name: str, mask: int) -> list[dict[str, Any]]:
    """Allowed when no bit of ``mask`` is set in the flags, EPERM (a missing privilege, as
    for the caller's own kernel) when any is: one rule per bit, so no two rules overlap."""

    def flags(mask: int, equal: int) -> list[dict[str, Any]]:  # (arg0 & value) == valueTwo
        return [{"index": 0, "value": mask, "valueTwo": equal, "op": "SCMP_CMP_MASKED_EQ"}]

    rules: list[dict[str, Any]] = [
        {"names": [name], "action": "SCMP_ACT_ALLOW", "args": flags(mask, 0)}
    ]
    for bit in (1 << i for i in range(32) if mask >> i & 1):
        rules.append(
            {
                "names": [name],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": flags(bit, bit),
            }
        )
    return rules


_ARCHES = {"amd64": "SCMP_ARCH_X86_64", "arm64": "SCMP_ARCH_AARCH64"}


def convert_seccomp(profile: Mapping[str, Any], caps: set[str], arch: str) -> dict[str, Any]:
    """Turn a containers-common profile into the OCI ``linux.seccomp`` shape.

    Rules with ``includes``/``excludes`` on capabilities, architectures or kernel versions are
    kept or dropped here, since OCI has no such fields.
    """
    scmp_arch = _ARCHES.get(arch, arch)
    architectures: list[str] = []
    for entry in profile.get("archMap") or []:
        if entry["architecture"] == scmp_arch:
            architectures = [entry["architecture"], *entry.get("subArchitectures", [])]
    syscalls = []
    for rule in profile.get("syscalls") or []:
        inc = rule.get("includes") or {}
        exc = rule.get("excludes") or {}
        if inc.get("caps") and not set(inc["caps"]) <= caps:
            continue
        if inc.get("arches") and arch not in inc["arches"]:
            continue
        if exc.get("caps") and set(exc["caps"]) & caps:
            continue
        if exc.get("arches") and arch in exc["arches"]:
            continue
        out: dict[str, Any] = {"names": rule["names"], "action": rule["action"]}
        if rule.get("args"):
            out["args"] = [
                {k: v for k, v in a.items() if k in ("index", "value", "valueTwo", "op")}
                for a in rule["args"]
            ]
        if "errnoRet" in rule:
            out["errnoRet"] = rule["errnoRet"]
        syscalls.append(out)
    result: dict[str, Any] = {
        "defaultAction": profile.get("defaultAction", "SCMP_ACT_ERRNO"),
        "architectures": architectures,
        "syscalls": syscalls,
    }
    if "defaultErrnoRet" in profile:
        result["defaultErrnoRet"] = profile["defaultErrnoRet"]
    return result
