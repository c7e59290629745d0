"""How the suite waits for what the server, an agent or the kernel does at its own pace (a
process to start or die, a container to go to sleep, an audit row to be written)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# The bound of such a wait: it ends as soon as its condition holds, so the bound costs
# nothing when all is well; it only has to outlast a loaded host (load average 100-400),
# where 5-10 s bounds failed.
WAIT_S = 60


def wait_until(predicate: Callable[[], Any], timeout_s: float, step_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; whether it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())
