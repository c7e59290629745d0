"""Sandbox time metering, read back through the official openai SDK's admin usage and costs
calls, and what a crash (kill -9) of the server mid-request leaves billed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from api_helpers import host_pids, shell, wait_until
from test_responses_upstream import MODELS, LLMEnv, Reply, Seen, llm_env, say
from test_responses_upstream import shell as run

OR_AUTO = [{"type": "openrouter:shell"}]
PRICE = 0.0001  # the default, US$ per second


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


def admin_client(server: Any) -> openai.OpenAI:
    token = server.shellbox("keys", "create", "--admin")
    return openai.OpenAI(
        base_url=server.base_url, api_key="not-this-one", admin_api_key=token, max_retries=0
    )


def by_project(pages: Any, field: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for bucket in pages.data:
        for result in bucket.results:
            totals[result.project_id] = totals.get(result.project_id, 0) + getattr(result, field)
    return totals


def test_billed_time_and_the_admin_usage_and_costs_calls(env: LLMEnv) -> None:
    server = env.server
    started = int(time.time())
    tag = str(started)
    alpha, beta = f"alpha-{tag}", f"beta-{tag}"
    alpha_client = openai.OpenAI(
        base_url=server.base_url, api_key=server.create_key(alpha), max_retries=0
    )
    # Alpha: a request that creates its container and runs 2 s of commands is billed 30 s.
    env.llm.script(run("sleep 2"), say("slept"))
    first = alpha_client.responses.create(model=MODELS["chat"], input="nap", tools=OR_AUTO)
    # A second request on the warm container, with 5 s of commands: about 5 s.
    env.llm.script(run("sleep 2", "sleep 3"), say("slept again"))
    alpha_client.responses.create(
        model=MODELS["chat"], input="again", tools=OR_AUTO, previous_response_id=first.id
    )
    env.llm.done()
    # Beta: a direct call on a container it made; the first use of a new container pays the
    # minimum too.
    beta_key = server.create_key(beta)
    with httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {beta_key}"}, timeout=60
    ) as http:
        cid = http.post("/v1/containers", json={"name": "b"}).json()["id"]
        shell(http, cid, "sleep 1")
        shell(http, cid, "true")  # warm: milliseconds

    admin = admin_client(server)
    usage = admin.admin.organization.usage
    sessions = usage.code_interpreter_sessions(
        start_time=started - 60, group_by=["project_id"], project_ids=[alpha, beta]
    )
    assert sessions.object == "page" and not sessions.has_more
    assert by_project(sessions, "num_sessions") == {alpha: 1, beta: 1}

    costs = usage.costs(
        start_time=started - 60, group_by=["project_id", "line_item"], project_ids=[alpha, beta]
    )
    results = [r for b in costs.data for r in b.results]
    assert {r.line_item for r in results} == {"sandbox_seconds"}
    assert {r.quantity_unit for r in results} == {"duration_seconds"}
    seconds = by_project(costs, "quantity")
    assert 35 <= seconds[alpha] < 37, seconds  # 30 + about 5
    assert 30 <= seconds[beta] < 31, seconds  # 30 + milliseconds
    dollars = {r.project_id: r.amount.value for r in results}
    assert dollars[alpha] == pytest.approx(seconds[alpha] * PRICE)
    assert dollars[beta] == pytest.approx(seconds[beta] * PRICE)
    assert {r.amount.currency for r in results} == {"usd"}

    # Ungrouped: one result per bucket, both projects together.
    whole = usage.costs(start_time=started - 60, project_ids=[alpha, beta])
    [result] = [r for b in whole.data for r in b.results]
    assert result.project_id is None and result.line_item is None
    assert result.amount.value == pytest.approx((seconds[alpha] + seconds[beta]) * PRICE)

    # Costs of one API key: beta's only key (from `shellbox keys list`).
    [beta_key_id] = [
        line.split("\t")[0]
        for line in server.shellbox("keys", "list").splitlines()
        if line.split("\t")[1] == beta
    ]
    one_key = usage.costs(start_time=started - 60, api_key_ids=[beta_key_id])
    [result] = [r for b in one_key.data for r in b.results]
    assert result.amount.value == pytest.approx(seconds[beta] * PRICE)

    # A project key is refused, saying what is needed.
    project_admin = openai.OpenAI(
        base_url=server.base_url, api_key="x", admin_api_key=server.create_key(alpha), max_retries=0
    )
    with pytest.raises(openai.PermissionDeniedError) as refused:
        project_admin.admin.organization.usage.costs(start_time=started)
    assert "needs an admin key" in refused.value.message
    assert "shellbox keys create --admin" in refused.value.message
    with pytest.raises(openai.PermissionDeniedError):
        project_admin.admin.organization.usage.code_interpreter_sessions(start_time=started)


def test_usage_parameters_are_checked_and_paged(env: LLMEnv) -> None:
    admin = admin_client(env.server)
    usage = admin.admin.organization.usage
    now = int(time.time())
    # Minute buckets over the last 3 hours, 60 per page: 3 or 4 pages, linked by next_page.
    pages = []
    page = usage.code_interpreter_sessions(start_time=now - 3 * 3600, bucket_width="1m")
    pages.append(page)
    while page.has_more:
        assert page.next_page is not None
        page = usage.code_interpreter_sessions(
            start_time=now - 3 * 3600, bucket_width="1m", page=page.next_page
        )
        pages.append(page)
    starts = [b.start_time for p in pages for b in p.data]
    assert starts == list(range(starts[0], starts[0] + 60 * len(starts), 60))
    assert len(pages[0].data) == 60 and starts[0] <= now - 3 * 3600 < starts[0] + 60
    with pytest.raises(openai.BadRequestError) as bad:
        usage.costs(start_time=now, bucket_width="1h")  # type: ignore[arg-type]
    assert "bucket_width" in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        usage.code_interpreter_sessions(start_time=now, limit=5000)
    assert "limit" in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        usage.costs(start_time=now, group_by=["user_id"])
    assert "group_by" in bad.value.message


def test_a_call_that_wakes_a_sleeping_container_pays_the_minimum(
    server_factory: Callable[..., Any],
) -> None:
    server = server_factory(
        start=False,
        env={
            "SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "1",
            "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
        },
    )
    key = server.create_key("sleepy")
    admin = admin_client(server)
    server.start()
    since = int(time.time()) - 60
    with httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {key}"}, timeout=60
    ) as http:
        cid = http.post("/v1/containers", json={"name": "s"}).json()["id"]
        shell(http, cid, "true")  # new: 30 s
        shell(http, cid, "true")  # warm: milliseconds
        assert billed(admin, "sleepy", since)[0] < 31

        def asleep() -> bool:
            return bool(http.get(f"/v1/containers/{cid}").json()["status"] == "sleeping")

        assert wait_until(asleep, 30)
        shell(http, cid, "true")  # woken: 30 s again
    seconds, sessions = billed(admin, "sleepy", since)
    assert 60 <= seconds < 61 and sessions == 1


# -- a crash mid-request -------------------------------------------------------------------------


def billed(admin: openai.OpenAI, project: str, since: int) -> tuple[float, int]:
    """(billed seconds, sessions) of a project."""
    costs = admin.admin.organization.usage.costs(
        start_time=since, group_by=["project_id", "line_item"], project_ids=[project]
    )
    sessions = admin.admin.organization.usage.code_interpreter_sessions(
        start_time=since, group_by=["project_id"], project_ids=[project]
    )
    return (
        by_project(costs, "quantity").get(project, 0.0),
        int(by_project(sessions, "num_sessions").get(project, 0)),
    )


def test_kill_9_mid_request_loses_no_completed_request_and_bills_none_twice(
    env: LLMEnv, server_factory: Callable[..., Any]
) -> None:
    upstream = ["--upstream-base-url", env.llm.base_url, "--upstream-dialect", "chat"]
    server = server_factory(start=False, args=upstream)
    key = server.create_key("crash")
    admin = admin_client(server)
    server.start()
    since = int(time.time()) - 60
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    http = httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {key}"}, timeout=60
    )

    # Completed before the crash: a response (new container: 30 s) and a direct call.
    env.llm.script(run("sleep 1"), say("done"))
    done = client.responses.create(model="any", input="one", tools=OR_AUTO)
    cid = done.to_dict(warnings=False)["output"][0]["container_id"]
    shell(http, cid, "true")
    before, sessions = billed(admin, "crash", since)
    assert 30 <= before < 31 and sessions == 1

    # Cut off by kill -9 while its command runs: a streamed response and a direct call.
    marker = f"crashmark{time.time_ns()}"

    def cut_off(seen: Seen) -> Reply:
        return run(f"exec -a {marker}-r sleep 100")

    env.llm.script(cut_off)
    events: list[str] = []
    cut_id: list[str] = []

    def stream() -> None:
        try:
            with client.responses.create(
                model="any", input="two", tools=OR_AUTO, previous_response_id=done.id, stream=True
            ) as s:
                for e in s:
                    events.append(e.type)
                    if e.type == "response.created":
                        cut_id.append(e.response.id)
        except (openai.APIError, httpx.HTTPError):
            events.append("cut")

    def direct() -> None:
        try:
            shell(http, cid, f"exec -a {marker}-c sleep 100")
        except (httpx.HTTPError, AssertionError):
            events.append("call cut")

    threads = [threading.Thread(target=stream), threading.Thread(target=direct)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(host_pids(marker)) >= 2, 30), "the commands did not start"
    server.kill()
    for t in threads:
        t.join(30)
    env.llm.done()
    assert "response.completed" not in events

    # Restarted: what completed is billed once, what was cut off not at all. (``env``: the
    # same database in the PostgreSQL lane, where it is not in the state directory.)
    restarted = server_factory(state_dir=server.state_dir, env=dict(server.env), args=upstream)
    assert billed(admin_for(restarted, admin), "crash", since) == (before, sessions)
    # Billing and storing go together: the completed response is stored, the cut one is not.
    client2 = client.with_options(base_url=restarted.base_url)
    assert client2.responses.retrieve(done.id).status == "completed"
    with pytest.raises(openai.NotFoundError):
        client2.responses.retrieve(cut_id[0])
    # Work after the restart is billed as before (the container was restarted by recovery,
    # which is the server's doing: no minimum).
    http2 = httpx.Client(
        base_url=restarted.root_url, headers={"authorization": f"Bearer {key}"}, timeout=60
    )
    shell(http2, cid, "sleep 1")
    after, sessions = billed(admin_for(restarted, admin), "crash", since)
    assert 1 <= after - before < 2.5 and sessions == 1
    http.close()
    http2.close()


def admin_for(server: Any, admin: openai.OpenAI) -> openai.OpenAI:
    return admin.with_options(base_url=server.base_url)
