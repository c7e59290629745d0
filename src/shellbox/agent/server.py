"""The shellbox agent: PID 1 of every sandbox container.

Standard library only; the container's python3 runs this file from a read-only mount:
``python3 -I -S /opt/shellbox/agent/server.py``.

It listens on a Unix socket in a directory only the container's root can open, runs each
requested command as the sandbox user, and streams the output back (see ``protocol``).
Everything happens in one thread around one ``selectors`` loop: connections, command pipes,
the SIGCHLD wake-up and timers. As PID 1 it also reaps every orphan; command exit statuses are
picked out of the same ``waitpid(-1)`` loop, so nothing else may call ``waitpid``.

Each command gets its own freezer + pids cgroup (``cmd-N``): on timeout the agent freezes it,
SIGKILLs every process in it and thaws it, so ``setsid`` and double-forked escapers die too.
On cgroup v2 the same is done with ``cgroup.kill``. All commands share one memory cgroup whose
limit sits below the container's, so the kernel's OOM killer picks a command, not the agent.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol as P  # noqa: E402

CGROUP_ROOT = "/sys/fs/cgroup"
AGENT_MEMORY_RESERVE = 48 * 1024 * 1024
COMMAND_PIDS_MAX = 1024
READ_CHUNK = 65536
LOG = sys.stderr


def log(msg: str) -> None:
    try:
        LOG.write(f"shellbox-agent: {msg}\n")
        LOG.flush()
    except OSError:
        pass


def write_file(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_file(path: str) -> str:
    with open(path) as f:
        return f.read()


class Cgroups:
    """Per-command cgroups inside the container's own (delegated, namespaced) cgroup tree."""

    def __init__(self) -> None:
        self.v2 = os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers"))
        self.available = True
        self.memory_limit = 0
        self._counter = 0
        try:
            self._setup()
        except OSError as exc:  # no delegated cgroups: fall back to process-group kills
            log(f"cgroups unavailable, timeouts fall back to killpg: {exc}")
            self.available = False

    def _setup(self) -> None:
        if self.v2:
            # v2 forbids processes in inner nodes: move the agent into a leaf of its own.
            agent = os.path.join(CGROUP_ROOT, "agent")
            os.makedirs(agent, exist_ok=True)
            write_file(os.path.join(agent, "cgroup.procs"), str(os.getpid()))
            write_file(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "+pids +memory")
            cmds = os.path.join(CGROUP_ROOT, "cmds")
            os.makedirs(cmds, exist_ok=True)
            write_file(os.path.join(cmds, "cgroup.subtree_control"), "+pids")
            raw = read_file(os.path.join(CGROUP_ROOT, "memory.max")).strip()
            if raw != "max":
                self.memory_limit = int(raw)
                write_file(
                    os.path.join(cmds, "memory.max"),
                    str(max(self.memory_limit - AGENT_MEMORY_RESERVE, 16 << 20)),
                )
            return
        for ctl in ("freezer", "pids", "memory"):
            if not os.path.isdir(os.path.join(CGROUP_ROOT, ctl)):
                raise OSError(errno.ENOENT, f"no {ctl} controller mounted")
        mem = os.path.join(CGROUP_ROOT, "memory", "cmds")
        os.makedirs(mem, exist_ok=True)
        limit = int(read_file(os.path.join(CGROUP_ROOT, "memory", "memory.limit_in_bytes")))
        if limit < (1 << 60):
            self.memory_limit = limit
            write_file(
                os.path.join(mem, "memory.limit_in_bytes"),
                str(max(limit - AGENT_MEMORY_RESERVE, 16 << 20)),
            )

    def new_command_group(self) -> str:
        """Create the cgroup for one command; returns its name."""
        self._counter += 1
        name = f"cmd-{self._counter}"
        if not self.available:
            return name
        if self.v2:
            path = os.path.join(CGROUP_ROOT, "cmds", name)
            os.makedirs(path, exist_ok=True)
            write_file(os.path.join(path, "pids.max"), str(COMMAND_PIDS_MAX))
        else:
            for ctl in ("freezer", "pids"):
                os.makedirs(os.path.join(CGROUP_ROOT, ctl, name), exist_ok=True)
            write_file(os.path.join(CGROUP_ROOT, "pids", name, "pids.max"), str(COMMAND_PIDS_MAX))
        return name

    def task_files(self, name: str) -> list[str]:
        """Files the child writes its own pid to, before it drops privileges."""
        if not self.available:
            return []
        if self.v2:
            return [os.path.join(CGROUP_ROOT, "cmds", name, "cgroup.procs")]
        return [
            os.path.join(CGROUP_ROOT, "freezer", name, "cgroup.procs"),
            os.path.join(CGROUP_ROOT, "pids", name, "cgroup.procs"),
            os.path.join(CGROUP_ROOT, "memory", "cmds", "cgroup.procs"),
        ]

    def oom_kills(self) -> int:
        if not self.available:
            return 0
        try:
            if self.v2:
                text = read_file(os.path.join(CGROUP_ROOT, "cmds", "memory.events"))
            else:
                text = read_file(os.path.join(CGROUP_ROOT, "memory", "cmds", "memory.oom_control"))
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
        if self.v2:
            write_file(os.path.join(CGROUP_ROOT, "cmds", name, "cgroup.kill"), "1")
            return
        freezer = os.path.join(CGROUP_ROOT, "freezer", name)
        state = os.path.join(freezer, "freezer.state")
        # A frozen process ignores SIGKILL until thawed: freeze (no new forks), kill, thaw.
        write_file(state, "FROZEN")
        deadline = time.monotonic() + 1.0
        while read_file(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.0005)
        for _ in range(3):
            pids = [int(p) for p in read_file(os.path.join(freezer, "cgroup.procs")).split()]
            if not pids:
                break
            for pid in pids:
                _kill_quietly(pid)
            write_file(state, "THAWED")
            write_file(state, "FROZEN")
        write_file(state, "THAWED")

    def is_empty(self, name: str) -> bool:
        if not self.available:
            return True
        path = (
            os.path.join(CGROUP_ROOT, "cmds", name, "cgroup.procs")
            if self.v2
            else os.path.join(CGROUP_ROOT, "freezer", name, "cgroup.procs")
        )
        try:
            return not read_file(path).strip()
        except OSError:
            return True

    def remove(self, name: str) -> bool:
        """Remove a command's cgroup once nothing lives in it; False if still in use."""
        if not self.available:
            return True
        dirs = (
            [os.path.join(CGROUP_ROOT, "cmds", name)]
            if self.v2
            else [os.path.join(CGROUP_ROOT, c, name) for c in ("freezer", "pids")]
        )
        try:
            for d in dirs:
                os.rmdir(d)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Stream:
    def __init__(self, fd: int, name: str, cap: int) -> None:
        self.fd = fd
        self.name = name
        self.capture = P.Capture(cap)
        self.open = True


class Command:
    """One running command: its process, pipes, capture and deadline."""

    def __init__(self, agent: Agent, job: Job, index: int) -> None:
        self.agent = agent
        self.job = job
        self.index = index
        self.pid = 0
        self.status: int | None = None
        self.timed_out = False
        self.exited_at = 0.0
        self.group = ""
        self.oom_before = 0
        self.streams: list[Stream] = []
        self.deadline = time.monotonic() + job.timeout_s

    def spawn(self, command: str) -> None:
        cg = self.agent.cgroups
        self.group = cg.new_command_group()
        self.oom_before = cg.oom_kills()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        script_fd = -1
        if len(command.encode()) > P.ARGV_COMMAND_LIMIT:
            script_fd = os.memfd_create("shellbox-command", 0)
            os.write(script_fd, command.encode())
            os.lseek(script_fd, 0, os.SEEK_SET)
            argv = ["/bin/bash", "/dev/fd/3"]
        else:
            argv = ["/bin/bash", "-c", command]
        task_files = cg.task_files(self.group)
        pid = os.fork()
        if pid == 0:  # child: join the cgroups, drop to the sandbox user, exec bash
            try:
                me = str(os.getpid()).encode()
                for path in task_files:
                    fd = os.open(path, os.O_WRONLY)
                    os.write(fd, me)
                    os.close(fd)
                os.setsid()
                os.setgroups([])
                os.setresgid(self.job.gid, self.job.gid, self.job.gid)
                os.setresuid(self.job.uid, self.job.uid, self.job.uid)
                try:
                    os.chdir(self.job.cwd)
                except OSError:
                    os.chdir("/")
                devnull = os.open("/dev/null", os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                if script_fd >= 0:
                    os.dup2(script_fd, 3)
                    os.closerange(4, 65536)
                else:
                    os.closerange(3, 65536)
                for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.execve(argv[0], argv, self.job.env)
            except BaseException:
                os._exit(127)
        os.close(out_w)
        os.close(err_w)
        if script_fd >= 0:
            os.close(script_fd)
        self.pid = pid
        cap = self.job.max_output_length
        self.streams = [Stream(out_r, "stdout", cap), Stream(err_r, "stderr", cap)]
        for s in self.streams:
            os.set_blocking(s.fd, False)
            self.agent.register(s.fd, self.on_readable, s)

    def on_readable(self, stream: Stream) -> None:
        budget = 16  # don't let one noisy command starve the loop
        while budget:
            budget -= 1
            try:
                data = os.read(stream.fd, READ_CHUNK)
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
                    {"type": "delta", "command_index": self.index, "stream": stream.name,
                     "text": fresh}
                )

    def close_stream(self, stream: Stream, drain: bool = False) -> None:
        if not stream.open:
            return
        stream.open = False
        self.agent.unregister(stream.fd)
        fresh = stream.capture.feed(b"", final=True)
        if fresh and self.job.stream:
            self.job.send(
                {"type": "delta", "command_index": self.index, "stream": stream.name,
                 "text": fresh}
            )
        if drain:
            # Background processes still hold the pipe: keep reading into the void so they
            # never see EPIPE (a service that logs to stderr must keep working).
            self.agent.drain_forever(stream.fd)
        else:
            os.close(stream.fd)

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
        return self.exited_at + P.PIPE_GRACE_S

    def finish(self) -> None:
        stdout = self.streams[0].capture.result()
        stderr = self.streams[1].capture.result()
        outcome: dict[str, Any]
        if self.timed_out:
            outcome = {"type": "timeout"}
        else:
            status = self.status or 0
            code = os.waitstatus_to_exitcode(status)
            outcome = {"type": "exit", "exit_code": 128 - code if code < 0 else code}
            cg = self.agent.cgroups
            if cg.oom_kills() > self.oom_before:
                limit = f"{cg.memory_limit // (1 << 20)} MiB" if cg.memory_limit else "limit"
                note = P.OOM_NOTE.format(limit=limit)
                stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + note)
                stderr = P.truncate_text(stderr, self.job.max_output_length)
        self.agent.retire_group(self.group)
        self.job.command_finished(
            {"type": "result", "command_index": self.index, "stdout": stdout,
             "stderr": stderr, "outcome": outcome}
        )


class Job:
    """One exec request: its commands run one after the other on one connection."""

    def __init__(self, agent: Agent, conn: Connection, req: dict[str, Any]) -> None:
        self.agent = agent
        self.conn = conn
        self.commands: list[str] = req["commands"]
        self.timeout_s = max(1, int(req.get("timeout_ms") or 120_000)) / 1000.0
        self.max_output_length = max(0, int(req.get("max_output_length") or 16_384))
        self.stream = bool(req.get("stream", True))
        self.uid = int(req.get("uid", P.SANDBOX_UID))
        self.gid = int(req.get("gid", P.SANDBOX_GID))
        self.cwd = str(req.get("cwd") or P.WORKDIR)
        env = req.get("env") or {}
        self.env = {str(k): str(v) for k, v in env.items()}
        self.current: Command | None = None
        self.next_index = 0

    def send(self, msg: dict[str, Any]) -> None:
        self.conn.send(msg)

    def start_next(self) -> None:
        if self.next_index >= len(self.commands) or self.conn.closed:
            self.current = None
            self.conn.job = None
            self.send({"type": "done"})
            self.conn.close_when_flushed()
            return
        index = self.next_index
        self.next_index += 1
        cmd = Command(self.agent, self, index)
        self.current = cmd
        self.send({"type": "started", "command_index": index})
        try:
            cmd.spawn(self.commands[index])
        except OSError as exc:
            self.current = None
            self.command_finished(
                {"type": "result", "command_index": index, "stdout": "",
                 "stderr": f"shellbox: could not start the command: {exc}",
                 "outcome": {"type": "exit", "exit_code": 126}}
            )
            return
        self.agent.commands[cmd.pid] = cmd

    def command_finished(self, result: dict[str, Any]) -> None:
        if self.current is not None:
            self.agent.commands.pop(self.current.pid, None)
        self.current = None
        self.send(result)
        self.start_next()

    def abandon(self) -> None:
        """The client went away: kill what runs now and run nothing more."""
        self.next_index = len(self.commands)
        cmd = self.current
        if cmd is not None and cmd.status is None and not cmd.timed_out:
            cmd.timed_out = True
            cmd.kill()


class Connection:
    def __init__(self, agent: Agent, sock: socket.socket) -> None:
        self.agent = agent
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.job: Job | None = None
        self.closed = False
        self.closing = False
        self.writing = False

    def on_readable(self, _: object) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        if self.job is not None or self.closing:
            return  # one request per connection; ignore anything after it
        self.inbuf += data
        if len(self.inbuf) > P.MAX_REQUEST_BYTES:
            self.fail("request_too_large", "the request is larger than the agent accepts")
            return
        nl = self.inbuf.find(b"\n")
        if nl < 0:
            return
        line = bytes(self.inbuf[:nl])
        self.inbuf.clear()
        try:
            req = json.loads(line)
            self.handle(req)
        except Exception as exc:  # PID 1 must survive any malformed request
            self.fail("invalid_request", f"{type(exc).__name__}: {exc}")

    def handle(self, req: dict[str, Any]) -> None:
        op = req.get("op")
        if op == "ping":
            self.send({"type": "pong", "version": P.PROTOCOL_VERSION, "pid": os.getpid()})
            self.close_when_flushed()
            return
        if op != "exec":
            self.fail("invalid_request", f"unknown op {op!r}")
            return
        commands = req.get("commands")
        if (
            not isinstance(commands, list)
            or not 1 <= len(commands) <= P.MAX_COMMANDS
            or not all(isinstance(c, str) for c in commands)
        ):
            self.fail("invalid_request", f"commands must be a list of 1 to {P.MAX_COMMANDS} strings")
            return
        if any(len(c.encode()) > P.MAX_COMMAND_BYTES for c in commands):
            self.fail("invalid_request", "a command is longer than 1 MiB")
            return
        self.job = Job(self.agent, self, req)
        self.job.start_next()

    def fail(self, code: str, message: str) -> None:
        self.send({"type": "error", "code": code, "message": message})
        self.close_when_flushed()

    def send(self, msg: dict[str, Any]) -> None:
        if self.closed:
            return
        self.outbuf += json.dumps(msg, ensure_ascii=False).encode("utf-8", "replace") + b"\n"
        self.flush()

    def flush(self) -> None:
        while self.outbuf and not self.closed:
            try:
                n = self.sock.send(self.outbuf)
            except BlockingIOError:
                break
            except OSError:
                self.close()
                return
            del self.outbuf[:n]
        want_write = bool(self.outbuf)
        if want_write != self.writing and not self.closed:
            self.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self.agent.sel.modify(self.sock, events, (self.on_event, None))
        if not self.outbuf and self.closing:
            self.close()

    def on_event(self, _: object, mask: int = selectors.EVENT_READ) -> None:
        if mask & selectors.EVENT_WRITE:
            self.flush()
        if mask & selectors.EVENT_READ and not self.closed:
            self.on_readable(None)

    def close_when_flushed(self) -> None:
        self.closing = True
        if not self.outbuf:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.agent.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        if self.job is not None:
            self.job.abandon()


class Agent:
    def __init__(self, socket_path: str) -> None:
        self.sel = selectors.DefaultSelector()
        self.cgroups = Cgroups()
        self.commands: dict[int, Command] = {}  # pid -> running command
        self.retired: list[str] = []  # cgroups of finished commands whose background jobs live
        self.drains: set[int] = set()
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        self.wake_fd = rfd
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.stopping = False
        try:
            os.unlink(socket_path)
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_path)
        os.chmod(socket_path, 0o600)
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, (self.on_accept, None))
        self.sel.register(rfd, selectors.EVENT_READ, (self.on_wake, None))

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True

    def register(self, fd: int, callback: Any, arg: object) -> None:
        self.sel.register(fd, selectors.EVENT_READ, (callback, arg))

    def unregister(self, fd: int) -> None:
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def drain_forever(self, fd: int) -> None:
        self.drains.add(fd)
        self.register(fd, self.on_drain, fd)

    def on_drain(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.unregister(fd)
            self.drains.discard(fd)
            os.close(fd)

    def retire_group(self, name: str) -> None:
        if not self.cgroups.remove(name):
            self.retired.append(name)

    def on_accept(self, _: object) -> None:
        while True:
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log(f"accept failed: {exc}")
                return
            sock.setblocking(False)
            conn = Connection(self, sock)
            self.sel.register(sock, selectors.EVENT_READ, (conn.on_event, None))

    def on_wake(self, _: object) -> None:
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        self.reap()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            cmd = self.commands.get(pid)
            if cmd is not None:
                cmd.on_exit(status)

    def run(self) -> None:
        last_sweep = time.monotonic()
        while not self.stopping:
            now = time.monotonic()
            timeout = 1.0
            for cmd in list(self.commands.values()):
                timeout = min(timeout, max(0.0, cmd.next_wakeup() - now))
            for key, mask in self.sel.select(timeout):
                callback, arg = key.data
                try:
                    if callback.__name__ == "on_event":
                        callback(arg, mask)
                    else:
                        callback(arg)
                except Exception as exc:  # one bad event must not take PID 1 down
                    log(f"error in {callback.__qualname__}: {type(exc).__name__}: {exc}")
            self.reap()
            now = time.monotonic()
            for cmd in list(self.commands.values()):
                try:
                    cmd.tick(now)
                except Exception as exc:
                    log(f"error finishing command: {type(exc).__name__}: {exc}")
                    self.commands.pop(cmd.pid, None)
            if now - last_sweep > 5 and self.retired:
                last_sweep = now
                self.retired = [g for g in self.retired if not self.cgroups.remove(g)]


def main() -> None:
    os.umask(0o022)
    socket_dir = os.environ.get("SHELLBOX_SOCKET_DIR", P.SOCKET_DIR)
    agent = Agent(os.path.join(socket_dir, P.SOCKET_NAME))
    agent.run()


if __name__ == "__main__":
    main()
