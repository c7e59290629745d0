"""The shellbox agent: PID 1 of every sandbox container.

Standard library only; the container's python3 runs it from a read-only mount (see
``sandbox/oci.py``)::

    python3 -I -S -c "import sys; sys.path.insert(0, '/opt/shellbox/agent'); import server; ..."

so that its byte code comes precompiled from ``__pycache__`` (the host compiles it once).

The host binds and listens on the agent's Unix socket itself and hands the listening socket to
the container as the agent's stdin (socket activation): a client can connect the moment
``crun run`` returns, and its request waits in the backlog until the agent is up, so nobody
polls. The socket lives in a directory only the container's root can open; the sandbox user
cannot reach it.

Everything happens in one thread (not the main one: see *Starting a command*) around one
``epoll`` loop: connections, command pipes, the SIGCHLD wake-up and timers. As PID 1 the
agent also reaps every orphan; command exit statuses are picked out of the same
``waitpid(-1)`` loop, so nothing else may call ``waitpid``. The agent keeps a handler for
SIGCHLD only (Python's own SIGINT handler is reset): as a namespace's init it then ignores
every other signal sent from inside the container.

**Start-up time** is most of a container's creation time, so imports are kept to C modules
(``posix``, ``_socket``, ``select``, ``_signal``, ``_json``): importing ``os``, ``socket``,
``signal``, ``selectors`` and ``json`` instead costs ~10 ms on this kind of machine.

**Commands** run in their own freezer cgroup (``cmd-N``; on cgroup v2 a leaf with
``cgroup.kill``), and all of them share one pids and one memory cgroup (``cmds``) whose limits
sit below the container's, so a fork bomb or the OOM killer hits a command, never the agent.
On timeout the command's cgroup is frozen, every process in it is SIGKILLed and the cgroup is
thawed, so ``setsid`` and double-forked escapers die too.

**Starting a command** means putting a process into those cgroups as the sandbox user, two
ways:

* in a burst of calls, ``posix_spawn`` (vfork+exec, the cheapest start there is): the agent
  steps into the command's cgroups, its loop thread takes uid 1000 as its *real* uid (its
  effective uid and capabilities stay root's), spawns with ``POSIX_SPAWN_RESETIDS`` so the
  child's every uid is 1000, and steps back. ``posix_spawn`` gives the child the real uid of
  the thread that calls it, so some thread of the agent must hold uid 1000 for that moment;
  it must never be PID 1's own (main) thread: the kernel lets a process signal, renice or
  re-pin any process whose real uid is its own, so uid 1000 could then signal PID 1 (a
  command running on the other core, or the spawned child itself). Hence the agent's loop
  runs in a second thread whose ids alone change (a raw ``setresuid`` system call: glibc's
  ``setresuid`` changes every thread's), and the main thread, which ``kill(1, ...)`` is
  checked against, stays root and only waits;
* after a quiet spell, from the *spare*: a fork of the agent that has already joined the next
  command's cgroups and waits on a pipe; the command costs a pipe write and an ``execve``.
  A cgroup move costs an RCU grace period (~10 ms, seen here) when no move happened in the
  last few tens of milliseconds; the spare pays it in advance, off the call's path. Moves a
  few milliseconds apart are nearly free, hence the spawn in bursts, where forking a spare
  per command would cost ~0.8 ms (copy-on-write faults in the agent).
"""

# ruff: noqa: SIM105 - contextlib.suppress would cost the agent's start-up an import

from __future__ import annotations

import _socket
import errno
import gc
import marshal
import posix
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # ``typing`` alone would cost the agent ~20 ms at start-up here
    import signal as _signal
    from collections.abc import Callable
    from typing import Any, ClassVar

    from shellbox.agent import protocol as P
else:
    import _signal

    _HERE = __file__.rpartition("/")[0] or "."
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import protocol as P

CGROUP_ROOT = "/sys/fs/cgroup"
AGENT_MEMORY_RESERVE = 48 * 1024 * 1024  # the commands' memory limit sits this far below ours
AGENT_PIDS_RESERVE = 16  # processes kept free for the agent and its spare
READ_CHUNK = 65536
MAX_FD = 65536
# A cgroup move within this long of the previous one is cheap (no RCU grace period to wait
# for): commands then start by posix_spawn directly; after a quiet spell, from the spare.
LEFTOVER_KILL_WAIT_S = 1.0  # at most, for killed leftovers to exit and be reaped
BURST_WINDOW_S = 0.02
# Empty command cgroups kept for the next commands (see ``Cgroups.release``): a spare's, a
# running command's and a burst's few fit.
CGROUP_POOL_SIZE = 4

try:
    import _json

    class _DecoderContext:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        memo: ClassVar[dict[str, Any]] = {}

        @staticmethod
        def parse_constant(name: str) -> float:
            return float(name.replace("Infinity", "inf"))  # NaN, Infinity, -Infinity

    _scan = _json.make_scanner(_DecoderContext())  # type: ignore[arg-type]

    def _default(obj: object) -> object:
        msg = f"not JSON serializable: {type(obj).__name__}"
        raise TypeError(msg)

    _encode = _json.make_encoder(
        None, _default, _json.encode_basestring, None, ":", ",", False, False, True
    )

    def json_loads(data: bytes) -> Any:
        text = data.decode("utf-8").strip()
        try:
            obj, end = _scan(text, 0)
        except StopIteration:
            msg = "invalid JSON"
            raise ValueError(msg) from None
        if end != len(text):
            msg = "extra data after the JSON value"
            raise ValueError(msg)
        return obj

    def json_dumps(obj: object) -> bytes:
        return "".join(_encode(obj, 0)).encode("utf-8", "replace")

except ImportError:  # pragma: no cover - a Python without the C accelerator
    import json as _pyjson

    def json_loads(data: bytes) -> Any:
        return _pyjson.loads(data)

    def json_dumps(obj: object) -> bytes:
        return _pyjson.dumps(obj, ensure_ascii=False).encode("utf-8", "replace")


def log(msg: str) -> None:
    try:
        posix.write(2, f"shellbox-agent: {msg}\n".encode(errors="replace"))
    except OSError:
        pass


def write_file(path: str, value: str) -> None:
    fd = posix.open(path, posix.O_WRONLY | posix.O_CLOEXEC)
    try:
        posix.write(fd, value.encode())
    finally:
        posix.close(fd)


def read_file(path: str) -> str:
    fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            data = posix.read(fd, 65536)
            if not data:
                return b"".join(chunks).decode()
            chunks.append(data)
    finally:
        posix.close(fd)


def _exists(path: str) -> bool:
    return posix.access(path, posix.F_OK)


def _mkdir(path: str) -> None:
    try:
        posix.mkdir(path, 0o755)
    except FileExistsError:
        pass


def _kill_quietly(pid: int, sig: int = _signal.SIGKILL) -> None:
    try:
        posix.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# setresuid and setresgid by architecture: the raw system calls change the calling thread's
# ids alone (see ``ThreadIds``).
SETRES_SYSCALLS = {"x86_64": (117, 119), "aarch64": (147, 149)}
# setfsuid and setfsgid: the ids a new terminal's device is owned by (``Pty``).
SETFS_SYSCALLS = {"x86_64": (122, 123), "aarch64": (151, 152)}


class ThreadIds:
    """Sets the real uid and gid of the calling thread alone, by raw system call.

    glibc's ``setresuid`` (``posix.setresuid``) applies to every thread of the process, PID 1's
    main thread included; the system call applies to the caller only. ``_ctypes`` is the only
    way to it from the standard library (~0.4 ms to import, as the loop starts; ``ctypes`` would
    cost ~3 ms). On a machine it does not know ``available()`` is None: commands then always
    start from a fork (``Spare``), which sets its ids in its own process.
    """

    def __init__(self, setresuid: int, setresgid: int) -> None:
        import _ctypes

        ct: Any = _ctypes

        class CLong(ct._SimpleCData):  # type: ignore[misc]  # ctypes.c_long
            _type_ = "l"

        class Func(ct.CFuncPtr):  # type: ignore[misc]
            _flags_ = ct.FUNCFLAG_CDECL | ct.FUNCFLAG_USE_ERRNO
            _restype_ = CLong

        class Libc:  # what ctypes.CDLL(None) is to CFuncPtr: the process's own symbols
            _handle = ct.dlopen(None, 0)

        self._syscall = Func(("syscall", Libc()))
        self._syscall.argtypes = (CLong, CLong, CLong, CLong)
        self._get_errno = ct.get_errno
        self._nr_uid = setresuid
        self._nr_gid = setresgid
        self._nr_fs = SETFS_SYSCALLS.get(posix.uname().machine)

    @staticmethod
    def available() -> ThreadIds | None:
        nrs = SETRES_SYSCALLS.get(posix.uname().machine)
        if nrs is None:
            return None
        try:
            return ThreadIds(*nrs)
        except (ImportError, OSError, AttributeError) as exc:
            log(f"no raw system calls ({exc}): commands start from a fork")
            return None

    def _call(self, nr: int, real: int) -> None:
        if self._syscall(nr, real, -1, -1) != 0:
            code = self._get_errno()
            raise OSError(code, f"setres[ug]id: {posix.strerror(code)}")

    def set_real(self, uid: int, gid: int) -> None:
        """Make ``uid``/``gid`` this thread's real ids; effective and saved ones stay."""
        self._call(self._nr_gid, gid)
        self._call(self._nr_uid, uid)

    def set_fs(self, uid: int, gid: int) -> bool:
        """Make ``uid``/``gid`` this thread's filesystem ids (what new files are owned by).
        The system calls answer the previous ids, never an error: ask again to check."""
        if self._nr_fs is None:
            return False
        nr_uid, nr_gid = self._nr_fs
        self._syscall(nr_gid, gid, 0, 0)
        self._syscall(nr_uid, uid, 0, 0)
        return bool(self._syscall(nr_uid, -1, 0, 0) == uid)


class Cgroups:
    """Per-command cgroups inside the container's own (delegated, namespaced) cgroup tree.

    cgroup v1: ``freezer/cmd-N`` per command; ``pids/cmds`` and ``memory/cmds`` shared by all
    commands. cgroup v2: the agent in ``agent/``, commands in ``cmds/cmd-N`` with ``cmds``
    holding the shared pids and memory limits.

    A command's cgroup is its own while anything of it lives, then goes back to a small pool
    for a later command (``release``) instead of being removed: ``mkdir`` and ``rmdir`` of a
    cgroup take the kernel's one global ``cgroup_mutex`` (and, on v1, the freezer's global
    mutex), which every container's cgroup work on the host contends for, so a neighbour's
    churn would otherwise stall this container's every call. A cgroup is reused only when
    empty and thawed; every counter a command's outcome is read from (the OOM kills, the pids
    limit) belongs to the shared ``cmds``, which no command's cgroup changes.
    """

    def __init__(self) -> None:
        self.v2 = _exists(CGROUP_ROOT + "/cgroup.controllers")
        self.available = True
        self.memory_limit = 0
        self.pids_limit = 0
        self.cmds_pids_limit = 0  # what all commands together may hold; 0: no limit
        self._counter = 0
        self._free: list[str] = []  # empty, thawed command cgroups, for the next commands
        self._suspect: set[str] = set()  # a kill failed midway: maybe frozen, never reused
        try:
            self._setup()
        except OSError as exc:  # no delegated cgroups: fall back to process-group kills
            log(f"cgroups unavailable, timeouts fall back to killpg: {exc}")
            self.available = False

    def _setup(self) -> None:
        root = CGROUP_ROOT
        if self.v2:
            # v2 forbids processes in inner nodes: move the agent into a leaf of its own.
            _mkdir(root + "/agent")
            write_file(root + "/agent/cgroup.procs", str(posix.getpid()))
            write_file(root + "/cgroup.subtree_control", "+pids +memory")
            # cmds holds the commands' pids and memory; its cmd-N leaves need no controller
            # (cgroup.kill and cgroup.freeze are core). With pids enabled in them, a fork
            # refused at cmds' limit would be counted in the leaf's pids.events, not cmds'
            # (Linux before 6.13), and the leaf is gone once the command is killed.
            _mkdir(root + "/cmds")
            mem, pids = root + "/memory.max", root + "/pids.max"
            cmds_mem, cmds_pids = root + "/cmds/memory.max", root + "/cmds/pids.max"
        else:
            for ctl in ("freezer", "pids", "memory"):
                if not _exists(f"{root}/{ctl}/cgroup.procs"):
                    raise OSError(errno.ENOENT, f"no {ctl} controller mounted")
            _mkdir(root + "/memory/cmds")
            _mkdir(root + "/pids/cmds")
            mem, pids = root + "/memory/memory.limit_in_bytes", root + "/pids/pids.max"
            cmds_mem = root + "/memory/cmds/memory.limit_in_bytes"
            cmds_pids = root + "/pids/cmds/pids.max"
        raw = read_file(mem).strip()
        if raw != "max" and int(raw) < (1 << 60):
            self.memory_limit = int(raw)
            write_file(cmds_mem, str(max(self.memory_limit - AGENT_MEMORY_RESERVE, 16 << 20)))
        raw = read_file(pids).strip()
        if raw != "max":
            self.pids_limit = int(raw)
            self.cmds_pids_limit = max(self.pids_limit - AGENT_PIDS_RESERVE, 8)
            write_file(cmds_pids, str(self.cmds_pids_limit))

    def new_group(self) -> str:
        """The cgroup for one command, from the pool or made now; returns its name."""
        if self._free:
            # First in, first out: every pooled cgroup takes its turn. Last in, first out let
            # two cgroups alternate forever over one released under them (a killed command's,
            # once its leftovers were swept), which then never served again.
            return self._free.pop(0)
        self._counter += 1
        name = f"cmd-{self._counter}"
        if self.available:
            _mkdir(self._group_dir(name))
        return name

    def _group_dir(self, name: str) -> str:
        if self.v2:
            return f"{CGROUP_ROOT}/cmds/{name}"
        return f"{CGROUP_ROOT}/freezer/{name}"

    def task_files(self, name: str) -> list[str]:
        """Files a spare writes its own pid to, before it becomes a command."""
        if not self.available:
            return []
        if self.v2:
            return [f"{CGROUP_ROOT}/cmds/{name}/cgroup.procs"]
        return [
            f"{CGROUP_ROOT}/freezer/{name}/cgroup.procs",
            f"{CGROUP_ROOT}/pids/cmds/cgroup.procs",
            f"{CGROUP_ROOT}/memory/cmds/cgroup.procs",
        ]

    def home_files(self) -> list[str]:
        """Files the agent writes its pid to, to go back to its own cgroups."""
        if not self.available:
            return []
        if self.v2:
            return [CGROUP_ROOT + "/agent/cgroup.procs"]
        return [f"{CGROUP_ROOT}/{ctl}/cgroup.procs" for ctl in ("freezer", "pids", "memory")]

    def pids_used(self) -> int:
        """Processes (tasks) all commands, running or finished, hold now."""
        if not self.available:
            return 0
        path = "/cmds/pids.current" if self.v2 else "/pids/cmds/pids.current"
        try:
            return int(read_file(CGROUP_ROOT + path))
        except (OSError, ValueError):
            return 0

    def count(self, name: str) -> int:
        """Processes in one command's cgroup."""
        try:
            return len(read_file(self._group_dir(name) + "/cgroup.procs").split())
        except OSError:
            return 0

    def oom_kills(self) -> int:
        if not self.available:
            return 0
        try:
            if self.v2:
                text = read_file(CGROUP_ROOT + "/cmds/memory.events")
            else:
                text = read_file(CGROUP_ROOT + "/memory/cmds/memory.oom_control")
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill(self, name: str, fallback_pgid: int) -> None:
        """Kill every process of one command, escapers included."""
        if not self.available:
            _kill_quietly(-fallback_pgid)
            return
        try:
            self._kill(name)
        except OSError:
            self._suspect.add(name)
            raise

    def _kill(self, name: str) -> None:
        if self.v2:
            group = f"{CGROUP_ROOT}/cmds/{name}"
            if _exists(group + "/cgroup.kill"):  # Linux 5.14+: the kernel kills the tree
                write_file(group + "/cgroup.kill", "1")
                return
            _freeze_and_kill(group, "cgroup.freeze", ("1", "0"), _v2_frozen)
            return
        _freeze_and_kill(
            f"{CGROUP_ROOT}/freezer/{name}", "freezer.state", ("FROZEN", "THAWED"), _v1_frozen
        )

    def release(self, name: str) -> bool:
        """Give a command's cgroup back once nothing lives in it: to the pool, or removed when
        the pool is full or a kill failed in it; False while something still lives there.

        Nothing can enter an empty command cgroup but the agent (its ``cgroup.procs`` is
        root's), and an empty one gains no process by fork: empty now is empty at reuse. A
        cgroup is frozen only inside ``kill``, which thaws it before it returns; one whose
        kill failed midway is never reused.
        """
        if not self.available:
            return True
        try:
            if read_file(self._group_dir(name) + "/cgroup.procs").strip():
                return False
        except FileNotFoundError:
            self._suspect.discard(name)
            return True
        except OSError:
            return False
        if name not in self._suspect and len(self._free) < CGROUP_POOL_SIZE:
            self._free.append(name)
            return True
        try:
            posix.rmdir(self._group_dir(name))
        except FileNotFoundError:
            pass
        except OSError:
            return False
        self._suspect.discard(name)
        return True


def _v1_frozen(group: str) -> bool:
    return read_file(group + "/freezer.state").strip() == "FROZEN"


def _v2_frozen(group: str) -> bool:
    return "frozen 1" in read_file(group + "/cgroup.events")


def _freeze_and_kill(
    group: str, control: str, values: tuple[str, str], frozen: Callable[[str], bool]
) -> None:
    """Kill every process in ``group``. A frozen process cannot fork, and ignores SIGKILL
    until thawed: freeze, kill, thaw, until the group is empty. The thaw happens whatever
    fails in between: a group left frozen would hold its processes past every later kill
    (the host's removal of the container thaws too, for an agent killed in between)."""
    freeze, thaw = values
    for _ in range(5):
        write_file(f"{group}/{control}", freeze)
        try:
            deadline = time.monotonic() + 1.0
            while not frozen(group) and time.monotonic() < deadline:
                time.sleep(0.0005)
            pids = [int(p) for p in read_file(group + "/cgroup.procs").split()]
            for pid in pids:
                _kill_quietly(pid)
        finally:
            write_file(f"{group}/{control}", thaw)
        if not pids:
            return
        deadline = time.monotonic() + 0.2
        while read_file(group + "/cgroup.procs").strip() and time.monotonic() < deadline:
            time.sleep(0.001)


class Spare:
    """A fork of the agent that has joined one command's cgroups and waits for its command.

    The fork and the cgroup moves (which can cost an RCU grace period) happen before the
    command arrives; ``launch`` then only writes the command down a pipe, and the spare drops
    to the sandbox user and ``execve``s the shell.
    """

    def __init__(self, agent: Agent) -> None:
        cg = agent.cgroups
        self.group = cg.new_group()
        task_files = cg.task_files(self.group)
        fds: list[int] = []
        try:
            for _ in range(3):
                fds.extend(posix.pipe())
            ctl_r, ctl_w, out_r, out_w, err_r, err_w = fds
            pid = posix.fork()
        except OSError:
            for fd in fds:
                posix.close(fd)
            cg.release(self.group)  # nothing joined it: back to the pool
            raise
        if pid == 0:  # pragma: no cover - the child never returns
            _spare_main(ctl_r, out_w, err_w, task_files)
        for fd in (ctl_r, out_w, err_w):
            posix.close(fd)
        self.pid = pid
        self.ctl = ctl_w
        self.out = out_r
        self.err = err_r
        self.dead = False

    def launch(self, spec: tuple[Any, ...]) -> None:
        """Hand over the command (blocks only while a 1 MiB command fills the pipe)."""
        data = marshal.dumps(spec)
        view = memoryview(data)
        try:
            while view:
                n = posix.write(self.ctl, view)
                view = view[n:]
        finally:
            posix.close(self.ctl)
            self.ctl = -1

    def discard(self) -> None:
        """Close everything; the spare sees EOF and exits (and is reaped like any child)."""
        for fd in (self.ctl, self.out, self.err):
            if fd >= 0:
                posix.close(fd)
        self.ctl = self.out = self.err = -1


def _close_except(keep: list[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd > low:
            posix.closerange(low, fd)
        low = max(low, fd + 1)
    posix.closerange(low, MAX_FD)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = posix.read(fd, 1 << 20)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _spare_main(ctl: int, out_w: int, err_w: int, task_files: list[str]) -> None:
    """The spare's whole life: join the cgroups, wait for a command, exec it. Never returns."""
    try:
        gc.disable()
        _signal.set_wakeup_fd(-1)
        for sig in (_signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT):
            _signal.signal(sig, _signal.SIG_DFL)
        _close_except([ctl, out_w, err_w])
        me = str(posix.getpid())
        for path in task_files:
            try:
                write_file(path, me)
            except OSError as exc:
                log(f"could not join {path}: {exc}")
        data = _read_all(ctl)
        if not data:  # discarded
            posix._exit(0)
        argv, env, cwd, uid, gid, script = marshal.loads(data)
        posix.close(ctl)
        posix.setsid()
        posix.setgroups([])
        posix.setresgid(gid, gid, gid)
        posix.setresuid(uid, uid, uid)
        try:
            posix.chdir(cwd)
        except OSError:
            posix.chdir("/")
        null = posix.open("/dev/null", posix.O_RDONLY)
        posix.dup2(null, 0)
        posix.dup2(out_w, 1)
        posix.dup2(err_w, 2)
        keep = [0, 1, 2]
        if script is not None:
            mfd = posix.memfd_create("shellbox-command", 0)
            view = memoryview(script)
            while view:
                view = view[posix.write(mfd, view) :]
            posix.lseek(mfd, 0, 0)
            if mfd != 3:
                posix.dup2(mfd, 3)
            keep.append(3)
        _close_except(keep)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        posix.execve(argv[0], argv, env)
    except BaseException as exc:
        try:
            posix.write(2, f"shellbox: could not start the command: {exc}\n".encode())
        finally:
            posix._exit(127)


class Stream:
    __slots__ = ("capture", "fd", "name", "open")

    def __init__(self, fd: int, name: str, cap: int) -> None:
        self.fd = fd
        self.name = name
        self.capture = P.Capture(cap)
        self.open = True


class Command:
    """One running command: its process, pipes, capture and deadline."""

    def __init__(
        self, agent: Agent, job: Job, index: int, pid: int, group: str, out: int, err: int
    ) -> None:
        self.agent = agent
        self.job = job
        self.index = index
        self.pid = pid
        self.group = group
        self.status: int | None = None
        self.timed_out = False
        self.exited_at = 0.0
        self.finished = False
        self.oom_before = agent.cgroups.oom_kills()
        self.notes: list[str] = []  # lines for the end of stderr (leftovers killed)
        self.deadline = time.monotonic() + job.timeout_s
        cap = job.max_output_length
        self.streams = [Stream(out, "stdout", cap), Stream(err, "stderr", cap)]
        for s in self.streams:
            posix.set_blocking(s.fd, False)
            agent.watch(s.fd, self._reader(s))

    def _reader(self, stream: Stream) -> Any:
        return lambda _events: self.on_readable(stream)

    def on_readable(self, stream: Stream) -> None:
        for _ in range(16):  # don't let one noisy command starve the loop
            try:
                data = posix.read(stream.fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close_stream(stream)
                return
            fresh = stream.capture.feed(data)
            if fresh and self.job.stream:
                self.job.send(
                    {
                        "type": "delta",
                        "command_index": self.index,
                        "stream": stream.name,
                        "text": fresh,
                    }
                )

    def close_stream(self, stream: Stream, drain: bool = False) -> None:
        if not stream.open:
            return
        stream.open = False
        self.agent.unwatch(stream.fd)
        fresh = stream.capture.feed(b"", final=True)
        if fresh and self.job.stream:
            self.job.send(
                {"type": "delta", "command_index": self.index, "stream": stream.name, "text": fresh}
            )
        if drain:
            # Background processes still hold the pipe: keep reading into the void so they
            # never see EPIPE (a service that logs to stderr must keep working).
            self.agent.drain_forever(stream.fd)
        else:
            posix.close(stream.fd)

    def on_exit(self, status: int) -> None:
        self.status = status
        self.exited_at = time.monotonic()

    def tick(self, now: float) -> None:
        """Advance: enforce the deadline, then finish once exited and drained (or grace over)."""
        if self.status is None:
            if now >= self.deadline and not self.timed_out:
                self.timed_out = True
                self.kill()
            return
        open_streams = [s for s in self.streams if s.open]
        if open_streams and now - self.exited_at < P.PIPE_GRACE_S:
            return
        for s in open_streams:
            if self.timed_out:  # everything is dead: take what is left in the pipe
                self.on_readable(s)
            self.close_stream(s, drain=not self.timed_out)
        self.finish()

    def kill(self) -> None:
        try:
            self.agent.cgroups.kill(self.group, self.pid)
        except OSError as exc:
            log(f"cgroup kill of {self.group} failed ({exc}); killing the process group")
            _kill_quietly(-self.pid)

    def next_wakeup(self) -> float:
        if self.status is None:
            return self.deadline
        if any(s.open for s in self.streams):
            return self.exited_at + P.PIPE_GRACE_S
        return 0.0

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        stdout = self.streams[0].capture.result()
        stderr = self.streams[1].capture.result()
        agent = self.agent
        agent.commands.pop(self.pid, None)
        agent.retire_group(self.group)
        notes = self.notes + agent.limit_leftovers(self.group)
        outcome: dict[str, Any]
        if self.timed_out:
            outcome = {"type": "timeout"}
        else:
            code = posix.waitstatus_to_exitcode(self.status or 0)
            outcome = {"type": "exit", "exit_code": 128 - code if code < 0 else code}
            cg = agent.cgroups
            if cg.oom_kills() > self.oom_before:
                limit = f"{cg.memory_limit >> 20} MiB" if cg.memory_limit else "limit"
                notes.append(P.OOM_NOTE.format(limit=limit))
        if notes:
            note = "\n".join(n.rstrip("\n") for n in notes)
            cap = self.job.max_output_length
            # The notes are the last lines, whatever the cap leaves of the rest.
            room = max(cap - len(note) - 1, 0)
            head = P.truncate_text(stderr, room) if room else ""
            sep = "\n" if head and not head.endswith("\n") else ""
            stderr = (head + sep + note)[-cap:] if cap else ""
        self.job.command_finished(
            {
                "type": "result",
                "command_index": self.index,
                "stdout": stdout,
                "stderr": stderr,
                "outcome": outcome,
            }
        )


class Job:
    """One exec request: its commands run one after the other on one connection. Command
    ``i`` is read off the connection only when it is about to start (see ``protocol``)."""

    def __init__(self, agent: Agent, conn: Connection, req: dict[str, Any]) -> None:
        self.agent = agent
        self.conn = conn
        self.sizes: list[int] = req["command_bytes"]
        timeout_ms = req.get("timeout_ms")
        if not isinstance(timeout_ms, int) or timeout_ms <= 0:
            timeout_ms = P.DEFAULT_TIMEOUT_MS
        self.timeout_s = timeout_ms / 1000.0
        cap = req.get("max_output_length")
        self.max_output_length = (
            cap if isinstance(cap, int) and cap >= 0 else P.DEFAULT_MAX_OUTPUT_LENGTH
        )
        self.stream = bool(req.get("stream", True))
        self.uid = int(req.get("uid", P.SANDBOX_UID))
        self.gid = int(req.get("gid", P.SANDBOX_GID))
        self.cwd = str(req.get("cwd") or P.WORKDIR)
        env = req.get("env") or {}
        self.env = {str(k): str(v) for k, v in env.items()}
        self.current: Command | None = None
        self.next_index = 0
        self.waiting = False  # for the next command's bytes, or for the host to read output
        self.over = False

    def send(self, msg: dict[str, Any]) -> None:
        self.conn.send(msg)

    def end(self) -> None:
        """No more commands of this call will start (done, or abandoned)."""
        if not self.over:
            self.over = True
            self.agent.jobs.discard(self)

    def start_next(self) -> None:
        self.waiting = False
        conn = self.conn
        if self.next_index >= len(self.sizes) or conn.closed:
            self.current = None
            self.end()
            conn.job = None
            self.send({"type": "done"})
            conn.close_when_flushed()
            return
        if len(conn.outbuf) > P.OUTBUF_PAUSE_BYTES:  # the host reads slowly: wait for it
            self.waiting = True
            return
        raw = conn.take(self.sizes[self.next_index])
        if raw is None:  # not all here yet: on_readable calls again once it is
            self.waiting = True
            return
        index = self.next_index
        self.next_index += 1
        if self.stream:
            self.send({"type": "started", "command_index": index})
        # Bytes all the way to bash: a long command (or one with a NUL, which argv cannot
        # carry) goes through a memfd, the others as ``-c``; never decoded here.
        argv: list[str | bytes]
        script: bytes | None
        if len(raw) > P.ARGV_COMMAND_LIMIT or b"\0" in raw:
            argv, script = [self.agent.shell, "/dev/fd/3"], raw
        else:
            argv, script = [self.agent.shell, "-c", raw], None
        del raw
        spec = (argv, self.env, self.cwd, self.uid, self.gid, script)
        agent = self.agent
        notes = agent.limit_leftovers()
        spare: Spare | None = None
        try:
            if agent.use_spare():
                spare = agent.take_spare()
                pid, group, out, err = spare.pid, spare.group, spare.out, spare.err
                spare.out = spare.err = -1  # the command's now
            else:
                pid, group, out, err = agent.spawn(spec)
            cmd = Command(agent, self, index, pid, group, out, err)
            cmd.notes.extend(notes)
        except OSError as exc:
            self.command_finished(
                {
                    "type": "result",
                    "command_index": index,
                    "stdout": "",
                    "stderr": "".join(notes) + f"shellbox: could not start the command: {exc}\n",
                    "outcome": {"type": "exit", "exit_code": 126},
                }
            )
            return
        self.current = cmd
        agent.commands[cmd.pid] = cmd
        if spare is not None:
            try:
                spare.launch(spec)
            except OSError as exc:  # the spare died before it got its command (OOM, say)
                log(f"spare {spare.pid} did not take its command: {exc}")
                cmd.kill()

    def command_finished(self, result: dict[str, Any]) -> None:
        self.current = None
        self.send(result)
        self.start_next()

    def abandon(self) -> None:
        """The client went away: kill what runs now and run nothing more."""
        self.next_index = len(self.sizes)
        self.end()
        cmd = self.current
        if cmd is not None and cmd.status is None and not cmd.timed_out:
            cmd.timed_out = True
            cmd.kill()


class Outbox:
    """Bytes queued for the host on one connection (a command's or a terminal's), written
    without blocking once per loop iteration (``Agent.dirty``), and what follows a write: the
    host gone, a closing connection drained, or room left to follow with epoll."""

    fd: int
    outbuf: bytearray
    closed: bool
    closing: bool  # close once everything queued is written

    def flush(self) -> None:
        while self.outbuf and not self.closed:
            try:
                n = posix.write(self.fd, self.outbuf)
            except BlockingIOError:
                break
            except OSError:
                self.host_lost()
                return
            del self.outbuf[:n]
        if self.closed:
            return
        if not self.outbuf and self.closing:
            self.drained()
            return
        self.flushed()

    def host_lost(self) -> None:
        """A write failed: the host is gone."""
        raise NotImplementedError

    def drained(self) -> None:
        """Everything queued is written and the connection is closing: close it."""
        raise NotImplementedError

    def flushed(self) -> None:
        """Written what could be; the rest waits for room (the epoll interest follows)."""
        raise NotImplementedError


class Connection(Outbox):
    """One host connection. Its epoll interest follows what it waits for: the header, the
    bytes of the command about to start, room to write; while a command runs it reads
    nothing (the host's further commands wait in the socket) and only a hang-up wakes it."""

    def __init__(self, agent: Agent, fd: int) -> None:
        self.agent = agent
        self.fd = fd
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.job: Job | None = None
        self.closed = False
        self.closing = False
        self.mask = select.EPOLLIN | select.EPOLLRDHUP

    def set_interest(self) -> None:
        job = self.job
        reading = not self.closing and (job is None or (job.waiting and self.missing() > 0))
        mask = select.EPOLLRDHUP
        if reading:
            mask |= select.EPOLLIN
        if self.outbuf:
            mask |= select.EPOLLOUT
        if mask != self.mask and not self.closed:
            self.mask = mask
            self.agent.ep.modify(self.fd, mask)

    def on_event(self, events: int) -> None:
        if events & select.EPOLLOUT:
            self.flush()
        if self.closed:
            return
        if events & select.EPOLLIN and self.mask & select.EPOLLIN:
            self.on_readable()
        elif events & (select.EPOLLHUP | select.EPOLLRDHUP | select.EPOLLERR):
            self.close()  # the host never half-closes: it went away

    def on_readable(self) -> None:
        job = self.job
        size = 65536
        if job is not None:  # read no further than the command about to start
            size = self.missing() if job.waiting else 0
            if size <= 0:
                self.set_interest()
                return
        try:
            data = posix.read(self.fd, min(size, 1 << 20))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        if self.closing:
            return  # one request per connection; ignore anything after it
        self.inbuf += data
        if job is not None:
            job.start_next()
            self.set_interest()
            return
        nl = self.inbuf.find(b"\n")
        if nl < 0:
            if len(self.inbuf) > P.MAX_HEADER_BYTES:
                self.fail("request_too_large", "the request is larger than the agent accepts")
            return
        line = bytes(self.inbuf[:nl])
        del self.inbuf[: nl + 1]
        try:
            req = json_loads(line)
            if not isinstance(req, dict):
                msg = "a request is a JSON object"
                raise ValueError(msg)
            self.handle(req)
        except Exception as exc:  # PID 1 must survive any malformed request
            self.fail("invalid_request", f"{type(exc).__name__}: {exc}")
        self.set_interest()

    def missing(self) -> int:
        """Bytes of the next command of the job that have not arrived yet."""
        job = self.job
        if job is None or job.next_index >= len(job.sizes):
            return 0
        return job.sizes[job.next_index] - len(self.inbuf)

    def take(self, n: int) -> bytes | None:
        """The next ``n`` bytes of the request, once they have all arrived."""
        if len(self.inbuf) < n:
            return None
        with memoryview(self.inbuf) as view:
            raw = bytes(view[:n])
        del self.inbuf[:n]
        return raw

    def handle(self, req: dict[str, Any]) -> None:
        op = req.get("op")
        if op == "ping":
            self.send({"type": "pong", "version": P.PROTOCOL_VERSION, "pid": posix.getpid()})
            self.close_when_flushed()
            return
        if op == "pty":
            self.open_pty(req)
            return
        if op != "exec":
            self.fail("invalid_request", f"unknown op {op!r}")
            return
        sizes = req.get("command_bytes")
        if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
            self.fail("invalid_request", "command_bytes must be a list of sizes in bytes")
            return
        for i, n in enumerate(sizes):
            if n > P.MAX_COMMAND_BYTES:
                self.fail("invalid_request", f"command {i} is longer than 1 MiB")
                return
        if not 1 <= len(sizes) <= P.MAX_COMMANDS:
            self.fail(
                "invalid_request",
                f"{len(sizes)} commands in one call; give 1 to {P.MAX_COMMANDS}",
            )
            return
        if len(self.agent.jobs) >= P.MAX_CONCURRENT_CALLS:
            self.fail(
                "busy",
                f"this container already runs {len(self.agent.jobs)} calls at once, the most "
                "it takes; send this call again once one of them has finished",
            )
            return
        self.job = Job(self.agent, self, req)
        self.agent.jobs.add(self.job)
        self.job.start_next()

    def open_pty(self, req: dict[str, Any]) -> None:
        """Start a terminal and hand this connection over to it."""
        agent = self.agent
        if len(agent.ptys) >= P.MAX_PTYS:
            self.fail("busy", f"this container already has {len(agent.ptys)} terminals open")
            return
        try:
            pty = Pty(agent, self.fd, req)
        except ValueError as exc:
            self.fail("invalid_request", str(exc))
            return
        except OSError as exc:  # out of pids, memory or terminals
            self.fail("pty_failed", f"could not start the terminal: {exc}")
            return
        self.closed = True  # the fd is the terminal's now: this object lets go of it
        agent.handlers[self.fd] = pty.on_conn_event
        pty.take_over(bytes(self.inbuf))
        self.inbuf = bytearray()

    def fail(self, code: str, message: str) -> None:
        self.send({"type": "error", "code": code, "message": message})
        self.close_when_flushed()

    def send(self, msg: dict[str, Any]) -> None:
        """Queue a message; the loop writes each connection's queue once per iteration."""
        if self.closed:
            return
        self.outbuf += json_dumps(msg) + b"\n"
        self.agent.dirty.add(self)

    def host_lost(self) -> None:
        self.close()

    def drained(self) -> None:
        self.close()

    def flushed(self) -> None:
        job = self.job
        if job is not None and job.waiting and len(self.outbuf) <= P.OUTBUF_PAUSE_BYTES:
            job.start_next()  # it waited for the host to read (or for bytes: a no-op then)
        self.set_interest()

    def close_when_flushed(self) -> None:
        self.closing = True
        self.agent.dirty.add(self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.agent.unwatch(self.fd)
        posix.close(self.fd)
        self.inbuf = bytearray()
        if self.job is not None:
            self.job.abandon()


def _side(req: dict[str, Any], key: str) -> int:
    value = req.get(key)
    if type(value) is not int or not 1 <= value <= P.MAX_PTY_SIDE:
        msg = f"{key} must be an integer from 1 to {P.MAX_PTY_SIDE}"
        raise ValueError(msg)
    return value


def _winsize(cols: int, rows: int) -> bytes:
    """A ``struct winsize``: rows, columns, and two unused pixel sizes, native shorts."""
    order = sys.byteorder
    return b"".join(n.to_bytes(2, order) for n in (rows, cols, 0, 0))


class Pty(Outbox):
    """One terminal: the sandbox user's shell on a pseudo-terminal, in a command cgroup of its
    own (the commands' pids and memory limits hold it; a container's end kills it), framed
    over the host connection it came on (see ``protocol``).

    Back-pressure both ways: the terminal is read only while the frames for the host stay
    under ``PTY_OUTBUF_BYTES``, the host only while the keystrokes for the terminal stay under
    ``PTY_INBUF_BYTES``. An fd whose reading is paused leaves epoll altogether: a hung-up
    terminal reports EPOLLHUP whatever the interest, which would spin the loop."""

    def __init__(self, agent: Agent, fd: int, req: dict[str, Any]) -> None:
        import fcntl
        import termios

        self._ioctl = fcntl.ioctl
        self._set_size = termios.TIOCSWINSZ
        cols, rows = _side(req, "cols"), _side(req, "rows")
        command = req.get("command")
        if command is not None and (not isinstance(command, str) or "\0" in command):
            msg = "command must be a string without NUL bytes"
            raise ValueError(msg)
        env = req.get("env") or {}
        if not isinstance(env, dict):
            msg = "env must be an object"
            raise ValueError(msg)
        env = {str(k): str(v) for k, v in env.items()}
        cwd = str(req.get("cwd") or P.WORKDIR)
        uid, gid = P.SANDBOX_UID, P.SANDBOX_GID
        self.agent = agent
        self.fd = fd
        self.inbuf = bytearray()  # frames from the host, not parsed yet
        self.outbuf = bytearray()  # frames for the host
        self.pending = bytearray()  # keystrokes for the terminal
        self.status: int | None = None
        self.exited_at = 0.0
        self.host_gone = False
        self.finished = False
        self.closing = False
        self.closed = False
        self.conn_mask = -1  # what epoll watches the connection for (-1: not registered)
        self.master_mask = -1
        argv = [agent.shell] if command is None else [agent.shell, "-c", command]
        master, slave = self._open_terminal(uid, gid)
        try:
            self._ioctl(master, self._set_size, _winsize(cols, rows))
            cg = agent.cgroups
            group = cg.new_group()
            try:
                pid = posix.fork()
            except OSError:
                cg.release(group)
                raise
            if pid == 0:  # pragma: no cover - the child never returns
                _pty_main(slave, termios.TIOCSCTTY, cg.task_files(group), argv, env, cwd, uid, gid)
        except BaseException:
            posix.close(master)
            posix.close(slave)
            raise
        posix.close(slave)
        posix.set_blocking(master, False)
        agent.last_move = time.monotonic()
        self.master = master
        self.pid = pid
        self.group = group
        agent.commands[pid] = self
        agent.ptys.add(self)

    def _open_terminal(self, uid: int, gid: int) -> tuple[int, int]:
        """A pseudo-terminal whose device the sandbox user owns (so that programs that open
        their terminal by name, ``tty``'s answer, can): opened with the loop thread's
        filesystem ids set to that user's, where the machine lets the agent set them."""
        ids = self.agent.thread_ids
        switched = ids is not None and ids.set_fs(uid, gid)
        try:
            return posix.openpty()
        finally:
            if switched and ids is not None:
                ids.set_fs(0, 0)

    def take_over(self, early: bytes) -> None:
        """Answer the request, then serve the frames (some may have come with it)."""
        self.outbuf += json_dumps({"type": "started", "pid": self.pid}) + b"\n"
        self.inbuf += early
        self.parse()
        self.update()

    # -- the host connection ----------------------------------------------------------------

    def on_conn_event(self, events: int) -> None:
        if events & select.EPOLLOUT:
            self.flush()
        if self.closed:
            return
        if events & select.EPOLLIN and self.conn_mask & select.EPOLLIN:
            try:
                data = posix.read(self.fd, P.PTY_INBUF_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.abandon()
                return
            self.inbuf += data
            self.parse()
            self.update()
        elif events & (select.EPOLLHUP | select.EPOLLRDHUP | select.EPOLLERR):
            self.abandon()  # the host never half-closes: it went away

    def parse(self) -> None:
        buf = self.inbuf
        while len(buf) >= P.PTY_FRAME_HEADER and not self.host_gone:
            kind = bytes(buf[:1])
            size = int.from_bytes(buf[1:5], "big")
            if size > P.MAX_PTY_FRAME:
                log(f"terminal {self.pid}: a frame of {size} bytes from the host")
                self.abandon()
                return
            if len(buf) < P.PTY_FRAME_HEADER + size:
                return
            payload = bytes(buf[P.PTY_FRAME_HEADER : P.PTY_FRAME_HEADER + size])
            del buf[: P.PTY_FRAME_HEADER + size]
            if kind == P.PTY_DATA:
                if not self.finished:
                    self.pending += payload
            elif kind == P.PTY_RESIZE and size == 4:
                cols = int.from_bytes(payload[:2], "big")
                rows = int.from_bytes(payload[2:], "big")
                if self.master >= 0 and cols and rows:
                    try:  # the kernel sends the foreground process group SIGWINCH
                        self._ioctl(self.master, self._set_size, _winsize(cols, rows))
                    except OSError as exc:
                        log(f"terminal {self.pid}: resize failed: {exc}")
            else:
                log(f"terminal {self.pid}: unknown frame {kind!r} from the host")
                self.abandon()
                return
        self.write_pending()

    def host_lost(self) -> None:
        self.abandon()

    def drained(self) -> None:
        self.close_conn()

    def flushed(self) -> None:
        self.update()

    # -- the terminal -----------------------------------------------------------------------

    def on_master_event(self, events: int) -> None:
        if events & select.EPOLLOUT:
            self.write_pending()
        if self.master >= 0 and events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
            self.read_master()
        self.update()

    def read_master(self) -> None:
        """Read what the terminal holds into one frame (a terminal hands out a few KiB per
        read: one message per read would make a WebSocket message of each)."""
        room = P.PTY_OUTBUF_BYTES - len(self.outbuf)
        data = bytearray()
        eof = False
        for _ in range(16):  # don't let one noisy terminal starve the loop
            if self.master < 0 or len(data) >= min(room, P.MAX_PTY_FRAME):
                break
            try:
                chunk = posix.read(self.master, min(READ_CHUNK, P.MAX_PTY_FRAME - len(data)))
            except BlockingIOError:
                break
            except OSError:  # EIO: nothing holds the terminal any more
                chunk = b""
            if not chunk:
                eof = True
                break
            data += chunk
        if data:
            self.outbuf += P.pty_frame(P.PTY_DATA, bytes(data))
            self.agent.dirty.add(self)
        if eof:
            self.close_master()

    def write_pending(self) -> None:
        while self.pending and self.master >= 0:
            try:
                n = posix.write(self.master, self.pending)
            except BlockingIOError:
                return
            except OSError:  # the terminal is gone: nobody reads these keystrokes
                self.pending.clear()
                return
            del self.pending[:n]

    def close_master(self) -> None:
        if self.master >= 0:
            self._watch_master(0)
            posix.close(self.master)  # the kernel hangs up the terminal's session
            self.master = -1

    # -- epoll interest ---------------------------------------------------------------------

    def update(self) -> None:
        """Watch each fd for what it may do now (see the class's note on paused reads)."""
        if self.master >= 0:
            mask = 0
            if len(self.outbuf) < P.PTY_OUTBUF_BYTES:
                mask |= select.EPOLLIN
            if self.pending:
                mask |= select.EPOLLOUT
            self._watch_master(mask)
        if not self.closed:
            mask = select.EPOLLRDHUP
            if not self.closing and len(self.pending) < P.PTY_INBUF_BYTES:
                mask |= select.EPOLLIN
            if self.outbuf:
                mask |= select.EPOLLOUT
            if mask != self.conn_mask:
                self.conn_mask = mask
                self.agent.ep.modify(self.fd, mask)

    def _watch_master(self, mask: int) -> None:
        if mask == self.master_mask:
            return
        agent = self.agent
        if mask == 0:
            agent.unwatch(self.master)
        elif self.master_mask <= 0:
            agent.watch(self.master, self.on_master_event, mask)
        else:
            agent.ep.modify(self.master, mask)
        self.master_mask = mask

    # -- the end ----------------------------------------------------------------------------

    def on_exit(self, status: int) -> None:
        self.status = status
        self.exited_at = time.monotonic()

    def next_wakeup(self) -> float:
        if self.status is None:
            return time.monotonic() + 5.0
        if self.master < 0 or self.host_gone:
            return 0.0
        return self.exited_at + P.PTY_EXIT_GRACE_S

    def tick(self, now: float) -> None:
        """Once the shell has exited: end when the terminal has been read to its end, or when
        what the shell left running still holds it after a grace (not counted while the host
        holds the output back)."""
        if self.status is None or self.finished:
            return
        if not self.host_gone and self.master >= 0:
            paused = len(self.outbuf) >= P.PTY_OUTBUF_BYTES
            if paused or now - self.exited_at < P.PTY_EXIT_GRACE_S:
                return
            self.read_master()
        self.finish()

    def finish(self) -> None:
        self.finished = True
        agent = self.agent
        agent.commands.pop(self.pid, None)
        agent.ptys.discard(self)
        self.close_master()
        agent.retire_group(self.group)
        agent.limit_leftovers(self.group)
        if self.host_gone:
            return
        code = posix.waitstatus_to_exitcode(self.status or 0)
        code = 128 - code if code < 0 else code
        self.outbuf += P.pty_frame(P.PTY_EXIT, code.to_bytes(4, "big", signed=True))
        self.closing = True
        agent.dirty.add(self)

    def abandon(self) -> None:
        """The host went away (or broke the protocol): kill everything the terminal started."""
        if self.host_gone:
            return
        self.host_gone = True
        self.pending.clear()
        self.close_conn()
        if not self.finished:
            try:
                self.agent.cgroups.kill(self.group, self.pid)
            except OSError as exc:
                log(f"cgroup kill of {self.group} failed ({exc}); killing the process group")
                _kill_quietly(-self.pid)
            self.close_master()

    def close_conn(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.agent.unwatch(self.fd)
        posix.close(self.fd)
        self.outbuf = bytearray()
        self.inbuf = bytearray()


def _pty_main(
    slave: int,
    set_ctty: int,
    task_files: list[str],
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    uid: int,
    gid: int,
) -> None:
    """A terminal's shell: join the command cgroups, lead a session whose controlling
    terminal is ``slave`` (job control, Ctrl-C), drop to the sandbox user, exec. Never
    returns."""
    try:
        gc.disable()
        _signal.set_wakeup_fd(-1)
        for sig in (_signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT):
            _signal.signal(sig, _signal.SIG_DFL)
        me = str(posix.getpid())
        for path in task_files:
            write_file(path, me)
        posix.setsid()
        import fcntl

        fcntl.ioctl(slave, set_ctty, 0)
        posix.setgroups([])
        posix.setresgid(gid, gid, gid)
        posix.setresuid(uid, uid, uid)
        try:
            posix.chdir(cwd)
        except OSError:
            posix.chdir("/")
        for fd in (0, 1, 2):
            posix.dup2(slave, fd)
        _close_except([0, 1, 2])
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        posix.execve(argv[0], argv, env)
    except BaseException as exc:
        try:
            posix.write(slave, f"shellbox: could not start the terminal: {exc}\r\n".encode())
        finally:
            posix._exit(127)


def _noop_handler(_signum: int, _frame: object) -> None:
    pass


class Agent:
    def __init__(self, listener: _socket.socket) -> None:
        self.ep = select.epoll()
        self.handlers: dict[int, Any] = {}
        self.cgroups = Cgroups()
        self.shell = "/bin/bash" if posix.access("/bin/bash", posix.X_OK) else "/bin/sh"
        self.commands: dict[int, Command | Pty] = {}  # pid -> running command or terminal
        self.ptys: set[Pty] = set()  # open terminals (at most P.MAX_PTYS)
        self.spare: Spare | None = None
        self.spares: dict[int, Spare] = {}  # pid -> spare not yet handed a command
        self.dirty: set[Outbox] = set()  # connections with output queued
        self.jobs: set[Job] = set()  # calls under way (at most P.MAX_CONCURRENT_CALLS)
        self.last_move = time.monotonic()  # of a cgroup move: crun's, at our start
        posix.setgroups([])  # commands inherit them through posix_spawn
        self.retired: list[str] = []  # cgroups of finished commands whose background jobs live
        rfd, wfd = posix.pipe()
        posix.set_blocking(rfd, False)
        posix.set_blocking(wfd, False)
        _signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGCHLD, _noop_handler)
        # As a namespace's init, a signal whose handler is SIG_DFL is dropped by the kernel,
        # whoever sends it: keep no handler but SIGCHLD's (Python installs one for SIGINT).
        for sig in range(1, _signal.NSIG):
            if sig != _signal.SIGCHLD and callable(_signal.getsignal(sig)):
                _signal.signal(sig, _signal.SIG_DFL)
        self.thread_ids: ThreadIds | None = None  # made by the loop thread (``run``)
        self.wake_fd = rfd
        self.listener = listener
        listener.setblocking(False)
        self.watch(listener.fileno(), self.on_accept)
        self.watch(rfd, self.on_wake)

    def watch(self, fd: int, handler: Any, mask: int = select.EPOLLIN) -> None:
        self.handlers[fd] = handler
        self.ep.register(fd, mask)

    def unwatch(self, fd: int) -> None:
        if self.handlers.pop(fd, None) is not None:
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass

    def drain_forever(self, fd: int) -> None:
        def on_drain(_events: int) -> None:
            try:
                data = posix.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.unwatch(fd)
                posix.close(fd)

        self.watch(fd, on_drain)

    def use_spare(self) -> bool:
        """Whether the next command should start from the spare: after a quiet spell, when a
        cgroup move of our own could wait for an RCU grace period (~10 ms here)."""
        spare = self.spare
        if self.thread_ids is None:  # no safe way to spawn: always fork
            return True
        return (
            spare is not None
            and not spare.dead
            and time.monotonic() - self.last_move > BURST_WINDOW_S
        )

    def spawn(self, spec: tuple[Any, ...]) -> tuple[int, str, int, int]:
        """Start a command by ``posix_spawn`` (vfork+exec): the agent steps into the command's
        cgroups and takes the sandbox user as its *real* uid for the moment of the spawn
        (``POSIX_SPAWN_RESETIDS`` then makes it the child's only uid), and steps back.
        Returns (pid, cgroup, stdout, stderr)."""
        argv, env, cwd, uid, gid, script = spec
        cg = self.cgroups
        group = cg.new_group()
        out_r, out_w = posix.pipe()
        err_r, err_w = posix.pipe()
        null = posix.open("/dev/null", posix.O_RDONLY | posix.O_CLOEXEC)
        mfd = -1
        actions = [
            (posix.POSIX_SPAWN_DUP2, null, 0),
            (posix.POSIX_SPAWN_DUP2, out_w, 1),
            (posix.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        me = str(posix.getpid())
        moved = False
        pid = -1
        try:
            moved = True
            for path in cg.task_files(group):
                write_file(path, me)
            if script is not None:  # written from the commands' cgroups: charged to them
                mfd = posix.memfd_create("shellbox-command", posix.MFD_CLOEXEC)
                view = memoryview(script)
                while view:
                    view = view[posix.write(mfd, view) :]
                posix.lseek(mfd, 0, 0)
                actions.append((posix.POSIX_SPAWN_DUP2, mfd, 3))
            ids = self.thread_ids
            assert ids is not None  # use_spare() is always true without them
            try:
                ids.set_real(uid, gid)  # this thread's: never PID 1's main thread (see the top)
                # access() checks with the real ids: can the sandbox user work there?
                if not posix.access(cwd, posix.X_OK):
                    cwd = "/"
                try:
                    posix.chdir(cwd)
                except OSError:
                    posix.chdir("/")
                pid = posix.posix_spawn(
                    argv[0], argv, env, file_actions=actions, setsid=True, resetids=True,
                    setsigmask=(), setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),
                )  # fmt: skip
            finally:
                ids.set_real(0, 0)
        except BaseException:
            posix.close(out_r)
            posix.close(err_r)
            raise
        finally:
            if moved:
                for path in cg.home_files():
                    try:
                        write_file(path, me)
                    except OSError as exc:
                        log(f"could not move back to {path}: {exc}")
                self.last_move = time.monotonic()
            if pid < 0:  # the spawn failed: nothing is in the command's cgroup
                cg.release(group)
            posix.chdir("/")
            for fd in (null, out_w, err_w, mfd):
                if fd >= 0:
                    posix.close(fd)
        return pid, group, out_r, err_r

    def take_spare(self) -> Spare:
        spare = self.spare
        self.spare = None
        self.last_move = time.monotonic()  # the spare's moves were recent: a burst may follow
        if spare is None or spare.dead:
            if spare is not None:
                spare.discard()
            spare = Spare(self)
        self.spares.pop(spare.pid, None)
        return spare

    def make_spare(self) -> None:
        try:
            spare = Spare(self)
        except OSError as exc:  # out of pids or memory: try again later
            log(f"could not fork a spare: {exc}")
            return
        self.spare = spare
        self.spares[spare.pid] = spare

    def limit_leftovers(self, finished: str = "") -> list[str]:
        """Enforce the rule for what finished commands leave running (README, contract):
        together their processes may hold at most half of the commands' process limit. Past
        that, the groups of leftovers holding the most are killed, largest first, until they
        hold no more than half: a fork bomb that returned dies, a service of a few processes
        stays, and the next command can start. Checked when a command finishes (``finished``
        names it), before one starts, and every few seconds. Returns a line per group killed.
        """
        cg = self.cgroups
        bound = cg.cmds_pids_limit // 2
        if not self.retired or not bound or cg.pids_used() <= bound:
            return []
        counts = sorted(((cg.count(g), g) for g in self.retired), reverse=True)
        left = sum(n for n, _ in counts)
        notes: list[str] = []
        for n, group in counts:
            if left <= bound:
                break
            try:
                cg.kill(group, 0)
            except OSError as exc:
                log(f"could not kill the leftovers in {group}: {exc}")
                continue
            left -= n
            whose = "this command" if group == finished else "an earlier command"
            notes.append(
                f"shellbox: killed the {n} processes {whose} left running: processes left "
                f"by finished commands may hold at most half of the container's process "
                f"limit ({bound} of {cg.cmds_pids_limit}).\n"
            )
            log(notes[-1].rstrip())
        if notes:
            self.await_leftovers_gone(bound)
        self.retired = [g for g in self.retired if not cg.release(g)]
        return notes

    def await_leftovers_gone(self, bound: int) -> None:
        """A killed process holds its pid until it has exited and been reaped (orphans are
        ours, as the namespace's init): wait, briefly, for the kill to free the room it made,
        so that the command that starts next is not refused a fork by the very processes the
        rule killed."""
        deadline = time.monotonic() + LEFTOVER_KILL_WAIT_S
        while True:
            self.reap()
            if self.cgroups.pids_used() <= bound or time.monotonic() > deadline:
                return
            time.sleep(0.005)

    def retire_group(self, name: str) -> None:
        if not self.cgroups.release(name):
            self.retired.append(name)

    def on_accept(self, _events: int) -> None:
        while True:
            try:
                fd, _addr = self.listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log(f"accept failed: {exc}")
                return
            posix.set_blocking(fd, False)
            conn = Connection(self, fd)
            self.watch(fd, conn.on_event, conn.mask)

    def on_wake(self, _events: int) -> None:
        try:
            while posix.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def reap(self) -> None:
        while True:
            try:
                pid, status = posix.waitpid(-1, posix.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            cmd = self.commands.get(pid)
            if cmd is not None:
                cmd.on_exit(status)
                continue
            spare = self.spares.pop(pid, None)
            if spare is not None:  # a spare died before it was used
                spare.dead = True
                spare.discard()
                if self.spare is spare:
                    self.spare = None
                self.retire_group(spare.group)

    def run(self) -> None:
        self.thread_ids = ThreadIds.available()
        last_sweep = time.monotonic()
        gc.freeze()  # what exists now is shared with every spare: don't let GC dirty it
        while True:
            now = time.monotonic()
            timeout = 5.0
            for cmd in self.commands.values():
                timeout = min(timeout, max(0.0, cmd.next_wakeup() - now))
            if self.spare is None:
                timeout = min(timeout, max(0.0, self.last_move + BURST_WINDOW_S - now) + 0.001)
            for fd, events in self.ep.poll(timeout):
                handler = self.handlers.get(fd)
                if handler is None:
                    continue
                try:
                    handler(events)
                except Exception as exc:  # one bad event must not take PID 1 down
                    log(f"error handling fd {fd}: {type(exc).__name__}: {exc}")
            self.reap()
            now = time.monotonic()
            for cmd in list(self.commands.values()):
                try:
                    cmd.tick(now)
                except Exception as exc:
                    log(f"error finishing command: {type(exc).__name__}: {exc}")
                    self.commands.pop(cmd.pid, None)
            while self.dirty:
                self.dirty.pop().flush()
            # The next spare is forked as soon as no command runs (its answer has gone out,
            # above), or once moves have paused: its first move waits for an RCU grace
            # period (10-30 ms when the machine is quiet), and forked any later, a call that
            # follows the last one by about that long found it still waiting, and waited with
            # it. A burst starts its commands by spawn and leaves the spare alone.
            if self.spare is None and (not self.commands or now - self.last_move > BURST_WINDOW_S):
                self.make_spare()
            if now - last_sweep > 5 and self.retired:
                last_sweep = now
                self.retired = [g for g in self.retired if not self.cgroups.release(g)]
                self.limit_leftovers()


def listening_socket() -> _socket.socket:
    """The socket the host bound for us (fd 3), or one we bind ourselves (development)."""
    raw = posix.environ.get(P.LISTEN_FD_ENV.encode())
    if raw:
        fd = int(raw)
        if fd < 3:  # it came as a standard stream: move it off, put /dev/null in its place
            moved = posix.dup(fd)  # not inheritable
            null = posix.open("/dev/null", posix.O_RDWR)
            posix.dup2(null, fd)
            posix.close(null)
            fd = moved
        else:
            posix.set_inheritable(fd, False)
        return _socket.socket(fileno=fd)
    socket_dir = posix.environ.get(b"SHELLBOX_SOCKET_DIR", P.SOCKET_DIR.encode()).decode()
    path = f"{socket_dir}/{P.SOCKET_NAME}"
    try:
        posix.unlink(path)
    except FileNotFoundError:
        pass
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.bind(path)
    posix.chmod(path, 0o600)
    sock.listen(128)
    return sock


def _run_loop(agent: Agent) -> None:
    try:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])  # signals come to this thread
        agent.run()
    except BaseException as exc:
        log(f"the loop failed: {type(exc).__name__}: {exc}")
    posix._exit(1)


def main() -> None:
    """Run the agent's loop in a second thread. The main thread, whose credentials are the
    ones ``kill(1, ...)`` and ``/proc/1`` are checked against, never changes them: it blocks
    every signal (so they all go to the loop thread, whose C-level SIGCHLD handler writes the
    wake-up pipe; the Python-level one, a no-op, never needs to run) and waits forever."""
    import _thread

    posix.umask(0o022)
    agent = Agent(listening_socket())
    _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    _thread.start_new_thread(_run_loop, (agent,))
    forever = _thread.allocate_lock()
    forever.acquire()
    forever.acquire()


if __name__ == "__main__":
    main()
