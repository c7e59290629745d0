"""Pure builders for the OCI bundle's ``config.json`` and its seccomp profile.

Every container runs in its own user namespace: container uid 0 is host uid ``HOST_UID_BASE``
and the sandbox user (1000) is ``HOST_UID_BASE + 1000``. The shared image is stored with its
owners shifted by the same base (``image.py``), so it looks normal from inside while nothing in
a container is root on the host.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from shellbox.sandbox.base import MEMORY_LIMIT_BYTES, ContainerSpec

HOST_UID_BASE = 100_000  # must match image.py's ownership shift
ID_MAP_SIZE = 65_536
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


def host_uid(container_uid: int) -> int:
    return HOST_UID_BASE + container_uid


def build_config(
    spec: ContainerSpec,
    *,
    rootfs: Path,
    data_dir: Path,
    run_dir: Path,
    agent_dir: Path,
    cgroups_path: str,
    seccomp: Mapping[str, Any] | None,
    seccomp_bpf: bytes | None = None,
    hosts_file: Path | None = None,
) -> dict[str, Any]:
    """The bundle's ``config.json``. ``seccomp_bpf``, crun only: the profile already compiled
    (crun compiles the JSON profile on every start, ~25 ms here; see ``crun.py``)."""
    memory = MEMORY_LIMIT_BYTES[spec.memory_limit]
    period = 100_000
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
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
        {
            "destination": "/mnt/data",
            "type": "bind",
            "source": str(data_dir),
            "options": ["rbind", "nosuid", "nodev", "rw"],
        },
        {
            "destination": SOCKET_DIR,
            "type": "bind",
            "source": str(run_dir),
            "options": ["rbind", "nosuid", "nodev", "noexec", "rw"],
        },
        {
            "destination": AGENT_DIR,
            "type": "bind",
            "source": str(agent_dir),
            "options": ["rbind", "nosuid", "nodev", "ro"],
        },
    ]
    if hosts_file is not None:
        mounts.append(
            {
                "destination": "/etc/hosts",
                "type": "bind",
                "source": str(hosts_file),
                "options": ["bind", "nosuid", "nodev", "noexec", "ro"],
            }
        )
    for m in spec.mounts:
        mounts.append(
            {
                "destination": m.destination,
                "type": "bind",
                "source": str(m.source),
                "options": ["rbind", "nosuid", "nodev", "ro" if m.read_only else "rw"],
            }
        )
    namespaces: list[dict[str, str]] = [
        {"type": "pid"},
        {"type": "ipc"},
        {"type": "uts"},
        {"type": "mount"},
        {"type": "user"},
        {"type": "cgroup"},
    ]
    if spec.netns_path:
        namespaces.append({"type": "network", "path": spec.netns_path})
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
            "uidMappings": [{"containerID": 0, "hostID": HOST_UID_BASE, "size": ID_MAP_SIZE}],
            "gidMappings": [{"containerID": 0, "hostID": HOST_UID_BASE, "size": ID_MAP_SIZE}],
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


def hosts_file_text(hosts: Mapping[str, str]) -> str:
    """``/etc/hosts`` for a container: the image's two lines plus ``name -> address`` entries."""
    lines = ["127.0.0.1\tlocalhost sandbox", "::1\tlocalhost ip6-localhost"]
    lines += [f"{address}\t{name}" for name, address in sorted(hosts.items())]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=4)
def load_seccomp(path: Path = DEFAULT_SECCOMP, arch: str = "amd64") -> dict[str, Any] | None:
    """The Docker/podman default profile, resolved for our capabilities and architecture."""
    if not path.exists():
        return None
    return convert_seccomp(json.loads(path.read_text()), set(AGENT_CAPABILITIES), arch)


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
