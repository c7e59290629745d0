from __future__ import annotations

from shellbox.sandbox import ExecRequest, OciRuntime


async def test_echo_runs_as_sandbox_user(runtime: OciRuntime, container: str) -> None:
    [r] = await runtime.run(container, ExecRequest(["echo hi; id -u; pwd"], 5000, 1000))
    assert r.stdout == "hi\n1000\n/mnt/data\n"
    assert r.outcome.exit_code == 0
