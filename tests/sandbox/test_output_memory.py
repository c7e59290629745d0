"""Capture memory is bounded by the cap, whatever a command prints (1 GB here)."""

from __future__ import annotations

import time

from sandbox_helpers import status_kb

from shellbox.sandbox import ExecRequest, OciRuntime

GB = 1_000_000_000


async def test_a_command_printing_1_gb_finishes_with_bounded_capture_memory(
    runtime: OciRuntime, container: str
) -> None:
    agent = await runtime.agent_pid(container)
    assert agent is not None
    cap = 65_536
    [warm] = await runtime.run(container, ExecRequest(["seq 100000"], 10_000, cap))
    assert warm.stdout.endswith("100000\n")
    hwm_before = status_kb(agent, "VmHWM")
    t = time.monotonic()
    [r] = await runtime.run(
        container,
        ExecRequest(
            [f"yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {GB}; echo done >&2"],
            120_000,
            cap,
        ),
    )
    elapsed = time.monotonic() - t
    assert (r.outcome.exit_code, r.stderr) == (0, "done\n")
    assert len(r.stdout) == cap
    assert r.stdout.startswith("0123456789abcdefghijklmnopqrstuvwxyz\n0123")
    head, _, rest = r.stdout.partition("\n[... ")
    count, _, tail = rest.partition(" characters truncated ...]\n")
    assert int(count) == GB - len(head) - len(tail)
    line = "0123456789abcdefghijklmnopqrstuvwxyz\n"
    ending = line * (len(tail) // len(line) + 2) + line[: GB % len(line)]
    assert tail == ending[-len(tail) :]
    growth_kb = status_kb(agent, "VmHWM") - hwm_before
    # The agent's peak resident memory grew by O(cap) (a few pipe reads), not O(output).
    assert growth_kb < 8 * 1024, growth_kb
    print(f"1 GB drained in {elapsed:.1f} s; agent VmHWM +{growth_kb} kB")
