"""Fixtures for the Agents SDK integration: a shellbox client for the shared test server.

The model is the SDK's own ``agents.testing.ScriptedModel`` (no network); tracing is off so
nothing tries to export spans to OpenAI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from agents import set_tracing_disabled

from shellbox.client import AsyncShellbox, Shellbox


@pytest.fixture(autouse=True, scope="session")
def _no_tracing() -> None:
    set_tracing_disabled(True)


@pytest.fixture
async def sb(server: Any, api_key: str) -> AsyncIterator[AsyncShellbox]:
    async with AsyncShellbox(server.base_url, api_key) as client:
        yield client


@pytest.fixture
def sb_sync(server: Any, api_key: str) -> Iterator[Shellbox]:
    with Shellbox(server.base_url, api_key) as client:
        yield client
