"""The semantics of running a shell call (design.md section 3), against crun and runc."""

from __future__ import annotations

import asyncio
import time

import pytest
from sandbox_helpers import TIME_SCALE, WAIT_S, host_pids, run1, wait_gone

from shellbox.agent.protocol import MAX_COMMAND_BYTES
from shellbox.errors import InvalidRequest
from shellbox.sandbox import (
    CommandFinished,
    CommandStarted,
    ExecRequest,
    OciRuntime,
    OutputDelta,
)
from shellbox.service.shell import ShellLimits


async def test_commands_run_in_order_with_streams_apart(oci: OciRuntime, box: str) -> None:
    results = await oci.run(
        box,
        ExecRequest(
            ["echo one; echo uno >&2", "echo two >&2; echo dos", "echo $((1+2))"], 10_000, 1000
        ),
    )
    assert [(r.stdout, r.stderr) for r in results] == [
        ("one\n", "uno\n"),
        ("dos\n", "two\n"),
        ("3\n", ""),
    ]


async def test_exit_codes_and_a_failure_does_not_stop_the_next(oci: OciRuntime, box: str) -> None:
    results = await oci.run(
        box, ExecRequest(["exit 3", "false", "no-such-program", "echo after"], 10_000, 1000)
    )
    assert [r.outcome.type for r in results] == ["exit"] * 4
    assert [r.outcome.exit_code for r in results] == [3, 1, 127, 0]
    assert "no-such-program: command not found" in results[2].stderr
    assert results[3].stdout == "after\n"


async def test_signal_death_reports_128_plus_n(oci: OciRuntime, box: str) -> None:
    results = await oci.run(
        box,
        ExecRequest(
            [
                "kill -TERM $$",
                "kill -KILL $$",
                "python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'",
            ],
            10_000,
            1000,
        ),
    )
    assert [r.outcome.exit_code for r in results] == [143, 137, 139]


async def test_environment_working_directory_and_stdin(oci: OciRuntime, box: str) -> None:
    r = await run1(oci, box, "pwd; id -un; env | sort; cat; test -t 0 || echo no-tty")
    lines = r.stdout.splitlines()
    assert lines[0] == "/mnt/data"
    assert lines[1] == "user"
    env = dict(line.split("=", 1) for line in lines[2:-1])
    assert env["HOME"] == "/home/user"
    assert env["LANG"] == "C.UTF-8"
    assert "/usr/bin" in env["PATH"]
    assert not {k for k in env if k.startswith(("SHELLBOX", "VIRTUAL_ENV", "PYTEST", "SSH"))}
    assert lines[-1] == "no-tty"  # and `cat` read an empty stdin instead of hanging


def test_zero_and_101_commands_are_rejected_with_a_clear_message() -> None:
    limits = ShellLimits.from_settings()
    with pytest.raises(InvalidRequest, match="commands is empty: give at least one command"):
        limits.exec_request([], None, None)
    with pytest.raises(InvalidRequest, match="101 commands in one call; at most 100"):
        limits.exec_request(["true"] * 101, None, None)
    with pytest.raises(InvalidRequest, match="may be at most 1 MiB"):
        limits.exec_request(["x" * (MAX_COMMAND_BYTES + 1)], None, None)
    assert len(limits.exec_request(["true"] * 100, None, None).commands) == 100


async def test_the_agent_rejects_0_and_101_commands_too(oci: OciRuntime, box: str) -> None:
    for commands, message in (([], "0 commands"), (["true"] * 101, "101 commands")):
        with pytest.raises(InvalidRequest, match=message):
            await oci.run(box, ExecRequest(commands, 10_000, 100))
    with pytest.raises(InvalidRequest, match="longer than 1 MiB"):
        await oci.run(box, ExecRequest(["x" * (MAX_COMMAND_BYTES + 1)], 10_000, 100))
    assert (await run1(oci, box, "echo still fine")).stdout == "still fine\n"


async def test_timeout_keeps_partial_output_and_kills_escapers(
    oci: OciRuntime, box: str, marker: str
) -> None:
    escaper, daemon = f"sleep {marker}1", f"sleep {marker}2"
    command = (
        "echo partial; echo to-stderr >&2; "
        f"setsid {escaper} & "
        f"(setsid sh -c '{daemon} & exit 0' &); "  # double fork: orphaned, own session
        "sleep 0.3; echo late; sleep 100"
    )
    t = time.monotonic()
    # 1.5 s, times TIME_SCALE in an emulated guest, where starting two setsid children
    # before ``echo late`` can take longer than the unscaled timeout.
    [r] = await oci.run(box, ExecRequest([command], int(1500 * TIME_SCALE), 1000))
    elapsed = time.monotonic() - t
    assert r.outcome.type == "timeout"
    assert r.outcome.to_wire() == {"type": "timeout"}
    assert r.stdout == "partial\nlate\n"
    assert r.stderr == "to-stderr\n"
    assert elapsed < 5 * TIME_SCALE
    assert await wait_gone(f"sleep {marker}") == []  # checked on the host
    assert (await run1(oci, box, "echo next")).stdout == "next\n"


async def test_background_service_survives_and_answers_in_the_next_call(
    oci: OciRuntime, box: str
) -> None:
    start = (
        "python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/http.log 2>&1 & "
        "for i in $(seq 100); do curl -s -o /dev/null 127.0.0.1:8765 && break; sleep 0.05; done; "
        "echo started"
    )
    r = await run1(oci, box, start)
    assert r.stdout == "started\n"
    await asyncio.sleep(0.2)
    r = await run1(oci, box, "echo hello > page.txt; curl -s http://127.0.0.1:8765/page.txt")
    assert r.stdout == "hello\n"
    assert r.outcome.exit_code == 0


async def test_a_background_job_holding_the_pipes_does_not_hold_the_call(
    oci: OciRuntime, box: str, marker: str
) -> None:
    t = time.monotonic()
    r = await run1(oci, box, f"sleep {marker} & echo started; echo err >&2")
    elapsed = time.monotonic() - t
    assert (r.stdout, r.stderr, r.outcome.exit_code) == ("started\n", "err\n", 0)
    assert elapsed < 1.5
    assert host_pids(f"sleep {marker}")  # it keeps running
    # and the agent keeps draining its output, so it never gets EPIPE
    r = await run1(oci, box, f"pgrep -f 'sleep {marker}' >/dev/null && echo alive")
    assert r.stdout == "alive\n"


async def test_truncation_counts_characters_and_never_splits_one(oci: OciRuntime, box: str) -> None:
    # Written 7 bytes at a time, so multi-byte characters straddle the pipe reads.
    script = (
        "import sys; b = ('é' * 3000 + '字' * 3000 + '🙂' * 3000).encode(); "
        "[sys.stdout.buffer.write(b[i:i + 7]) or sys.stdout.flush() for i in range(0, len(b), 7)]"
    )
    cap = 1000
    [r] = await oci.run(box, ExecRequest([f'python3 -c "{script}"'], 30_000, cap))
    out = r.stdout
    assert len(out) <= cap
    assert "\ufffd" not in out
    head, sep, rest = out.partition("\n[... ")
    assert sep, out
    count, _, tail = rest.partition(" characters truncated ...]\n")
    assert set(head) == {"é"} and set(tail) == {"🙂"}
    assert len(head) + len(tail) + int(count) == 9000  # the marker tells exactly what is gone
    assert len(out) == cap


async def test_output_under_the_cap_is_untouched(oci: OciRuntime, box: str) -> None:
    [r] = await oci.run(box, ExecRequest(["printf 'é%.0s' $(seq 100)"], 10_000, 100))
    assert r.stdout == "é" * 100
    [r] = await oci.run(box, ExecRequest(["echo hidden; echo err >&2"], 10_000, 0))
    assert (r.stdout, r.stderr) == ("", "")


async def test_invalid_utf8_becomes_replacement_characters(oci: OciRuntime, box: str) -> None:
    r = await run1(oci, box, r"printf 'a\xffb\xfe\xc3'; printf '\xe2\x82' >&2")
    assert r.stdout == "a\ufffdb\ufffd\ufffd"
    assert r.stderr == "\ufffd"


async def test_a_1_mib_command_runs(oci: OciRuntime, box: str) -> None:
    filler = "# " + "x" * 1000 + "\n"
    body = "echo start\n" + filler * 1040
    command = body + "echo end $((6 * 7))\n"
    command += "#" * (MAX_COMMAND_BYTES - len(command.encode()))
    assert len(command.encode()) == MAX_COMMAND_BYTES
    r = await run1(oci, box, command)
    assert (r.stdout, r.stderr, r.outcome.exit_code) == ("start\nend 42\n", "", 0)


async def test_events_stream_in_order(oci: OciRuntime, box: str) -> None:
    events = [
        e
        async for e in oci.exec(
            box, ExecRequest(["echo a; sleep 0.2; echo b", "echo c >&2"], 10_000, 1000)
        )
    ]
    assert events[0] == CommandStarted(0)
    deltas = [e for e in events if isinstance(e, OutputDelta)]
    assert [(d.command_index, d.stream, d.text) for d in deltas] == [
        (0, "stdout", "a\n"),
        (0, "stdout", "b\n"),
        (1, "stderr", "c\n"),
    ]
    finished = [e for e in events if isinstance(e, CommandFinished)]
    assert [f.command_index for f in finished] == [0, 1]
    assert events.index(finished[0]) < events.index(CommandStarted(1))


async def test_closing_the_stream_early_kills_the_command(
    oci: OciRuntime, box: str, marker: str
) -> None:
    stream = oci.exec(box, ExecRequest([f"sleep {marker} & wait", "touch never"], 30_000, 100))
    assert await anext(stream) == CommandStarted(0)
    deadline = time.monotonic() + WAIT_S  # started is said before bash has forked the sleep
    while not host_pids(f"sleep {marker}"):
        assert time.monotonic() < deadline, "the command's sleep never started"
        await asyncio.sleep(0.05)
    await stream.aclose()
    assert await wait_gone(f"sleep {marker}") == []
    r = await run1(oci, box, "ls never 2>&1; echo ok")
    assert r.stdout.endswith("ok\n") and "No such file" in r.stdout


async def test_calls_to_one_container_can_overlap(oci: OciRuntime, box: str) -> None:
    slow = oci.run(box, ExecRequest(["sleep 0.5; echo slow"], 10_000, 100))
    fast = oci.run(box, ExecRequest(["echo fast"], 10_000, 100))
    [s], [f] = await asyncio.gather(slow, fast)
    assert (s.stdout, f.stdout) == ("slow\n", "fast\n")


async def test_a_working_directory_the_user_cannot_enter_falls_back_to_root(
    oci: OciRuntime, box: str
) -> None:
    for pause in (0.3, 0.0):  # from the spare, then by spawn
        await asyncio.sleep(pause)
        [r] = await oci.run(box, ExecRequest(["pwd"], 10_000, 100, cwd="/root"))
        assert r.stdout == "/\n"
        [r] = await oci.run(box, ExecRequest(["pwd"], 10_000, 100, cwd="/tmp"))
        assert r.stdout == "/tmp\n"
