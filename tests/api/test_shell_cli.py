"""``shellbox shell CONTAINER_ID`` driven through a real pseudo-terminal (python's ``pty``), as
a person at a terminal would: raw mode, the remote shell's echo, a window resize (SIGWINCH),
the exit status, and the local terminal restored afterwards."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from typing import Any


def read_until(fd: int, pattern: bytes, seen: bytearray, timeout_s: float = 30) -> bytes:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, seen):
        assert time.monotonic() < deadline, f"no {pattern!r} in {bytes(seen[-2000:])!r}"
        try:
            seen += os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.01)
    found = bytes(seen)
    seen.clear()
    return found


def read_until_size(fd: int, seen: bytearray) -> bytes:
    """Ask the remote shell for its terminal size; returns what came up to its answer."""
    os.write(fd, b"stty size\r")
    return read_until(fd, rb"[\r\n]\d+ \d+\r\n", seen)


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_shell_cli_through_a_pty(server: Any, api_key: str, cid: str) -> None:
    master, slave = pty.openpty()
    set_size(slave, 101, 31)
    before = termios.tcgetattr(slave)
    env = {**os.environ, "SHELLBOX_BASE_URL": server.base_url, "SHELLBOX_API_KEY": api_key}

    def controlling_tty() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # so that a resize sends it SIGWINCH

    proc = subprocess.Popen(
        [sys.executable, "-m", "shellbox.cli", "shell", cid],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        preexec_fn=controlling_tty,
    )
    os.set_blocking(master, False)
    seen = bytearray()
    try:
        read_until(master, rb"\$ $", seen)  # the remote prompt
        os.write(master, b"echo hi; stty size\r")
        out = read_until(master, rb"[\r\n]hi\r\n31 101\r\n", seen)
        assert b"hi" in out
        # Raw mode: the local terminal echoes nothing, so "echo hi" shows once (the remote
        # shell's echo) and "hi" once as the command's output.
        assert out.count(b"echo hi") == 1, out
        set_size(master, 120, 40)  # the window grows: SIGWINCH to shellbox shell
        # It reaches the remote terminal on its way's pace (the CLI, the server, the agent):
        # ask until the remote shell sees it, rather than once after a fixed pause.
        deadline = time.monotonic() + 60
        while True:
            out = read_until_size(master, seen)
            if re.search(rb"[\r\n]40 120\r\n", out):
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.1)
        os.write(master, b"exit 7\r")
        assert proc.wait(30) == 7
        assert termios.tcgetattr(slave) == before  # the local terminal restored on exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)
