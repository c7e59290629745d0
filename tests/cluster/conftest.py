"""The cluster lane (``-m cluster``): sandbox nodes, API replicas and PostgreSQL, as real
processes (and, in ``test_cluster_runtime.py``, real runtimes in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
