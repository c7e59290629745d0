"""What a command cannot do: it runs as uid 1000 with no capabilities, in its own namespaces,
under cgroup limits and the default seccomp profile. Real containers (crun), host-side checks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import REPO, TIME_SCALE, WAIT_S, run1

from shellbox.agent.protocol import OOM_NOTE
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, Mount, OciRuntime
from shellbox.sandbox.cgroups import CgroupMode

ZERO_CAPS = "0000000000000000"


async def test_commands_run_as_uid_1000_with_no_capabilities(
    runtime: OciRuntime, container: str
) -> None:
    probe = "id -G; grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Amb)):' /proc/self/status"
    # The agent starts a command either from its pre-forked spare (after a quiet spell) or
    # by posix_spawn (in a burst of calls): both must end up the same.
    for pause in (0.5, 0.0, 0.0, 0.5):
        await asyncio.sleep(pause)
        [a, b] = await runtime.run(container, ExecRequest([probe, probe], 10_000, 1000))
        for r in (a, b):
            lines = r.stdout.splitlines()
            assert lines[0] == "1000"
            status = dict(line.split(":", 1) for line in lines[1:])
            assert status["Uid"].split() == ["1000"] * 4  # real, effective, saved, fs
            assert status["Gid"].split() == ["1000"] * 4
            assert status["Groups"].strip() == ""
            for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
                assert status[name].strip() == ZERO_CAPS, status
    r = await run1(runtime, container, "grep NoNewPrivs /proc/self/status; which sudo su || true")
    assert r.stdout.startswith("NoNewPrivs:\t1\n")
    r = await run1(runtime, container, "su -c true root </dev/null")
    assert r.outcome.exit_code != 0


async def test_host_secrets_and_the_checkout_are_out_of_reach(
    runtime: OciRuntime, container: str
) -> None:
    r = await run1(runtime, container, "ls -A /root")
    assert r.outcome.exit_code != 0 and "Permission denied" in r.stderr
    r = await run1(runtime, container, "cat /etc/shadow")
    assert r.outcome.exit_code != 0 and "Permission denied" in r.stderr
    # Whatever the container's own files say, they are not the host's.
    host_passwd = Path("/etc/passwd").read_text()
    r = await run1(runtime, container, "cat /etc/passwd")
    assert r.stdout != host_passwd and "user:x:1000:1000" in r.stdout
    for path in (REPO, REPO / "pyproject.toml", runtime.state_dir, "/var/tmp", "/run/shellbox/"):
        r = await run1(runtime, container, f"ls -A {path}")
        host_listing = sorted(os.listdir(path)) if Path(path).is_dir() else []
        assert r.outcome.exit_code != 0 or sorted(r.stdout.split()) != host_listing, path
    r = await run1(runtime, container, f"cat {REPO / 'pyproject.toml'}")
    assert r.outcome.exit_code != 0 and "No such file" in r.stderr


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for sub in ("usr/bin", "etc", "usr/lib/python3.11"):
        for entry in os.scandir(root / sub):
            st = entry.stat(follow_symlinks=False)
            out[f"{sub}/{entry.name}"] = (st.st_mtime_ns, st.st_size)
    return out


async def test_the_image_cannot_be_written(runtime: OciRuntime, container: str) -> None:
    before = _snapshot(runtime.image_rootfs)
    for command in (
        "touch /usr/bin/evil",
        "echo x >> /etc/passwd",
        "rm -f /usr/bin/ls",
        "cp /bin/true /usr/lib/python3.11/os.py",
        "touch /evil",
    ):
        r = await run1(runtime, container, command)
        assert r.outcome.exit_code != 0, command
        assert "Permission denied" in r.stderr or "Read-only" in r.stderr, r.stderr
    # The writable places are the sandbox's own: /mnt/data, /tmp, the home directory.
    r = await run1(runtime, container, "touch /mnt/data/a /tmp/b ~/c && echo ok")
    assert r.stdout == "ok\n"
    assert _snapshot(runtime.image_rootfs) == before
    assert not (runtime.image_rootfs / "evil").exists()
    assert not (runtime.image_rootfs / "home/user/c").exists()


async def test_containers_cannot_see_each_other(runtime: OciRuntime, container: str) -> None:
    other = new_id("cntr_")
    await runtime.create(ContainerSpec(id=other))
    await runtime.start(other)
    try:
        await run1(runtime, container, f"echo secret > mine.txt; sleep 4711.{other[-6:]} &")
        r = await run1(runtime, other, "ls -A /mnt/data; ps -eo args; ls /proc | grep -c '^[0-9]'")
        assert "mine.txt" not in r.stdout
        assert "4711" not in r.stdout
        r = await run1(runtime, other, f"find / -name mine.txt -o -name '{container}*' 2>/dev/null")
        assert r.stdout == ""
        # Only its own processes: the agent, its spare, and this command.
        r = await run1(runtime, other, "ps -e --no-headers | wc -l")
        assert int(r.stdout) <= 5
    finally:
        await runtime.destroy(other)


class _Listener:
    """A TCP server on the host that records every connection it gets."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.sock.settimeout(0.2)
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join()
        self.sock.close()


@pytest.fixture
def listeners() -> Iterator[tuple[_Listener, _Listener]]:
    loopback, anyaddr = _Listener("127.0.0.1"), _Listener("0.0.0.0")
    yield loopback, anyaddr
    loopback.close()
    anyaddr.close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def test_no_network_and_no_host_services(
    runtime: OciRuntime, container: str, listeners: tuple[_Listener, _Listener]
) -> None:
    loopback, anyaddr = listeners
    # The host side really answers: the listeners work.
    socket.create_connection(("127.0.0.1", loopback.port), 2).close()
    assert loopback.accepted == 1 or await _eventually(lambda: loopback.accepted == 1)
    r = await run1(runtime, container, "ip -o link")
    assert [line.split()[1] for line in r.stdout.splitlines()] == ["lo:"]
    r = await run1(runtime, container, "ip route; ip -6 route")
    assert r.stdout == ""  # no route anywhere but loopback
    probe = (
        "import socket, sys\n"
        "for host, port in [tuple(a.rsplit(':', 1)) for a in sys.argv[1:]]:\n"
        "    try:\n"
        "        socket.create_connection((host, int(port)), 2).close(); print('OPEN', host)\n"
        "    except OSError as e:\n"
        "        print('closed', host, e.errno)\n"
    )
    targets = [f"127.0.0.1:{loopback.port}", f"127.0.0.1:{anyaddr.port}"]
    targets += [f"{a}:{anyaddr.port}" for a in _host_addresses()]
    targets += ["1.1.1.1:443", "10.0.2.2:80"]
    r = await run1(runtime, container, f'python3 -c "{probe}" {" ".join(targets)}')
    assert "OPEN" not in r.stdout, r.stdout
    assert r.stdout.count("closed") == len(targets)
    r = await run1(runtime, container, "curl -sS -m 3 https://pypi.org/ -o /dev/null")
    assert r.outcome.exit_code != 0
    await asyncio.sleep(0.3)
    assert (loopback.accepted, anyaddr.accepted) == (1, 0)


async def _eventually(check: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_memory_limit_kills_the_command_with_a_note(
    runtime: OciRuntime, container: str
) -> None:
    alloc = "python3 -c 'b = bytearray({n} * 1024 * 1024); print(len(b) >> 20)'"
    r = await run1(runtime, container, alloc.format(n=500))
    assert (r.stdout, r.outcome.exit_code) == ("500\n", 0)
    r = await run1(runtime, container, "echo before >&2; " + alloc.format(n=2048))
    assert r.outcome.exit_code == 137
    lines = r.stderr.splitlines()
    assert lines[0] == "before"
    assert lines[-1] == OOM_NOTE.format(limit="1024 MiB")
    # The agent survived and the commands' memory cgroup sits 48 MiB under the container's.
    if runtime.cgroups.mode is CgroupMode.v2:
        limits = "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cmds/memory.max"
    else:
        limits = (
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
            " /sys/fs/cgroup/memory/cmds/memory.limit_in_bytes"
        )
    r = await run1(runtime, container, limits)
    container_limit, commands_limit = (int(x) for x in r.stdout.split())
    assert container_limit == 1 << 30
    assert container_limit - commands_limit == 48 << 20
    r = await run1(runtime, container, "echo alive")
    assert (r.stdout, r.stderr) == ("alive\n", "")


class _HostProbe:
    """Times ``true`` on the host every 50 ms while a test runs."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            self.latencies.append(time.perf_counter() - t)
            time.sleep(0.05)

    def __enter__(self) -> _HostProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Reached in well under a second here, and in seconds under emulation (1024 is not).
BOMB_PIDS_LIMIT = 256


def _pids_max_hits(runtime: OciRuntime, cid: str) -> int:
    events = runtime.cgroups.container_dir(cid, "pids") / "cmds" / "pids.events"
    return int(events.read_text().split()[1])


async def test_a_fork_bomb_hits_the_pids_limit_and_the_timeout_kills_it(
    runtime: OciRuntime,
) -> None:
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid, pids_limit=BOMB_PIDS_LIMIT))
    await runtime.start(cid)
    try:
        with _HostProbe() as probe:
            # A bomb whose shell keeps forking until the timeout kills all of it.
            bomb = "bomb() { bomb | bomb & }; while :; do bomb; done"
            [r] = await runtime.run(cid, ExecRequest([bomb], int(3000 * TIME_SCALE), 2000))
        assert r.outcome.type == "timeout"
        assert len(r.stderr) <= 2000
        assert _pids_max_hits(runtime, cid) > 0  # the commands' pids.max was hit
        assert max(probe.latencies) < 1.0 * TIME_SCALE, max(probe.latencies)
        r = await run1(runtime, cid, "echo alive; ps -e --no-headers | wc -l")
        assert r.stdout.startswith("alive\n")
        assert int(r.stdout.split()[1]) < 10, r  # nothing of the bomb is left
    finally:
        await runtime.destroy(cid)


async def test_a_detached_fork_bomb_is_contained_and_destroy_removes_it(
    runtime: OciRuntime,
) -> None:
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid, pids_limit=BOMB_PIDS_LIMIT))
    await runtime.start(cid)
    try:
        with _HostProbe() as probe:
            # The classic bomb detaches at once, and hits the commands' pids limit; holding
            # more than half of it once its command has returned, it is killed (README).
            bomb = await run1(runtime, cid, ":(){ :|:& };:", timeout_ms=int(5000 * TIME_SCALE))
            assert bomb.outcome.type == "exit"
            # The rule is about a bomb that holds more than half of the limit: wait until this
            # one does (a loaded or emulated machine grows it slowly), not a fixed time.
            procs = runtime.cgroups.container_dir(cid, "pids") / "cmds" / "pids.current"
            deadline = time.monotonic() + 30 * TIME_SCALE
            while (
                "killed the" not in bomb.stderr  # (killed already, as its command returned)
                and int(procs.read_text()) <= BOMB_PIDS_LIMIT // 2
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.05)
            # The agent kept its reserve of processes throughout, and the next call runs.
            r = await run1(runtime, cid, "echo alive", timeout_ms=int(5000 * TIME_SCALE))
            assert r.stdout == "alive\n"
            # The bomb grew past half of the limit (or to it) before it was killed.
            killed = re.search(r"killed the (\d+) processes", bomb.stderr + r.stderr)
            assert killed is not None, (bomb, r)
            assert int(killed.group(1)) > BOMB_PIDS_LIMIT // 2 or _pids_max_hits(runtime, cid) > 0
        assert max(probe.latencies) < 1.0 * TIME_SCALE, max(probe.latencies)
        assert int(procs.read_text()) < 20
    finally:
        await runtime.destroy(cid)
    assert not any(runtime.cgroups.container_dir(cid, c).exists() for c in ("memory", "pids"))


async def test_kernel_interfaces_are_refused(runtime: OciRuntime, container: str) -> None:
    checks = {
        "echo 3 > /proc/sys/vm/drop_caches": "Read-only file system",
        "echo evil > /proc/sys/kernel/hostname": "Read-only file system",
        "echo 1 > /proc/sysrq-trigger": "",
        "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m": "",
        "unshare -m true": "",
        "cat /proc/1/environ": "Permission denied",
        "ls /proc/1/fd": "Permission denied",
        # Refused by the kernel (EPERM) every time: the agent's main thread, which kill(1) is
        # checked against, never takes the sandbox user's uid (see the test below).
        "kill -9 1": "Operation not permitted",
    }
    for command, message in checks.items():
        r = await run1(runtime, container, command)
        assert r.outcome.exit_code != 0, command
        assert message in r.stderr, (command, r.stderr)
    ptrace = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        "r = libc.ptrace(16, 1, 0, 0); print(r, os.strerror(ctypes.get_errno()))"
    )
    r = await run1(runtime, container, f'python3 -c "{ptrace}"')
    assert r.stdout.startswith("-1 Operation not permitted"), r.stdout
    modules = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in (('init_module', 175, (0, 0, b'')), "
        "('finit_module', 313, (0, b'', 0)), ('delete_module', 176, (b'ext4', 0))):\n"
        "    r = libc.syscall(nr, *args); print(name, r, os.strerror(ctypes.get_errno()))\n"
    )
    r = await run1(runtime, container, f'python3 -c "{modules}"')
    assert r.stdout.splitlines() == [
        "init_module -1 Operation not permitted",
        "finit_module -1 Operation not permitted",
        "delete_module -1 Operation not permitted",
    ]
    r = await run1(runtime, container, "echo alive")
    assert r.stdout == "alive\n"


async def test_the_sandbox_user_can_never_signal_the_agent(
    runtime: OciRuntime, container: str
) -> None:
    """The agent starts a command by posix_spawn, which gives the child the real uid of the
    calling thread, so for a moment some thread of the agent holds uid 1000. If that were PID
    1's main thread, a command running meanwhile could signal PID 1 (the kernel allows it to
    any process whose real uid is the sender's): SIGINT raised KeyboardInterrupt in the agent.
    An attacker probes PID 1 in a loop while other calls start many commands at once."""
    # PID 1 handles SIGCHLD alone (the kernel drops the others for a namespace's init);
    # signals 32 and 33 are glibc's own, which check the sender is the process itself.
    r = await run1(runtime, container, "grep SigCgt /proc/1/status")
    assert int(r.stdout.split()[1], 16) & 0xFFFFFFFF == 1 << (signal.SIGCHLD - 1), r.stdout
    pid = await runtime.agent_pid(container)
    attack = (
        "n=0; tries=0; until [ -e /tmp/stop ]; do tries=$((tries+1)); "
        "kill -0 1 2>/dev/null && n=$((n+1)); kill -INT 1 2>/dev/null && n=$((n+1)); "
        "kill -CHLD 1 2>/dev/null && n=$((n+1)); done; echo $n $tries; kill -INT 1"
    )
    limit_ms = int(60_000 * TIME_SCALE)
    attacker = asyncio.create_task(runtime.run(container, ExecRequest([attack], limit_ms, 1000)))
    await asyncio.sleep(0.2)
    bursts = [ExecRequest(["true"] * 60, limit_ms, 100) for _ in range(5)]
    for _ in range(3):
        results = await asyncio.gather(*(runtime.run(container, b) for b in bursts))
        assert all(r.outcome.exit_code == 0 for rs in results for r in rs)
    await run1(runtime, container, "touch /tmp/stop")
    [r] = await attacker
    assert r.outcome.type == "exit", r  # it ran until told to stop
    hits, tries = map(int, r.stdout.split())
    assert hits == 0 and tries > 100, r.stdout
    assert "Operation not permitted" in r.stderr, r.stderr
    r = await run1(runtime, container, "echo alive")
    assert r.stdout == "alive\n"
    assert await runtime.agent_pid(container) == pid  # the same agent: it never died


async def test_the_agent_socket_is_unreachable_for_the_sandbox_user(
    runtime: OciRuntime, container: str
) -> None:
    r = await run1(runtime, container, "ls /run/shellbox")
    assert r.outcome.exit_code != 0 and "Permission denied" in r.stderr
    connect = (
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/shellbox/agent.sock')"
    )
    r = await run1(runtime, container, f'python3 -c "{connect}"')
    assert "PermissionError" in r.stderr
    # From the host it answers.
    assert runtime.socket_path(container).exists()


async def test_sys_shows_only_the_containers_own_network(
    runtime: OciRuntime, container: str
) -> None:
    """/sys is a sysfs of the container's network namespace, not a bind of the host's."""
    [r] = await runtime.run(container, ExecRequest(["ls /sys/class/net"], 5000, 1000))
    assert r.stdout.split() == ["lo"]


# x86_64 numbers of what Docker's default profile refuses a container without CAP_SYS_ADMIN.
REFUSED_SYSCALLS = {
    "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304, "syslog": 103,
    "reboot": 169, "pidfd_getfd": 438, "kexec_load": 246, "quotactl": 179,
}  # fmt: skip
CLONE_NEW = {  # every namespace flag, each refused to clone() and unshare()
    "NEWNS": 0x20000, "NEWCGROUP": 0x2000000, "NEWUTS": 0x4000000, "NEWIPC": 0x8000000,
    "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000,
}  # fmt: skip
CLONE_THREAD = 0x10000  # with a namespace flag: EINVAL once past the filter, never a fork


async def test_no_nested_user_namespaces_nor_other_kernel_surface(
    runtime: OciRuntime, container: str
) -> None:
    """A nested user namespace would hand uid 1000 a full capability set over new mount and
    network namespaces: creating one (and entering, mounting, the keyring, BPF, ...) is
    refused by seccomp, whichever way it is asked for, while threads and processes work."""
    for command in ("unshare -U true", "unshare -U -r id", "unshare -Urmn true", "unshare -C true"):
        r = await run1(runtime, container, command)
        assert r.outcome.exit_code != 0, (command, r.stdout)
        assert "Operation not permitted" in r.stderr, (command, r.stderr)
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(nr, *args):\n"
        "    r = libc.syscall(nr, *args); return os.strerror(ctypes.get_errno()) if r < 0 else r\n"
        f"for name, flag in {CLONE_NEW!r}.items():\n"
        f"    print('clone', name, call(56, flag | {CLONE_THREAD}, 0, 0, 0, 0))\n"
        "    print('unshare', name, call(272, flag))\n"
        "print('unshare NEWTIME', call(272, 0x80))\n"
        "print('clone3', call(435, 0, 0))\n"
        f"for name, nr in {REFUSED_SYSCALLS!r}.items():\n"
        "    print(name, call(nr, 0, 0, 0, 0, 0))\n"
    )
    r = await run1(runtime, container, f"python3 -c {shlex.quote(probe)}")
    answers: dict[str, str] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in ("clone", "unshare"):
            flag, _, value = value.partition(" ")
            key = f"{key} {flag}"
        answers[key] = value
    assert r.stderr == "", r.stderr
    refused = {f"{call} {flag}" for call in ("clone", "unshare") for flag in CLONE_NEW}
    refused |= {"unshare NEWTIME", *REFUSED_SYSCALLS}
    assert {k: answers.get(k) for k in refused} == dict.fromkeys(refused, "Operation not permitted")
    # clone3 passes its flags in memory, which a filter cannot read: it is "not there", and
    # glibc falls back to clone() for threads and posix_spawn.
    assert answers["clone3"] == "Function not implemented"
    works = (
        "python3 -c 'import threading, subprocess, multiprocessing as m\n"
        't = threading.Thread(target=print, args=("thread",)); t.start(); t.join()\n'
        'print(subprocess.run(["echo", "spawned"], capture_output=True, text=True).stdout,'
        ' end="")\n'
        "print(m.Pool(2).map(abs, [-1, -2]))' && "
        'node -e \'new (require("worker_threads").Worker)("console.log(42)", {eval: true})\' && '
        "unshare --fork true && git init -q /tmp/g && echo done"
    )
    r = await run1(runtime, container, works)
    assert r.stdout.split("\n") == ["thread", "spawned", "[1, 2]", "42", "done", ""], (
        r.stdout,
        r.stderr,
    )


MOUNT_FLAGS = ("ro", "nosuid", "nodev", "noexec")


async def test_every_mount_has_the_flags_its_config_asks_for(
    runtime: OciRuntime, tmp_path: Path
) -> None:
    """Each mount of the bundle (binds of every kind: the data directory, the socket
    directory, the agent, /etc/hosts, extra read-write and read-only mounts) carries inside
    the container every one of ``ro,nosuid,nodev,noexec`` its ``config.json`` asks for."""
    extra_rw, extra_ro = tmp_path / "rw", tmp_path / "ro"
    for d in (extra_rw, extra_ro):
        d.mkdir()
        d.chmod(0o755)
    tmp_path.chmod(0o755)
    extra_file = tmp_path / "bundle.pem"
    extra_file.write_text("not a certificate\n")
    cid = new_id("cntr_")
    spec = ContainerSpec(
        id=cid,
        hosts={"upstream.test": "10.0.0.1"},
        mounts=(
            Mount(extra_rw, "/opt/extra-rw", False),
            Mount(extra_ro, "/opt/extra-ro"),
            Mount(extra_file, "/etc/extra.pem"),
        ),
    )
    await runtime.create(spec)
    try:
        await runtime.start(cid)
        r = await run1(runtime, cid, "cat /proc/self/mountinfo")
        actual: dict[str, set[str]] = {}
        for line in r.stdout.splitlines():
            fields = line.split()
            actual[fields[4]] = set(fields[5].split(","))  # the mount's own flags
        config = json.loads((runtime.container_dir(cid) / "config.json").read_text())
        asked = {
            m["destination"]: {f for f in m.get("options", []) if f in MOUNT_FLAGS}
            for m in config["mounts"]
        }
        binds = {"/mnt/data", "/etc/hosts", "/opt/extra-rw", "/opt/extra-ro", "/etc/extra.pem"}
        assert binds <= set(asked)
        missing = {d: sorted(want - actual[d]) for d, want in asked.items() if want - actual[d]}
        assert missing == {}
        for destination in (*binds, "/proc", "/tmp"):
            assert {"nosuid", "nodev"} <= actual[destination], destination
    finally:
        await runtime.destroy(cid)


def _as_host_uid(uid: int, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run on the host as ``uid``/gid ``uid``, no other groups: what a process
    that escaped a container's namespaces with that uid could do."""
    return subprocess.run(
        ["sh", "-c", command], user=uid, group=uid, extra_groups=[], capture_output=True,
        text=True, cwd="/",
    )  # fmt: skip


async def test_each_container_is_its_own_host_uid_range(
    runtime: OciRuntime, container: str
) -> None:
    """A kernel escape from one container is a host uid that owns that container's files and
    nothing of another's: every container maps to a host uid range of its own, outside the
    host's users and subordinate ranges, and its files are owned by that range."""
    other = new_id("cntr_")
    await runtime.create(ContainerSpec(id=other))
    await runtime.start(other)
    try:
        bases = {}
        for cid in (container, other):
            r = await run1(runtime, cid, "cat /proc/self/uid_map /proc/self/gid_map")
            maps = [line.split() for line in r.stdout.splitlines()]
            assert maps[0] == maps[1] and maps[0][0] == "0" and maps[0][2] == "65536", maps
            bases[cid] = int(maps[0][1])
            assert bases[cid] == runtime.uid_base(cid)
            r = await run1(runtime, cid, "echo mine > /mnt/data/own.txt; touch ~/home.txt; id -u")
            assert r.stdout == "1000\n"
            data = runtime.data_dir(cid)
            assert data.stat().st_uid == bases[cid] + 1000
            assert (data / "own.txt").stat().st_uid == bases[cid] + 1000
            upper = runtime.disk_dir(cid) / "upper" / "home" / "user" / "home.txt"
            assert upper.stat().st_uid == bases[cid] + 1000
        a, b = bases[container], bases[other]
        assert abs(a - b) >= 65536
        for base in (a, b):  # neither the image's range nor any host id
            assert not 100_000 - 65536 < base < 100_000 + 65536
        host_ids = {
            int(line.split(":")[2])
            for name in ("passwd", "group")
            for line in (Path("/etc") / name).read_text().splitlines()
            if line.count(":") >= 2
        }
        assert not any(a <= i < a + 65536 or b <= i < b + 65536 for i in host_ids)
        # "Escaped" host processes of the first container, as its root and its user.
        other_dir, other_disk = runtime.container_dir(other), runtime.disk_dir(other)
        for uid in (a, a + 1000):
            for command in (
                f"ls {other_dir}",
                f"ls {other_disk}",
                f"cat {runtime.data_dir(other)}/own.txt",
                f"echo evil >> {runtime.data_dir(other)}/own.txt",
                f"touch {other_disk}/upper/evil",
            ):
                done = _as_host_uid(uid, command)
                assert done.returncode != 0, (uid, command)
                assert "Permission denied" in done.stderr, (uid, command, done.stderr)
        assert (runtime.data_dir(other) / "own.txt").read_text() == "mine\n"
        # The image is shared: readable, never writable, by any container's uids.
        done = _as_host_uid(a, f"cat {runtime.image_rootfs}/etc/hostname; touch "
                            f"{runtime.image_rootfs}/etc/evil")  # fmt: skip
        assert done.returncode != 0 and "Permission denied" in done.stderr
    finally:
        await runtime.destroy(other)
