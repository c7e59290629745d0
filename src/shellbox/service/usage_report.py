"""The organization usage and costs pages, in OpenAI's shapes (``GET
/v1/organization/usage/code_interpreter_sessions`` and ``GET /v1/organization/costs``), built
from the metering records.

A container counts as a code interpreter session: a bucket's ``num_sessions`` is the number of
distinct containers that billed requests ending in it. Costs have one line item,
``sandbox_seconds``, whose ``quantity`` is the billed seconds (``quantity_unit``
``duration_seconds``), priced at ``metering.price_per_second_usd``.

Buckets are aligned to their width in UTC (a ``1d`` bucket starts at midnight) and cover
``[start_time, end_time)`` (``end_time``: now), empty ones included, as OpenAI lists them.
``page`` is the ``next_page`` cursor of the previous page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from shellbox.errors import InvalidRequest
from shellbox.service.metering import MeteringService
from shellbox.store.metering import BucketTotal, UsageQuery

WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
# bucket_width -> (default limit, max limit), as OpenAI documents them
SESSION_LIMITS = {"1d": (7, 31), "1h": (24, 168), "1m": (60, 1440)}
COSTS_LIMITS = (7, 180)
LINE_ITEM = "sandbox_seconds"
SESSION_GROUPS = ("project_id",)
COST_GROUPS = ("project_id", "line_item")
PAGE_PREFIX = "page_"

Report = Literal["sessions", "costs"]


@dataclass(frozen=True)
class ReportRequest:
    start_time: int
    end_time: int | None = None
    bucket_width: str = "1d"
    group_by: tuple[str, ...] = ()
    project_ids: tuple[str, ...] = ()
    line_items: tuple[str, ...] = ()
    api_key_ids: tuple[str, ...] = ()  # costs only
    limit: int | None = None
    page: str | None = None


def _fail(msg: str, param: str) -> InvalidRequest:
    return InvalidRequest(msg, param=param)


def _check(req: ReportRequest, report: Report) -> tuple[int, int, int]:
    """(origin, end, limit) in seconds and buckets, or a 400 naming the parameter."""
    widths = ("1d",) if report == "costs" else tuple(WIDTHS)
    if req.bucket_width not in widths:
        msg = f"bucket_width must be one of {', '.join(widths)}"
        raise _fail(msg, "bucket_width")
    groups = COST_GROUPS if report == "costs" else SESSION_GROUPS
    for g in req.group_by:
        if g not in groups:
            msg = f"group_by may hold {' and '.join(groups)} here; {g!r} is not recorded"
            raise _fail(msg, "group_by")
    width = WIDTHS[req.bucket_width]
    if req.start_time < 0:
        msg = "start_time must be a Unix time in seconds"
        raise _fail(msg, "start_time")
    end = req.end_time if req.end_time is not None else int(time.time()) + 1
    if end <= req.start_time:
        msg = "end_time must be after start_time"
        raise _fail(msg, "end_time")
    default, most = COSTS_LIMITS if report == "costs" else SESSION_LIMITS[req.bucket_width]
    limit = default if req.limit is None else req.limit
    if not 1 <= limit <= most:
        msg = f"limit must be between 1 and {most} for bucket_width {req.bucket_width}"
        raise _fail(msg, "limit")
    return req.start_time - req.start_time % width, end, limit


def _first_bucket(page: str | None, origin: int, width: int) -> int:
    if page is None:
        return 0
    raw = page.removeprefix(PAGE_PREFIX)
    if not raw.isdigit() or int(raw) < origin or (int(raw) - origin) % width:
        msg = "page must be the next_page value of a previous answer to the same query"
        raise _fail(msg, "page")
    return (int(raw) - origin) // width


def build(metering: MeteringService, req: ReportRequest, report: Report) -> dict[str, Any]:
    origin, end, limit = _check(req, report)
    width = WIDTHS[req.bucket_width]
    total = -(-(end - origin) // width)  # buckets, the last one partial
    first = _first_bucket(req.page, origin, width)
    count = max(0, min(limit, total - first))
    by_project = "project_id" in req.group_by
    lo = max(req.start_time, origin + first * width)
    hi = min(end, origin + (first + count) * width)
    totals: list[BucketTotal] = []
    wanted_line = not req.line_items or LINE_ITEM in req.line_items
    if count and wanted_line:
        totals = metering.usage.totals(
            UsageQuery(
                start_ms=lo * 1000,
                end_ms=hi * 1000,
                origin_ms=origin * 1000,
                width_ms=width * 1000,
                project_ids=req.project_ids,
                api_key_ids=req.api_key_ids,
                by_project=by_project,
            )
        )
    per_bucket: dict[int, list[BucketTotal]] = {}
    for t in totals:
        per_bucket.setdefault(t.bucket, []).append(t)
    data = []
    for n in range(first, first + count):
        start = origin + n * width
        results = [_result(metering, t, req, report) for t in per_bucket.get(n, [])]
        data.append(
            {"object": "bucket", "start_time": start, "end_time": start + width, "results": results}
        )
    more = first + count < total
    return {
        "object": "page",
        "data": data,
        "has_more": more,
        "next_page": f"{PAGE_PREFIX}{origin + (first + count) * width}" if more else None,
    }


def _result(
    metering: MeteringService, t: BucketTotal, req: ReportRequest, report: Report
) -> dict[str, Any]:
    if report == "sessions":
        return {
            "object": "organization.usage.code_interpreter_sessions.result",
            "num_sessions": t.sessions,
            "project_id": t.project,
        }
    by_line = "line_item" in req.group_by
    return {
        "object": "organization.costs.result",
        "amount": {"value": metering.cost_usd(t.billed_ms), "currency": "usd"},
        "line_item": LINE_ITEM if by_line else None,
        "project_id": t.project,
        "quantity": t.billed_ms / 1000 if by_line else None,
        "quantity_unit": "duration_seconds" if by_line else None,
        "api_key_id": None,
        "api_source": None,
    }
