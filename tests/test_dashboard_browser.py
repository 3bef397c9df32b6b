"""The dashboard's board in a real headless Chromium, over the demo's whole life with its Gitea emulator still up."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import HANG_S

CHROMIUM = Path(os.environ.get("FOREMAN_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FOREMAN_CHROMEDRIVER", "/usr/bin/chromedriver"))
TOKEN = "browser-dashboard-token-0123456789"
# Where the screenshots go: a temporary folder, so a test run never changes the checkout; the ones in
# docs/screenshots/ (shown by the README) are refreshed with FOREMAN_SCREENSHOTS_DIR=docs/screenshots.
SHOTS = Path(os.environ.get("FOREMAN_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "foreman-screenshots")
WIDE, PHONE = 1400, 390


def _missing() -> str | None:
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        return (f"no Chromium at {CHROMIUM} / {CHROMEDRIVER} (apt-get install chromium chromium-driver; "
                ".ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""), pytest.mark.process,
              pytest.mark.browser]

HOSTILE = '<img src=x onerror="document.title=1">'
BLOCKED_STATE = """## Canonical Issue State

STATE: blocked
WHO_IS_NEXT: human
NEXT_ACTION: Decide which shade of blue the widget takes
NEXT_PROMPT: none
WHAT_HAPPENED: The design team has not picked the shade
WHY: The acceptance names no colour value
RELATED_PRS: none
BLOCKERS: the shade of blue is undecided
VALIDATION: none
LAST_UPDATED_BY: maintainer
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="foreman-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic", f"--user-data-dir={profile}", f"--window-size={WIDE},900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# --- the browser's side (blocking: each runs in a thread, so the emulator in the test's loop keeps answering) ---------
def _shot(driver: Any, name: str, width: int, *, whole: bool = False) -> Path:
    """A screenshot at ``width``: the first screen (900 high; a phone's 844), or the whole page with ``whole``."""
    height = 844 if width == PHONE else 900
    if whole:
        height = min(int(driver.execute_script("return Math.max(document.body.scrollHeight, 400)")) + 120, 6000)
    driver.set_window_size(width, height)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000, path
    return path


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.CSS_SELECTOR, css)
    assert element.is_displayed(), css
    return str(element.text)


def _open(driver: Any, url: str, width: int = WIDE) -> None:
    driver.set_window_size(width, 844 if width == PHONE else 900)
    driver.get(url)


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _in_flow(column_of: Callable[[dict[str, Any], int], str | None], n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda doc: column_of(doc, n) in ("in-progress", "ready")


# --- the test ---------------------------------------------------------------------------------------------------------
async def test_the_board_answers_the_operator_through_the_demo(browser: Any) -> None:
    """Issue 34, item 1: the demo's whole life (its emulator kept up, `foreman serve` with ``[dashboard] token``), then
    what an operator does next: two more issues (one leased, one waiting), a blocked one (who is next: human), a
    refused `/merge`, a bad signature, a signed delivery for a repository not served, a phone, Gitea down. Each
    state is checked by the text the operator must see on the first screen and by a screenshot (docs/screenshots/
    with FOREMAN_SCREENSHOTS_DIR; never of a hostile-input fixture: the hostile title comes last, unphotographed)."""
    import bot.demo
    from bot.demo_harness import AUTHOR, MAINTAINER, Printer

    root = bot.demo.scratch_root("foreman-board-")
    config = {"dashboard": {"token": TOKEN}, "gitea": {"probe_interval_s": 0.5}}
    try:
        async with bot.demo.open_harness(root, life=True, config=config) as h:
            await bot.demo._loop(h, Printer(io.StringIO()), HANG_S)
            url = h.webhook_url.removesuffix("/webhook")
            board = f"{url}/dashboard"

            async def api() -> dict[str, Any]:
                async with h.http.get(f"{url}/dashboard/api/overview",
                                      headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                    assert resp.status == 200, await resp.text()
                    doc: dict[str, Any] = await resp.json()
                    return doc

            async def until(what: str, probe: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
                deadline = time.monotonic() + HANG_S
                while True:
                    doc = await api()
                    if probe(doc):
                        return doc
                    assert time.monotonic() < deadline, (what, json.dumps(doc, default=str)[:4000])
                    await asyncio.sleep(0.3)

            def card(doc: dict[str, Any], number: int) -> dict[str, Any] | None:
                return next((c for col in doc["flow"]["columns"] for c in col["cards"]
                             if c["issue_number"] == number), None)

            def column_of(doc: dict[str, Any], number: int) -> str | None:
                found = card(doc, number)
                return None if found is None else str(found["column"])

            async def in_browser(fn: Callable[..., Any], *args: Any) -> Any:
                return await asyncio.to_thread(fn, *args)

            # The token once: the cookie is set, the address bar is clean.
            def login() -> None:
                browser.get(board)
                assert "not_authorized" in browser.page_source
                browser.get(f"{board}?token={TOKEN}")
                assert browser.current_url == board
                assert browser.title == "foreman dashboard"

            await in_browser(login)

            # Two more issues: the author takes the first; the second waits for an idle author.
            await h.api(MAINTAINER, "POST", "/hooks", {
                "type": "gitea", "active": True, "events": ["issue_comment"],
                "config": {"url": h.webhook_url, "content_type": "json", "secret": h.webhook_secret}})
            numbers: dict[str, int] = {}
            for key, title in (("dark", "Add a dark mode toggle"), ("docs", "Document the widget API"),
                               ("shade", "Pick the widget's shade of blue")):
                issue = await h.api(MAINTAINER, "POST", "/issues", {"title": title, "body": f"{title}."})
                numbers[key] = int(issue["number"])
            dark, docs, shade = numbers["dark"], numbers["docs"], numbers["shade"]
            labels = {label["name"]: label["id"] for label in await h.api(MAINTAINER, "GET", "/labels")}
            for n in (dark, docs):
                await h.api(MAINTAINER, "POST", f"/issues/{n}/labels", {"labels": [labels["status:ready"]]})
                await until(f"#{n} leased or waiting", _in_flow(column_of, n))
            doc = await until("healthy, #dark in progress and #docs ready", lambda d: bool(
                d["health"]["ok"] and column_of(d, dark) == "in-progress" and column_of(d, docs) == "ready"
                and column_of(d, 1) == "done"))

            def healthy() -> None:
                _open(browser, board)
                banner = _text(browser, '[data-test="health-banner"]')
                assert banner.startswith("Healthy"), banner
                health = _text(browser, "#health")
                assert "Gitea: ok" in health and "reachable as foreman-bot" in health, health
                assert "catch-up: ok" in health and "loops: ok" in health and "outbox: ok" in health, health
                flow = _text(browser, "#board")
                for title in ("Ready", "In progress", "Review", "Merge", "Done today"):
                    assert title in flow, (title, flow)
                progress = _text(browser, '[data-column="in-progress"]')
                assert f"#{dark} Add a dark mode toggle" in progress and AUTHOR in progress, progress
                assert "heartbeat" in progress and "held by" in progress and "waits for" in progress, progress
                ready = _text(browser, '[data-column="ready"]')
                assert f"#{docs} Document the widget API" in ready and "waits for" in ready, ready
                done = _text(browser, '[data-column="done"]')
                assert "#1 Make the widget blue" in done, done
                assert _text(browser, "#needs") == "Needs a person now\nnothing needs a person now"
                # Relative times, the absolute time to the second on hover; never microseconds.
                stamp = browser.execute_script(
                    "var t=document.querySelector('#board time');return [t.textContent,t.title,t.dateTime]")
                assert stamp[0].endswith("ago") or stamp[0] == "just now", stamp
                assert stamp[1].endswith(" UTC") and len(stamp[2]) == len("2026-01-01T00:00:00Z"), stamp
                assert not [t for t in browser.execute_script(
                    "return [...document.querySelectorAll('main')].map(m => m.innerText)")[0].split()
                    if t.count(":") == 2 and "." in t.rsplit(":", 1)[-1]], "microseconds shown"
                _shot(browser, "dashboard.png", WIDE)

            await in_browser(healthy)
            leased = card(doc, dark)
            assert leased is not None and leased["holder"] == AUTHOR and leased["heartbeat_s"] is not None

            # A blocked issue: who is next is a person, and the board says so on its first screen.
            await h.api(MAINTAINER, "POST", f"/issues/{shade}/comments", {"body": BLOCKED_STATE})
            await until("#shade blocked",
                        lambda d: column_of(d, shade) == "blocked" and bool(d["attention"]["blocked"]))

            def blocked() -> None:
                _open(browser, board)
                needs = _text(browser, "#needs")
                assert f"#{shade} Pick the widget's shade of blue is blocked" in needs, needs
                assert "Decide which shade of blue the widget takes" in needs and "who is next: human" in needs, needs
                assert _text(browser, "#needs h2").replace("\n", " ") == "Needs a person now 1", needs
                column = _text(browser, '[data-column="blocked"]')
                assert f"#{shade}" in column and "the shade of blue is undecided" in column, column
                _shot(browser, "dashboard-blocked.png", WIDE)

            await in_browser(blocked)

            # A refused command: the author may not merge; the board shows who, what and why.
            await h.api(AUTHOR, "POST", f"/issues/{docs}/comments", {"body": "/merge"})
            doc = await until("the /merge refused", lambda d: bool(d["attention"]["refused_commands"]))
            (refusal,) = doc["attention"]["refused_commands"]
            assert refusal["command"] == "/merge" and refusal["sender"] == AUTHOR and refusal["error"], refusal

            # A bad signature, and a signed delivery for a repository foreman does not serve (ignored, with why).
            body = json.dumps({"action": "opened", "number": 5, "issue": {"number": 5, "labels": [], "state": "open"},
                               "repository": {"full_name": "elsewhere/other", "name": "other",
                                              "owner": {"login": "elsewhere"}},
                               "sender": {"login": "maintainer"}}).encode()
            headers = {"Content-Type": "application/json", "X-Gitea-Event": "issues"}
            bad = {**headers, "X-Gitea-Delivery": "board-bad-signature", "X-Gitea-Signature": "0" * 64}
            assert await asyncio.to_thread(_post, h.webhook_url, body, bad) == 401
            good = {**headers, "X-Gitea-Delivery": "board-foreign-delivery",
                    "X-Gitea-Signature": hmac.new(h.webhook_secret.encode(), body, hashlib.sha256).hexdigest()}
            assert await asyncio.to_thread(_post, h.webhook_url, body, good) == 202
            await until("the foreign delivery ignored", lambda d: any(
                x["delivery"] == "board-foreign-delivery" for x in d["attention"]["ignored_deliveries"]))

            def refused() -> None:
                _open(browser, board)
                commands = _text(browser, '[data-test="refused-commands"]')
                assert "/merge" in commands and AUTHOR in commands and refusal["error"] in commands, commands
                door = _text(browser, '[data-test="refused-deliveries"]')
                assert "401 bad_signature" in door and "webhook secret" in door, door
                assert "1 \u00d7 401 bad_signature" in _text(browser, "#refused")
                ignored = _text(browser, '[data-test="ignored-deliveries"]')
                assert "board-foreign-delivery" in ignored and "elsewhere/other" in ignored, ignored
                # The delivery that carried the command says it was refused, not just "done".
                deliveries = _text(browser, '[data-test="deliveries"]')
                assert "/merge refused" in deliveries, deliveries

            await in_browser(refused)

            # The page refreshes itself and keeps the reader's place.
            def refreshes() -> None:
                _open(browser, f"{board}?refresh=2")
                browser.execute_script("window.scrollTo(0, 700); window.foremanMarker = 1;")
                deadline = time.monotonic() + HANG_S
                while browser.execute_script("return window.foremanMarker === 1"):
                    assert time.monotonic() < deadline, "the page never reloaded itself"
                    time.sleep(0.2)
                time.sleep(0.3)
                # Where the reader was (the page may have grown or shrunk a little between the two loads), not the top.
                scrolled = int(browser.execute_script("return Math.round(window.scrollY)"))
                assert 600 <= scrolled <= 800, scrolled

            await in_browser(refreshes)

            # A phone: the first screen is the health and what needs a person; nothing wider than the screen.
            def phone() -> None:
                _open(browser, board, PHONE)
                overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
                wide = browser.execute_script(
                    "return [...document.querySelectorAll('body *')].filter(e => !e.closest('.scroll'))"
                    ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
                    ".slice(0, 5).map(e => e.tagName + ' ' + e.textContent.slice(0, 60))")
                assert overflow <= 1, (overflow, wide)
                assert browser.execute_script(
                    "return document.querySelector('[data-test=\"health-banner\"]').getBoundingClientRect().bottom"
                ) < 844
                _shot(browser, "dashboard-phone.png", PHONE)

            await in_browser(phone)

            # The issue's page, by its link from the board: the whole timeline.
            def issue_page() -> None:
                from selenium.webdriver.common.by import By

                _open(browser, board)
                browser.find_element(By.CSS_SELECTOR, '[data-column="done"] a[href="/dashboard/issues/1"]').click()
                assert browser.current_url == f"{board}/issues/1"
                timeline = _text(browser, "#timeline")
                for kind in ("delivery", "decision", "lease", "bootstrap", "outbox", "worktree"):
                    assert kind in timeline, (kind, timeline)
                assert "branches" in _text(browser, "#worktree")

            await in_browser(issue_page)

            # Gitea down: the first thing on the board is red, with the reason.
            h.emulator.faults.fail("*", "*", status=503, times=None, message="Gitea is down for maintenance")
            await until("Gitea unreachable", lambda d: d["health"]["ok"] is False and any(
                c["name"] == "Gitea" and c["ok"] is False for c in d["health"]["checks"]))

            def gitea_down() -> None:
                _open(browser, board)
                banner = _text(browser, '[data-test="health-banner"]')
                assert banner.startswith("Not healthy: Gitea: unreachable"), banner
                assert "Gitea: red" in _text(browser, "#health")
                assert "not read: Gitea is unreachable" in _text(browser, "#queues")
                _shot(browser, "dashboard-gitea-down.png", WIDE)

            await in_browser(gitea_down)
            h.emulator.faults.clear()
            await until("Gitea back", lambda d: bool(d["health"]["ok"]))

            # Gitea's text stays text (no screenshot from here on).
            await h.api(MAINTAINER, "POST", "/issues", {"title": HOSTILE, "body": "x"})
            await until("the hostile title seen", lambda d: any(
                c["title"] == HOSTILE for col in d["flow"]["columns"] for c in col["cards"]))

            def hostile() -> None:
                from selenium.webdriver.common.by import By

                _open(browser, board)
                assert HOSTILE in _text(browser, "#board")
                assert browser.find_elements(By.CSS_SELECTOR, "main img") == [] and browser.title == "foreman dashboard"
                assert TOKEN not in browser.page_source

            await in_browser(hostile)
    finally:
        shutil.rmtree(root, ignore_errors=True)

