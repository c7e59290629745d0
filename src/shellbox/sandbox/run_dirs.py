"""Where a server's volatile, per-host state lives: ``/run/shellbox/<key>``.

Short paths (a Unix socket path must fit in 108 bytes), on tmpfs (gone at reboot), one
directory per state directory so that servers on one host stay apart. The OCI runtime keeps
its own state and the agents' sockets there; the egress feature its proxy's sockets and
the names of its host-wide network slot claims.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

RUN_BASE = Path("/run/shellbox")


def run_base_for(state_dir: Path) -> Path:
    """``/run/shellbox/<key>``, the key the start of the resolved state directory's sha256."""
    key = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return RUN_BASE / key
