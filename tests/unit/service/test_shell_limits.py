"""``ShellLimits``: the one place a call's ``timeout_ms`` and ``max_output_length`` get their
defaults and clamps."""

from __future__ import annotations

import pytest

from shellbox.agent import protocol
from shellbox.errors import InvalidRequest
from shellbox.service.shell import ShellLimits, int_or_null
from shellbox.settings import LimitSettings


def test_the_defaults_are_the_agent_protocols() -> None:
    limits = ShellLimits.from_settings()
    assert limits.timeout_ms(None) == protocol.DEFAULT_TIMEOUT_MS
    assert limits.output_length(None) == protocol.DEFAULT_MAX_OUTPUT_LENGTH


def test_clamps_and_a_default_above_its_clamp() -> None:
    limits = ShellLimits.from_settings(
        LimitSettings(
            default_timeout_ms=9_000,
            max_timeout_ms=5_000,
            default_max_output_length=900,
            max_output_length=500,
        )
    )
    assert [limits.timeout_ms(t) for t in (None, 0, -1, 100, 10_000)] == [
        5_000,
        5_000,
        5_000,
        100,
        5_000,
    ]
    assert [limits.output_length(n) for n in (None, -1, 0, 100, 10_000)] == [500, 500, 0, 100, 500]
    # A budget the caller has left clamps too, the default included.
    assert limits.timeout_ms(None, at_most=70) == 70
    assert limits.timeout_ms(4_000, at_most=4_500) == 4_000
    request = limits.exec_request(["true"], 10**9, 10**9)
    assert (request.timeout_ms, request.max_output_length) == (5_000, 500)


def test_int_or_null_names_the_field() -> None:
    assert int_or_null(None, param="action.timeout_ms") is None
    assert int_or_null(7, param="action.timeout_ms") == 7
    for bad in (1.5, "10", True):
        with pytest.raises(InvalidRequest) as caught:
            int_or_null(bad, param="action.max_output_length")
        assert caught.value.param == "action.max_output_length"
