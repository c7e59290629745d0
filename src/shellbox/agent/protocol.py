"""Wire format between the host and the in-container agent, and the output capture rules.

Standard library only: this file is imported by ``server.py`` inside the container (as the
top-level module ``protocol``) and by ``client.py`` on the host (as
``shellbox.agent.protocol``).

One request per connection, newline-delimited JSON both ways::

    -> {"op": "exec", "commands": [...], "timeout_ms": 120000, "max_output_length": 16384,
        "env": {...}, "cwd": "/mnt/data", "user": 1000}
    <- {"type": "started", "command_index": 0}
    <- {"type": "delta", "command_index": 0, "stream": "stdout", "text": "..."}
    <- {"type": "result", "command_index": 0, "stdout": "...", "stderr": "...",
        "outcome": {"type": "exit", "exit_code": 0}}
    <- {"type": "done"}
    -> {"op": "ping"}            <- {"type": "pong", "version": 1, "pid": 1}
    <- {"type": "error", "code": "invalid_request", "message": "..."}  (any request)
"""

from __future__ import annotations

import codecs
import collections

PROTOCOL_VERSION = 1
SOCKET_DIR = "/run/shellbox"  # must match the bind mount written by sandbox/oci.py
SOCKET_NAME = "agent.sock"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKDIR = "/mnt/data"
MAX_REQUEST_BYTES = 110 * 1024 * 1024  # 100 commands of 1 MiB, JSON-escaped
MAX_COMMAND_BYTES = 1024 * 1024
MAX_COMMANDS = 100
# Longer commands go to bash through a memfd, not argv (one argv string is capped at 128 KiB).
ARGV_COMMAND_LIMIT = 100 * 1024
PIPE_GRACE_S = 0.5  # after the shell exits, how long to wait for pipes held by its children
OOM_NOTE = "shellbox: the command was killed because the container ran out of memory ({limit})."


def truncation_marker(omitted: int) -> str:
    return f"\n[... {omitted} characters truncated ...]\n"


def truncate_text(text: str, cap: int) -> str:
    """Head + marker + tail, never longer than ``cap`` characters (code points)."""
    if len(text) <= cap:
        return text
    return _join_truncated(text[:cap], text[-cap:] if cap else "", len(text), cap)


def _join_truncated(head: str, tail: str, total: int, cap: int) -> str:
    """Build the truncated form from the first and last ``cap`` characters of a longer text."""
    omitted = total - cap
    for _ in range(3):  # the marker's length depends on the count it reports
        marker = truncation_marker(omitted)
        budget = cap - len(marker)
        if budget <= 0:
            return head[:cap]
        head_keep = (budget + 1) // 2
        tail_keep = budget - head_keep
        new_omitted = total - head_keep - tail_keep
        if new_omitted == omitted:
            break
        omitted = new_omitted
    tail_part = tail[len(tail) - tail_keep :] if tail_keep else ""
    return head[:head_keep] + marker + tail_part


class Capture:
    """Decodes one output stream incrementally and keeps at most ~2*cap characters of it.

    Memory stays O(cap) whatever the command prints: the head is kept up to ``cap``
    characters, and the tail as a queue trimmed to the last ``cap`` characters.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_len = 0
        self._tail: collections.deque[str] = collections.deque()
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
            self._tail.append(text)
            self._tail_len += len(text)
            while self._tail and self._tail_len - len(self._tail[0]) >= self.cap:
                self._tail_len -= len(self._tail.popleft())
        return fresh

    def result(self) -> str:
        head = "".join(self._head)
        if self.total <= self.cap:
            return head + "".join(self._tail)
        tail = "".join(self._tail)
        if len(tail) < self.cap:  # the tail queue holds fewer than cap: borrow from the head
            tail = (head + tail)[-self.cap :]
        return _join_truncated(head, tail[-self.cap :], self.total, self.cap)
