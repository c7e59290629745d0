"""The server's Prometheus metrics, on a registry of its own (one per app: tests run several).

Counted as the work happens: container creates, tool calls (by item type) and their duration,
commands that timed out, commands the OOM killer ended. Read from the database at each
scrape (so they hold across restarts and replicas): containers by state, egress requests by
decision, billed sandbox seconds by project.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shellbox.agent.protocol import OOM_NOTE
from shellbox.store.metering import StatsStore

OOM_MARK = OOM_NOTE.split("(", 1)[0]  # the note without its limit
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))
STATES = ("running", "sleeping", "expired")


class _StoredFigures(Collector):
    def __init__(self, stats: StatsStore) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "shellbox_containers", "containers by state (deleted ones left out)", labels=["state"]
        )
        counts = self.stats.containers_by_status()
        for state in sorted({*STATES, *counts} - {"deleted"}):
            states.add_metric([state], counts.get(state, 0))
        yield states
        egress = CounterMetricFamily(
            "shellbox_egress_requests",
            "egress requests through the proxy, by decision",
            labels=["decision"],
        )
        decisions = self.stats.egress_decisions()
        for decision in ("allowed", "refused"):
            egress.add_metric([decision], decisions.get(decision, 0))
        yield egress
        seconds = CounterMetricFamily(
            "shellbox_sandbox_seconds", "billed sandbox seconds, by project", labels=["project"]
        )
        for project, ms in sorted(self.stats.billed_ms_by_project().items()):
            seconds.add_metric([project], ms / 1000)
        yield seconds


class Metrics:
    def __init__(self, stats: StatsStore) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.creates = Counter(
            "shellbox_container_creates", "containers created", registry=self.registry
        )
        self.calls = Counter(
            "shellbox_calls", "tool calls run, by item type", ["type"], registry=self.registry
        )
        self.call_seconds = Histogram(
            "shellbox_call_duration_seconds",
            "time to run one tool call, by item type",
            ["type"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.timeouts = Counter(
            "shellbox_commands_timed_out", "commands ended by their timeout", registry=self.registry
        )
        self.oom_kills = Counter(
            "shellbox_oom_kills",
            "commands killed because their container ran out of memory",
            registry=self.registry,
        )
        self.registry.register(_StoredFigures(stats))

    def observe_call(self, kind: str, seconds: float, out: dict[str, Any]) -> None:
        """One tool call that ran, and its output item."""
        self.calls.labels(kind).inc()
        self.call_seconds.labels(kind).observe(seconds)
        entries = out.get("output")
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            if (entry.get("outcome") or {}).get("type") == "timeout":
                self.timeouts.inc()
            if OOM_MARK in str(entry.get("stderr") or ""):
                self.oom_kills.inc()
        if kind == "local_shell_call" and OOM_MARK in str(out.get("output") or ""):
            self.oom_kills.inc()
        if kind == "local_shell_call" and "Command timed out." in str(out.get("output") or ""):
            self.timeouts.inc()
