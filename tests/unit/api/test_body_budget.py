"""The body budget: first come first served, a bounded wait, nothing leaked by a waiter that
gives up or is cancelled."""

from __future__ import annotations

import asyncio

from shellbox.api.body_budget import BodyBudget


async def test_bodies_past_the_budget_wait_in_arrival_order() -> None:
    budget = BodyBudget(100, wait_s=5)
    assert await budget.acquire(60)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        assert await budget.acquire(size)
        order.append(name)

    first = asyncio.create_task(take("first", 70))
    await asyncio.sleep(0)
    second = asyncio.create_task(take("second", 10))  # fits now, but queues behind "first"
    await asyncio.sleep(0.05)
    assert order == []
    budget.release(60)
    await asyncio.gather(first, second)
    assert order == ["first", "second"]
    assert budget.used == 80


async def test_a_waiter_gives_up_after_wait_s_and_leaves_nothing_behind() -> None:
    budget = BodyBudget(100, wait_s=0.1)
    assert await budget.acquire(90)
    assert not await budget.acquire(20)
    cancelled = asyncio.create_task(BodyBudget.acquire(budget, 20))
    await asyncio.sleep(0.01)
    cancelled.cancel()  # the client left while it waited
    await asyncio.gather(cancelled, return_exceptions=True)
    budget.release(90)
    assert budget.used == 0
    assert await budget.acquire(100)


async def test_a_body_larger_than_the_budget_goes_through_alone() -> None:
    budget = BodyBudget(100, wait_s=0.1)
    assert await budget.acquire(500)
    assert not await budget.acquire(1)
    budget.release(500)
    assert budget.used == 0
