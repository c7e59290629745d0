"""TCP connections to ``127.0.0.1:PORT`` inside a container's network namespace.

A container without egress has a private network namespace holding only loopback; one with
egress joins ``/run/netns/sbe<N>``. Either way the server reaches a service listening on the
container's loopback by making the socket *in* that namespace: a socket keeps the namespace
it was created in for life, so only ``socket()`` has to run there; ``connect``, reads and
writes then happen on the event loop like any other socket, with the kernel's loopback
between the server and the service (no copy through the agent, no extra process).

The ``setns`` calls run on one dedicated helper thread, never on the event loop's thread:
a network namespace is per thread, and a loop thread left in a sandbox's namespace by a
failure between the two ``setns`` calls would send the server's own later connections (to
PostgreSQL, to an upstream model) into the sandbox. The helper thread does nothing else, and
enters the target namespace afresh before every socket it makes, so whatever namespace it is
left in can never leak into another container or into the server.

Which namespace: ``/proc/<pid>/ns/net`` of the container's agent (PID 1 inside), opened once
per container start through a pidfd and kept open; a use first checks that the pidfd's
process is still alive (the container was not restarted or deleted in between), and the
pidfd is opened before the process's cgroup is checked, so a recycled pid cannot hand out
another container's namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("shellbox.sandbox")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Netns:
    """A container's network namespace, held open, and the process that vouches for it."""

    pidfd: int
    fd: int

    def alive(self) -> bool:
        """Whether the agent that owned the namespace still runs (a pidfd polls readable
        once its process has exited)."""
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        for fd in (self.fd, self.pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)


def open_netns(pid: int, cgroup_marker: str) -> Netns | None:
    """The network namespace of process ``pid``, if it still is the process whose cgroup path
    holds ``cgroup_marker`` (the container id); None when it has gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            if cgroup_marker not in f.read():
                os.close(pidfd)
                return None
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        os.close(pidfd)
        return None
    netns = Netns(pidfd, fd)
    if not netns.alive():  # it exited after the checks: the namespace may not be its
        netns.close()
        return None
    return netns


class NetnsDialer:
    """Makes sockets in other network namespaces on its own helper thread."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="shellbox-netns")
        self._home: int | None = None

    def _socket_in(self, netns_fd: int) -> socket.socket:
        """Runs on the helper thread: enter the namespace, make the socket, go back."""
        if self._home is None:
            self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if _libc.setns(netns_fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the container's network namespace: {os.strerror(err)}")
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        finally:
            if _libc.setns(self._home, CLONE_NEWNET) != 0:  # harmless (see the module's note)
                log.warning("the netns helper thread could not go back to the server's namespace")
        sock.setblocking(False)
        return sock

    async def connect(self, netns: Netns, port: int) -> socket.socket:
        """A socket connected to ``127.0.0.1:port`` in ``netns``; ``ConnectionRefusedError``
        when nothing listens there."""
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._thread, self._socket_in, netns.fd)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self._thread.shutdown(wait=False)
        if self._home is not None:
            os.close(self._home)
            self._home = None
