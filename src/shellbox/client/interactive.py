"""``shellbox shell CONTAINER_ID``: the local terminal joined to a container's terminal.

The local terminal goes to raw mode (every key, Ctrl-C included, goes to the container's
shell, which echoes it) and is restored however the session ends; a resize of the local
window (SIGWINCH) resizes the remote terminal. Standard input that is not a terminal (a
pipe) is sent as it is, and the session still ends when the remote shell exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Coroutine, Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed

from shellbox.client.async_client import AsyncShellbox
from shellbox.client.errors import ShellboxClientError

READ_SIZE = 65536


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """Raw mode on ``fd`` while the block runs, when it is a terminal; restored after."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)  # keep what was typed ahead
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def window_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return max(size.columns, 1), max(size.lines, 1)


async def run_shell(
    client: AsyncShellbox,
    container_id: str,
    *,
    command: str | None = None,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
) -> int:
    """Join the local terminal to a terminal in the container until its shell exits; return
    the shell's exit status (1 when the terminal ended otherwise, with a line saying why)."""
    loop = asyncio.get_running_loop()
    cols, rows = window_size(stdout_fd if os.isatty(stdout_fd) else stdin_fd)
    async with client.pty(container_id, cols=cols, rows=rows, command=command) as term:
        keys: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
        pending: set[asyncio.Task[None]] = set()

        def on_key() -> None:
            try:
                data = os.read(stdin_fd, READ_SIZE)
            except BlockingIOError:
                return
            if not data:  # end of input (a pipe): stop reading, let the shell finish
                loop.remove_reader(stdin_fd)
                return
            try:
                keys.put_nowait(data)
            except asyncio.QueueFull:  # the server takes keys slower than they come: wait
                loop.remove_reader(stdin_fd)
                later(put_then_resume(data))

        def later(work: Coroutine[Any, Any, None]) -> None:
            task = loop.create_task(work)
            pending.add(task)
            task.add_done_callback(pending.discard)

        async def put_then_resume(data: bytes) -> None:
            await keys.put(data)
            loop.add_reader(stdin_fd, on_key)

        async def send_keys() -> None:
            while True:
                await term.send(await keys.get())

        async def show_output() -> None:
            async for chunk in term:
                os.write(stdout_fd, chunk)

        def on_resize() -> None:
            later(term.resize(*window_size(stdout_fd)))

        with raw_mode(stdin_fd):
            loop.add_reader(stdin_fd, on_key)
            if os.isatty(stdout_fd):
                loop.add_signal_handler(signal.SIGWINCH, on_resize)
            sender = loop.create_task(send_keys())
            try:
                await show_output()
            except ShellboxClientError as exc:
                sys.stderr.write(f"\r\nshellbox: {exc}\r\n")
                return 1
            finally:
                loop.remove_reader(stdin_fd)
                if os.isatty(stdout_fd):
                    loop.remove_signal_handler(signal.SIGWINCH)
                for task in (sender, *pending):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                        await task
        code = term.exit_code
    return 1 if code is None else code
