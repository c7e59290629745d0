"""/metrics: the Prometheus text format, parsed by prometheus_client's own parser, with its
figures moving as work is done."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from api_helpers import shell
from prometheus_client.parser import text_string_to_metric_families
from test_responses_upstream import MODELS, LLMEnv, llm_env, say
from test_responses_upstream import shell as run


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(root_url: str, **headers: str) -> Samples:
    r = httpx.get(f"{root_url}/metrics", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_parse_and_move(env: LLMEnv) -> None:
    root = env.server.root_url
    before = scrape(root)
    for state in ("running", "sleeping", "expired"):
        assert ("shellbox_containers", (("state", state),)) in before
    for decision in ("allowed", "refused"):
        assert ("shellbox_egress_requests_total", (("decision", decision),)) in before
    assert ("shellbox_oom_kills_total", ()) in before

    project = f"metrics-{time.time_ns()}"
    key = env.server.create_key(project)
    with httpx.Client(
        base_url=root, headers={"authorization": f"Bearer {key}"}, timeout=60
    ) as http:
        cid = http.post("/v1/containers", json={"name": "m"}).json()["id"]
        shell(http, cid, "echo one", "echo two")
        out = shell(http, cid, "sleep 5", timeout_ms=300)
        assert out["output"][0]["outcome"] == {"type": "timeout"}
        env.llm.script(run("true"), say("ok"))
        r = http.post(
            "/v1/responses",
            json={"model": MODELS["chat"], "input": "x", "tools": [{"type": "openrouter:shell"}]},
        )
        assert r.status_code == 200, r.text
        env.llm.done()
    after = scrape(root)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("shellbox_container_creates_total") == 2  # the call's and the response's
    assert moved("shellbox_calls_total", type="shell_call") == 3
    assert moved("shellbox_call_duration_seconds_count", type="shell_call") == 3
    assert moved("shellbox_call_duration_seconds_sum", type="shell_call") >= 0.3
    assert moved("shellbox_commands_timed_out_total") == 1
    assert moved("shellbox_containers", state="running") >= 2
    # Both containers were new: 30 s each, billed to the project.
    assert 60 <= value(after, "shellbox_sandbox_seconds_total", project=project) < 62


def outside_address() -> str:
    """An address of this machine that is not loopback (a peer there is not local)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    raise AssertionError(f"no non-loopback IPv4 address here: {out.stdout}")


def test_metrics_off_loopback_need_an_admin_key(server_factory: Callable[..., Any]) -> None:
    server = server_factory(start=False, args=["--host", "0.0.0.0"])
    project_key = server.create_key("p")
    admin_key = server.shellbox("keys", "create", "--admin")
    server.start()
    outside = f"http://{outside_address()}:{server.port}"
    assert scrape(server.root_url)  # loopback: no key needed
    r = httpx.get(f"{outside}/metrics", timeout=30)
    assert r.status_code == 401
    r = httpx.get(f"{outside}/metrics", headers={"authorization": f"Bearer {project_key}"})
    assert r.status_code == 403
    assert "needs an admin key" in r.json()["error"]["message"]
    assert scrape(outside, authorization=f"Bearer {admin_key}")
