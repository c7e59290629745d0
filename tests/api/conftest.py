"""Fixtures for the HTTP API tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def cid(client: Any) -> Iterator[str]:
    """A fresh container on the shared server, deleted afterwards."""
    c = client.containers.create(name="t")
    yield c.id
    with contextlib.suppress(Exception):  # the test may have deleted it already
        client.containers.delete(c.id)
