"""The operator console in a real browser: Debian's chromium, headless, driven by Playwright
(its own browsers are never downloaded). Screenshots go to the test's tmp_path (printed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run ./scripts/setup.sh (it installs chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def shot(page: Page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def log_in(page: Page, root: str, key: str) -> None:
    page.goto(f"{root}/console")
    expect(page).to_have_url(f"{root}/console/login")
    page.fill("#key", key)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{root}/console")


def run(http: httpx.Client, cid: str, *commands: str) -> None:
    item = {"type": "shell_call", "call_id": "c1", "action": {"commands": list(commands)}}
    r = http.post(f"/v1/containers/{cid}/calls", json=item)
    assert r.status_code == 200, r.text
    assert all(o["outcome"]["exit_code"] == 0 for o in r.json()["output"]), r.text


def test_log_in_list_open_download_and_type_in_the_terminal(
    browser: Browser, server: Any, api_key: str, http: httpx.Client, cid: str, tmp_path: Path
) -> None:
    root = server.root_url
    run(
        http,
        cid,
        "echo 'console download test' > report.txt",
        "nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &",
    )
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.goto(f"{root}/console")
    shot(page, tmp_path, "login")
    log_in(page, root, api_key)

    # The session is a cookie the page's scripts cannot read; the key is kept nowhere.
    [cookie] = [c for c in context.cookies() if c["name"] == "shellbox_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert api_key not in cookie["value"]
    stored = "Object.keys(localStorage).length + Object.keys(sessionStorage).length"
    assert page.evaluate(stored) == 0
    assert page.evaluate("document.cookie") == ""

    row = page.locator("#containers tr", has_text=cid)
    expect(row).to_contain_text("running")
    expect(row).to_contain_text("1G")
    paint = page.evaluate("performance.getEntriesByType('paint').map(e => [e.name, e.startTime])")
    print(f"container list paint timings (ms): {paint}")
    shot(page, tmp_path, "containers")

    row.locator("a").first.click()
    expect(page).to_have_url(f"{root}/console/containers/{cid}")
    files = page.locator("#files")
    expect(files).to_contain_text("/mnt/data/report.txt")
    with page.expect_download() as download:
        files.locator("tr", has_text="report.txt").locator("a").click()
    assert download.value.suggested_filename == "report.txt"
    assert Path(download.value.path()).read_text() == "console download test\n"

    page.click("#open-terminal")
    expect(page.locator("#terminal-state")).to_have_text("connected", timeout=20_000)
    page.keyboard.type("echo hi\n")
    page.wait_for_function(
        """() => [...document.querySelectorAll('#terminal .xterm-rows > div')]
                 .some(row => row.textContent.trim() === 'hi')""",
        timeout=20_000,
    )
    shot(page, tmp_path, "terminal")

    page.fill("input[name=port]", "8000")
    page.click("form.inline button[type=submit]")
    link = page.locator("#new-link a")
    expect(link).to_contain_text("/v1/port-links/")
    href = link.get_attribute("href")
    assert href is not None
    shot(page, tmp_path, "container")
    service = context.new_page()
    service.goto(href)
    expect(service.locator("body")).to_contain_text("report.txt")  # http.server's listing
    shot(service, tmp_path, "port-link")
    context.close()


def test_forms_need_the_session_token_and_the_consoles_origin(
    browser: Browser, server: Any, api_key: str, cid: str
) -> None:
    root = server.root_url
    context = browser.new_context()
    page = context.new_page()
    log_in(page, root, api_key)
    session = {c["name"]: c["value"] for c in context.cookies()}
    context.close()
    url = f"{root}/console/containers/{cid}/links"
    with httpx.Client(cookies=session) as c:
        no_token = c.post(url, data={"port": "8000"}, headers={"origin": root})
        assert no_token.status_code == 403, no_token.text
        assert "stale" in no_token.json()["error"]["message"]
        elsewhere = c.post(url, data={"port": "8000"}, headers={"origin": "http://evil.test"})
        assert elsewhere.status_code == 403, elsewhere.text
        token = c.post(f"{root}/console/containers/{cid}/pty-token", headers={"origin": root})
        assert token.status_code == 403  # no X-CSRF-Token
        # Logging in from another origin's page is refused too.
        login = c.post(
            f"{root}/console/login", data={"key": api_key}, headers={"origin": "http://evil.test"}
        )
        assert login.status_code == 403
    assert httpx.get(f"{root}/console", cookies=session).status_code == 200


def test_a_wrong_key_is_refused_and_nothing_is_shown_without_a_session(
    browser: Browser, server: Any, cid: str
) -> None:
    root = server.root_url
    assert httpx.get(f"{root}/console").headers.get("location") == "/console/login"
    assert httpx.get(f"{root}/console/containers/{cid}").status_code == 303
    page = browser.new_page()
    page.goto(f"{root}/console/login")
    page.fill("#key", "sk-shellbox-not-a-key")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("invalid API key")
    page.close()


def test_names_from_clients_are_escaped(
    browser: Browser, server: Any, api_key: str, client: Any
) -> None:
    hostile = client.containers.create(name='<img src=x onerror="document.title=1">')
    try:
        page = browser.new_page()
        log_in(page, server.root_url, api_key)
        row = page.locator("#containers tr", has_text=hostile.id)
        expect(row).to_contain_text('<img src=x onerror="document.title=1">')
        assert page.locator("#containers img").count() == 0
        page.close()
    finally:
        client.containers.delete(hostile.id)


def test_admin_sees_every_project_and_usage(
    browser: Browser, server: Any, api_key: str, cid: str, tmp_path: Path
) -> None:
    admin = server.shellbox("keys", "create", "--project", "ops", "--admin")
    root = server.root_url
    page = browser.new_page()
    log_in(page, root, admin)
    row = page.locator("#containers tr", has_text=cid)
    expect(row).to_contain_text("test")  # the project column
    page.goto(f"{root}/console/containers/{cid}")
    expect(page.locator("h2", has_text="Files")).to_be_visible()
    page.click("text=Usage and costs")
    expect(page.locator("h1")).to_have_text("Usage and costs")
    shot(page, tmp_path, "usage")
    page.close()

    project = browser.new_page()
    log_in(project, root, api_key)
    assert project.locator("text=Usage and costs").count() == 0
    project.goto(f"{root}/console/usage")
    expect(project.locator("main")).to_contain_text("admin key")
    project.close()


def test_revoking_the_key_ends_its_sessions(browser: Browser, server: Any) -> None:
    key = server.create_key("console-revoked")
    context = browser.new_context()
    page = context.new_page()
    log_in(page, server.root_url, key)
    key_id = next(
        line.split()[0]
        for line in server.shellbox("keys", "list").splitlines()
        if "console-revoked" in line
    )
    server.shellbox("keys", "revoke", key_id)
    time.sleep(0.1)
    page.goto(f"{server.root_url}/console")
    expect(page).to_have_url(f"{server.root_url}/console/login")
    context.close()


def console_login(c: httpx.Client, root: str, key: str) -> None:
    r = c.post("/console/login", data={"key": key}, headers={"origin": root})
    assert r.status_code == 303, r.text


def test_the_terminal_token_opens_the_pty_of_its_container_only(
    server: Any, api_key: str, cid: str, client: Any
) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    root = server.root_url
    other = client.containers.create(name="other")
    try:
        with httpx.Client(base_url=root) as c:
            console_login(c, root, api_key)
            page = c.get(f"/console/containers/{cid}").text
            csrf = re.search(r'data-csrf="([0-9a-f]+)"', page)
            assert csrf is not None
            r = c.post(
                f"/console/containers/{cid}/pty-token",
                headers={"origin": root, "x-csrf-token": csrf.group(1)},
            )
            assert r.status_code == 200, r.text
            token = r.json()["token"]
        ws_root = root.replace("http://", "ws://")
        with ws_connect(f"{ws_root}/v1/containers/{cid}/pty?token={token}") as ws:
            ws.send(b"echo from-$((6*7))\n")
            seen = b""
            while b"from-42" not in seen:
                message = ws.recv(timeout=20)
                seen += message if isinstance(message, bytes) else b""
        for url in (
            f"{ws_root}/v1/containers/{other.id}/pty?token={token}",  # another container
            f"{ws_root}/v1/containers/{cid}/pty?token={token[:-3]}xyz",  # altered
        ):
            with pytest.raises(InvalidStatus) as refused:
                ws_connect(url)
            assert refused.value.response.status_code == 401
    finally:
        client.containers.delete(other.id)
