"""Wire format between the host and the in-container agent, and the output capture rules.

Standard library only, and cheap to import: this file is imported by ``server.py`` inside the
container (as the top-level module ``protocol``, on the agent's start-up path, where every
millisecond of import counts) and by ``client.py`` on the host (as
``shellbox.agent.protocol``).

One request per connection. The host sends one JSON header line; an ``exec`` header is
followed by the commands themselves, as raw UTF-8 bytes back to back, ``command_bytes[i]``
bytes for command ``i``. The agent answers in newline-delimited JSON::

    -> {"op": "exec", "command_bytes": [12, 1048576], "timeout_ms": 120000,
        "max_output_length": 16384, "env": {...}, "cwd": "/mnt/data", "stream": true}
       <12 bytes of command 0><1048576 bytes of command 1>
    <- {"type": "started", "command_index": 0}                    (when streaming)
    <- {"type": "delta", "command_index": 0, "stream": "stdout", "text": "..."}  (idem)
    <- {"type": "result", "command_index": 0, "stdout": "...", "stderr": "...",
        "outcome": {"type": "exit", "exit_code": 0}}
    <- {"type": "done"}
    -> {"op": "ping"}            <- {"type": "pong", "version": 2, "pid": 1}
    <- {"type": "error", "code": "invalid_request", "message": "..."}  (any request)
    <- {"type": "error", "code": "busy", "message": "..."}  (MAX_CONCURRENT_CALLS run already)

Commands travel outside the JSON so that nobody builds (or parses) a 100 MiB line: the agent
reads command ``i`` off the socket only when it is about to start it, so it holds at most one
command of a call at a time and the socket's buffers hold the host back meanwhile.

Closing the connection before ``done`` abandons the request: the agent kills the running
command (every process it started) and runs none of the remaining ones.

A terminal (``pty``) starts the sandbox user's shell (or ``bash -c command``) on a
pseudo-terminal the agent allocates, in a command cgroup of its own; after the one answer
line the connection carries frames both ways, a kind byte and a 4-byte big-endian length
before the payload (``PTY_FRAME_HEADER`` bytes), at most ``MAX_PTY_FRAME`` bytes each::

    -> {"op": "pty", "cols": 80, "rows": 24, "command": null, "env": {...}, "cwd": "/mnt/data"}
    <- {"type": "started", "pid": 42}
    -> d<len><keystrokes>          -> r<4><cols:u16><rows:u16>
    <- d<len><terminal output>     <- x<4><exit code:i32>   (then the agent closes)

The agent reads the terminal only while less than ``PTY_OUTBUF_BYTES`` wait for the host, and
the host's frames only while less than ``PTY_INBUF_BYTES`` of keystrokes wait for the
terminal: a slow reader holds the shell back (the kernel blocks its writes), nothing is lost
and nothing grows. Closing the connection ends the terminal: every process it started is
killed. When the shell exits, what it left running keeps running, as a command's leftovers do.
"""

from __future__ import annotations

import codecs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections import deque
else:
    try:  # the C type directly: importing ``collections`` costs the agent ~1 ms at start-up
        from _collections import deque
    except ImportError:  # pragma: no cover - not CPython
        from collections import deque

PROTOCOL_VERSION = 2
SOCKET_DIR = "/run/shellbox"  # must match the bind mount written by sandbox/oci.py
SOCKET_NAME = "agent.sock"
LISTEN_FD_ENV = "SHELLBOX_LISTEN_FD"  # the host passes the bound, listening socket as this fd
SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKDIR = "/mnt/data"
MAX_REQUEST_BYTES = 110 * 1024 * 1024  # an HTTP call body: 100 commands of 1 MiB, JSON-escaped
MAX_HEADER_BYTES = 4 * 1024 * 1024  # an exec header: limits, cwd and the environment
# Calls one agent runs at once; one more is refused with "busy" (a 429 from the server). Each
# call costs the agent at most about 4 MiB (its current command, both captures at the largest
# cap, results queued for the host), so this many fit in the memory the agent keeps for itself
# (AGENT_MEMORY_RESERVE in server.py) beside its own ~10 MiB.
MAX_CONCURRENT_CALLS = 8
# The agent starts no further command of a call while this much output waits for the host.
OUTBUF_PAUSE_BYTES = 1024 * 1024
MAX_COMMAND_BYTES = 1024 * 1024
# Terminals (``op: pty``); see the module docstring.
MAX_PTYS = 32  # open at once; the server has its own, lower cap (max_ptys_per_container)
MAX_PTY_FRAME = 64 * 1024
PTY_FRAME_HEADER = 5
PTY_OUTBUF_BYTES = 256 * 1024
PTY_INBUF_BYTES = 64 * 1024
PTY_EXIT_GRACE_S = 0.5  # after the shell exits, how long its leftovers may hold the terminal
PTY_DATA = b"d"
PTY_RESIZE = b"r"
PTY_EXIT = b"x"
MAX_PTY_SIDE = 10_000  # columns or rows
MAX_COMMANDS = 100
DEFAULT_TIMEOUT_MS = 120_000
DEFAULT_MAX_OUTPUT_LENGTH = 16_384
# Longer commands go to bash through a memfd, not argv (one argv string is capped at 128 KiB).
ARGV_COMMAND_LIMIT = 100 * 1024
PIPE_GRACE_S = 0.5  # after the shell exits, how long to wait for pipes held by its children
TAIL_PIECES = 32  # the capture's tail queue is compacted beyond this many pieces
OOM_NOTE = "shellbox: the command was killed because the container ran out of memory ({limit})."


def pty_frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def truncation_marker(omitted: int) -> str:
    return f"\n[... {omitted} characters truncated ...]\n"


def truncate_text(text: str, cap: int) -> str:
    """Head + marker + tail, never longer than ``cap`` characters (code points)."""
    if len(text) <= cap:
        return text
    return _join_truncated(text[:cap], text[-cap:] if cap else "", len(text), cap)


def _split(total: int, cap: int) -> tuple[int, int, str] | None:
    """How many leading and trailing characters of ``total`` fit in ``cap`` beside a marker
    that reports exactly how many were left out; None when not even the marker fits."""
    # The marker's length depends on the count it reports, which depends on the marker's
    # length: try each possible number of digits and keep the one that is self-consistent.
    for digits in range(1, 21):
        marker_len = len(truncation_marker(0)) - 1 + digits
        budget = cap - marker_len
        if budget < 0:
            return None
        omitted = total - budget
        if len(str(omitted)) == digits:
            head = (budget + 1) // 2
            return head, budget - head, truncation_marker(omitted)
    return None  # pragma: no cover - more than 10**20 characters


def _join_truncated(head: str, tail: str, total: int, cap: int) -> str:
    """The truncated form of a text of ``total`` characters (> cap), from its first and last
    ``cap`` characters."""
    split = _split(total, cap)
    if split is None:  # a cap shorter than the marker: the head alone
        return head[:cap]
    head_keep, tail_keep, marker = split
    return head[:head_keep] + marker + (tail[len(tail) - tail_keep :] if tail_keep else "")


class Capture:
    """Decodes one output stream incrementally and keeps O(cap) characters of it.

    Memory stays bounded whatever the command prints: the head is kept up to ``cap``
    characters, the tail as a queue trimmed to the last ``cap`` characters (plus at most one
    chunk, in at most ``TAIL_PIECES`` strings), and everything between is only counted.
    Bytes are decoded as UTF-8 with replacement; a character split across two reads is
    decoded whole.
    """

    __slots__ = (
        "_decoder", "_head", "_head_len", "_tail", "_tail_len", "cap", "total",
    )  # fmt: skip

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0

    def feed(self, data: bytes, final: bool = False) -> str:
        """Add raw bytes; return the newly decoded text that falls within the head (for deltas)."""
        text = self._decoder.decode(data, final)
        if not text:
            return ""
        self.total += len(text)
        fresh = ""
        if self._head_len < self.cap:
            fresh = text[: self.cap - self._head_len]
            self._head.append(fresh)
            self._head_len += len(fresh)
            text = text[len(fresh) :]
        if text:
            tail = self._tail
            tail.append(text)
            self._tail_len += len(text)
            while tail and self._tail_len - len(tail[0]) >= self.cap:
                self._tail_len -= len(tail.popleft())
            if len(tail) > TAIL_PIECES:  # many small reads: one string, not cap tiny objects
                joined = "".join(tail)[-self.cap :] if self.cap else ""
                tail.clear()
                tail.append(joined)
                self._tail_len = len(joined)
        return fresh

    def result(self) -> str:
        head = "".join(self._head)
        if self.total <= self.cap:
            return head + "".join(self._tail)
        tail = "".join(self._tail)
        if len(tail) < self.cap:  # the tail queue holds fewer than cap: borrow from the head
            tail = (head + tail)[-self.cap :]
        return _join_truncated(head, tail[-self.cap :] if self.cap else "", self.total, self.cap)
