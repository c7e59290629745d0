"""``python -m shellbox.cluster.teardown STATE_DIR``: destroy every container a node that no
longer runs left in its state directory, with the node's own runtime over it (the settings
come from the environment, as the node's did).

A node killed with ``kill -9`` leaves its containers running (on purpose: a restart takes them
back); removing its directory then would leave their processes, cgroups and uid claims on the
machine for good. ``LocalCluster.destroy_sandboxes`` runs this for such a node, in a process of
its own: the runtime moves the process that makes it into a mount namespace of its own and
mounts the node's disks there, which must not happen to the caller (``cluster.sh``, a test).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from shellbox.sandbox import create_runtime
from shellbox.settings import load_settings


async def destroy_all(state_dir: Path) -> list[str]:
    """Destroy the containers under ``state_dir``; returns their ids."""
    runtime = create_runtime(load_settings(None, state_dir=state_dir.resolve()))
    ids = [info.id for info in await runtime.list()]
    for cid in ids:
        await runtime.destroy(cid)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shellbox.cluster.teardown",
        description="destroy every container a stopped node left in its state directory",
    )
    parser.add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    if not (args.state_dir / "containers").is_dir():
        return 0  # the node never made one
    ids = asyncio.run(destroy_all(args.state_dir))
    print(f"destroyed {len(ids)} containers in {args.state_dir}: {' '.join(ids)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
