"""The console's HTML, rendered on the server: plain functions from values to strings.

Every value that comes from a client, a sandbox or the database goes through ``e`` (HTML
escaping, quotes included) before it is put in a page; nothing is rendered any other way.
Pages load one stylesheet and, on a container's page only, the terminal's scripts (deferred),
so the first paint needs nothing but the HTML and ``console.css``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from shellbox import __version__
from shellbox.api.console.session import Operator
from shellbox.sandbox.base import MEMORY_LIMIT_BYTES
from shellbox.store.records import ContainerFileRecord, ContainerRecord

STATIC = "/console/static"
XTERM = f"{STATIC}/vendor/xterm-5.5.0"
FIT = f"{STATIC}/vendor/xterm-addon-fit-0.10.0"


def e(value: object) -> str:
    return escape(str(value), quote=True)


def ago(then: int, now: float | None = None) -> str:
    """``3 min ago``: the age of a Unix time, for people."""
    seconds = max(0, int((now or time.time()) - then))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def when(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def size(n: int | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def layout(
    title: str,
    body: str,
    who: Operator | None = None,
    scripts: Sequence[str] = (),
    styles: Sequence[str] = (),
) -> str:
    head = "".join(f'<link rel="stylesheet" href="{e(s)}">' for s in styles)
    head += "".join(f'<script defer src="{e(s)}"></script>' for s in scripts)
    nav = ""
    if who is not None:
        usage = '<a href="/console/usage">Usage and costs</a>' if who.admin else ""
        scope = "all projects (admin)" if who.admin else f"project {e(who.project)}"
        nav = (
            '<nav><a href="/console">Containers</a>'
            f"{usage}</nav>"
            f'<div class="who"><span>{scope}</span>'
            '<form method="post" action="/console/logout">'
            f'<input type="hidden" name="csrf" value="{e(who.csrf)}">'
            '<button class="link" type="submit">Log out</button></form></div>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · shellbox</title>"
        f'<link rel="stylesheet" href="{STATIC}/console.css?v={e(__version__)}">{head}</head>'
        f'<body><header class="top"><a class="brand" href="/console">shellbox</a>{nav}</header>'
        f"<main>{body}</main></body></html>"
    )


def login_page(error: str | None = None) -> str:
    problem = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    body = (
        '<section class="card narrow"><h1>Operator console</h1>'
        "<p>Log in with a project key, or an admin key to see every project.</p>"
        f"{problem}"
        '<form method="post" action="/console/login" class="stack">'
        '<label for="key">API key</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required '
        'placeholder="sk-shellbox-…" autofocus>'
        '<button type="submit">Log in</button></form>'
        '<p class="hint">The key is not kept in the browser: the console holds a signed '
        "session cookie instead, which ends when the key is revoked.</p></section>"
    )
    return layout("Log in", body)


def status_badge(status: str) -> str:
    return f'<span class="badge {e(status)}">{e(status)}</span>'


def memory_cell(used: int | None, limit: str) -> str:
    total = MEMORY_LIMIT_BYTES.get(limit, 0)
    pct = min(100, round(100 * used / total)) if used is not None and total else 0
    return (
        f'<div class="mem"><span>{e(size(used))} / {e(limit.upper())}</span>'
        f'<span class="bar"><span style="width:{pct}%"></span></span></div>'
    )


def containers_page(
    who: Operator, records: Sequence[ContainerRecord], memory: dict[str, int | None]
) -> str:
    now = time.time()
    rows = []
    for r in records:
        project = f"<td>{e(r.project)}</td>" if who.admin else ""
        rows.append(
            "<tr>"
            f'<td><a href="/console/containers/{e(r.id)}">{e(r.name or r.id)}</a>'
            f'<div class="sub mono">{e(r.id)}</div></td>{project}'
            f"<td>{status_badge(r.status)}</td>"
            f"<td>{memory_cell(memory.get(r.id), r.memory_limit)}</td>"
            f'<td title="{e(when(r.created_at))}">{e(ago(r.created_at, now))}</td>'
            f'<td title="{e(when(r.last_active_at))}">{e(ago(r.last_active_at, now))}</td>'
            "</tr>"
        )
    head_project = "<th>Project</th>" if who.admin else ""
    table = (
        '<table class="list" id="containers"><thead><tr><th>Container</th>'
        f"{head_project}<th>Status</th><th>Memory</th><th>Age</th><th>Last activity</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No containers yet.</p>'
    )
    count = f'<span class="count">{len(records)}</span>'
    body = f'<div class="title"><h1>Containers</h1>{count}</div>{table}'
    return layout("Containers", body, who)


@dataclass(frozen=True)
class NewLink:
    url: str
    port: int
    expires_at: int


def container_page(
    who: Operator,
    r: ContainerRecord,
    used: int | None,
    files: Iterable[ContainerFileRecord],
    egress: Iterable[dict[str, Any]],
    new_link: NewLink | None = None,
    link_error: str | None = None,
) -> str:
    now = time.time()
    cid = e(r.id)
    facts = [
        ("Status", status_badge(r.status)),
        ("Project", e(r.project)),
        ("Memory", memory_cell(used, r.memory_limit)),
        ("Network", e(r.network_policy.get("type", "disabled"))),
        ("Created", f'<span title="{e(when(r.created_at))}">{e(ago(r.created_at, now))}</span>'),
        (
            "Last activity",
            f'<span title="{e(when(r.last_active_at))}">{e(ago(r.last_active_at, now))}</span>',
        ),
        ("Expires after", f"{e(r.expires_after_minutes)} min idle"),
    ]
    overview = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    file_rows = "".join(
        f'<tr><td class="mono">{e(f.container_path)}</td><td>{e(size(f.bytes))}</td>'
        f"<td>{e(f.source)}</td>"
        f'<td><a class="button small" download href="/console/containers/{cid}/files/'
        f'{e(f.id)}">Download</a></td></tr>'
        for f in files
    )
    files_html = (
        '<table class="list" id="files"><thead><tr><th>Path</th><th>Size</th><th>Source</th>'
        f"<th></th></tr></thead><tbody>{file_rows}</tbody></table>"
        if file_rows
        else '<p class="empty">No files in /mnt/data.</p>'
    )
    egress_rows = "".join(
        f'<tr><td title="{e(when(int(ev["created_at"])))}">{e(ago(int(ev["created_at"]), now))}'
        f'</td><td>{e(ev["method"])}</td><td class="mono">{e(ev["host"])}:{e(ev["port"])}'
        f"{e(ev['path'] or '')}</td><td>{status_badge(str(ev['decision']))}</td>"
        f"<td>{e(ev['status_code'] if ev['status_code'] is not None else '–')}</td></tr>"
        for ev in egress
    )
    egress_html = (
        '<table class="list" id="egress"><thead><tr><th>When</th><th>Method</th>'
        "<th>Destination</th><th>Decision</th><th>Status</th></tr></thead>"
        f"<tbody>{egress_rows}</tbody></table>"
        if egress_rows
        else '<p class="empty">No egress attempts recorded.</p>'
    )
    link_html = ""
    if new_link is not None:
        link_html = (
            f'<div class="notice" id="new-link"><div>Link to port {e(new_link.port)}, valid '
            f"until {e(when(new_link.expires_at))}:</div>"
            f'<a class="mono" target="_blank" rel="noopener noreferrer" '
            f'href="{e(new_link.url)}">{e(new_link.url)}</a></div>'
        )
    if link_error:
        link_html = f'<p class="error" role="alert">{e(link_error)}</p>'
    ports_html = (
        f"{link_html}"
        f'<form method="post" action="/console/containers/{cid}/links" class="inline">'
        f'<input type="hidden" name="csrf" value="{e(who.csrf)}">'
        '<label>Port <input name="port" type="number" min="1" max="65535" required '
        'placeholder="8000"></label>'
        '<label>Valid for <select name="expires_in">'
        '<option value="900">15 minutes</option><option value="3600" selected>1 hour</option>'
        '<option value="28800">8 hours</option><option value="86400">1 day</option>'
        '</select></label><button type="submit">Create link</button></form>'
        '<p class="hint">A link opens the HTTP or WebSocket service listening on '
        "127.0.0.1:PORT inside the container, without a key, until it expires.</p>"
    )
    terminal_html = (
        f'<div class="terminal-bar"><button id="open-terminal" type="button">Open terminal'
        '</button><span id="terminal-state" class="hint"></span></div>'
        f'<div id="terminal" data-container="{cid}" data-csrf="{e(who.csrf)}" '
        f'data-token-url="/console/containers/{cid}/pty-token"></div>'
    )
    body = (
        f'<div class="title"><h1>{e(r.name or r.id)}</h1><span class="mono sub">{cid}</span></div>'
        f'<div class="grid"><section class="card"><h2>Overview</h2><dl>{overview}</dl></section>'
        f'<section class="card"><h2>Exposed ports</h2>{ports_html}</section></div>'
        f'<section class="card"><h2>Terminal</h2>{terminal_html}</section>'
        f'<section class="card"><h2>Files</h2>{files_html}</section>'
        f'<section class="card"><h2>Egress audit</h2>{egress_html}</section>'
    )
    return layout(
        r.name or r.id,
        body,
        who,
        scripts=(f"{XTERM}/xterm.js", f"{FIT}/addon-fit.js", f"{STATIC}/terminal.js"),
        styles=(f"{XTERM}/xterm.css",),
    )


def usage_page(
    who: Operator,
    days: Sequence[dict[str, Any]],
    totals: dict[str, tuple[int, float]],
    price: float,
) -> str:
    total_rows = "".join(
        f"<tr><td>{e(project)}</td><td>{sessions}</td><td>${cost:.4f}</td></tr>"
        for project, (sessions, cost) in sorted(totals.items())
    )
    day_rows = "".join(
        f"<tr><td>{e(time.strftime('%Y-%m-%d', time.gmtime(int(d['start_time']))))}</td>"
        f"<td>{e(d['project'])}</td><td>{e(d['sessions'])}</td>"
        f"<td>${float(d['cost']):.4f}</td></tr>"
        for d in days
    )
    body = (
        '<div class="title"><h1>Usage and costs</h1><span class="sub">last 7 days, UTC</span>'
        "</div>"
        '<section class="card"><h2>By project</h2>'
        + (
            '<table class="list" id="usage-totals"><thead><tr><th>Project</th>'
            f"<th>Sessions</th><th>Cost</th></tr></thead><tbody>{total_rows}</tbody></table>"
            if total_rows
            else '<p class="empty">No metered use in the last 7 days.</p>'
        )
        + f'<p class="hint">Sandbox time at ${price:g} per second.</p></section>'
        '<section class="card"><h2>By day</h2>'
        + (
            '<table class="list" id="usage-days"><thead><tr><th>Day</th><th>Project</th>'
            f"<th>Sessions</th><th>Cost</th></tr></thead><tbody>{day_rows}</tbody></table>"
            if day_rows
            else '<p class="empty">Nothing to show.</p>'
        )
        + "</section>"
    )
    return layout("Usage and costs", body, who)


def error_page(who: Operator | None, status: int, message: str) -> str:
    body = (
        f'<section class="card narrow"><h1>{status}</h1><p>{e(message)}</p>'
        '<p><a href="/console">Back to the containers</a></p></section>'
    )
    return layout(f"Error {status}", body, who)
