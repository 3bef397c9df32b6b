"""The dashboard in a real headless Chromium over the state a `foreman demo --keep` run leaves."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import tempfile
import tomllib
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.config_writer import merged, write_config
from tests.serve_support import serve_process
from tests.support import HANG_S, free_port

CHROMIUM = Path(os.environ.get("FOREMAN_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FOREMAN_CHROMEDRIVER", "/usr/bin/chromedriver"))
TOKEN = "browser-dashboard-token-0123456789"
# Where the screenshots go: a temporary folder, so a test run never changes the checkout; the ones in
# docs/screenshots/ (shown by the README) are refreshed with FOREMAN_SCREENSHOTS_DIR=docs/screenshots.
SHOTS = Path(os.environ.get("FOREMAN_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "foreman-screenshots")


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


@pytest.fixture(scope="module")
def demo_root() -> Iterator[Path]:
    """The demo's files, kept: foreman.toml, foreman.db, checkouts/."""
    import bot.demo

    out = io.StringIO()
    code = asyncio.run(bot.demo.run_demo(out, keep=True, timeout_s=HANG_S))
    text = out.getvalue()
    assert code == 0, text
    found = re.search(r"files kept in (\S+) \(", text)
    assert found, text
    root = Path(found.group(1))
    yield root
    shutil.rmtree(root, ignore_errors=True)


HOSTILE = '<img src=x onerror="document.title=1">'


async def _seed(db_path: Path) -> None:
    """Beside the demo's loop, through the real stores: two more ready issues (one with a label a user could make
    hostile; #3 is protected by the config, so the allocator skips it with its reason) and an outbox entry whose
    read-back did not match (both versions kept)."""
    from bot.core.issue_state import IssueLabel, IssueObservation
    from state.db import Database
    from state.issues import IssueStore
    from state.outbox import OutboxIntent, OutboxStore

    db = await Database.open(db_path)
    try:
        issues = IssueStore(db)
        for number, labels in ((2, ("status:ready", HOSTILE)), (3, ("status:ready",))):
            observed = IssueObservation(number=number, is_open=True, updated_at=None,
                                        labels=tuple(IssueLabel(i + 1, n) for i, n in enumerate(labels)))
            await issues.record_issue_event(observed, repo="demo/widgets", action="opened", sender="maintainer",
                                            delivery_id=f"seed-{number}")
        outbox = OutboxStore(db)
        await outbox.add(OutboxIntent("seed-2:labels", 2, "labels", {"add": ["status:in-progress"], "remove": []}),
                         repo="demo/widgets")
        entry = await outbox.by_key("seed-2:labels")
        assert entry is not None
        claimed = await outbox.claim(entry, "seed")
        assert claimed is not None
        await outbox.verification_failed(claimed, error="read-back: the labels differ", result={},
                                         observed={"labels": ["status:ready", HOSTILE]})
    finally:
        await db.close()


def _post_foreign_delivery(url: str, secret: str) -> str:
    """A signed delivery for a repository foreman does not serve: stored, then 'ignored' with its reason."""
    body = json.dumps({"action": "opened", "number": 5, "issue": {"number": 5, "labels": [], "state": "open"},
                       "repository": {"full_name": "elsewhere/other", "name": "other",
                                      "owner": {"login": "elsewhere"}},
                       "sender": {"login": "maintainer"}}).encode()
    delivery = "browser-foreign-delivery"
    request = urllib.request.Request(f"{url}/webhook", data=body, method="POST", headers={  # noqa: S310
        "Content-Type": "application/json", "X-Gitea-Event": "issues", "X-Gitea-Delivery": delivery,
        "X-Gitea-Signature": hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()})
    with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310 (loopback)
        assert resp.status == 202
    return delivery


def _api(url: str, path: str) -> Any:
    request = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dashboard_url(demo_root: Path) -> AsyncIterator[str]:
    """A real `foreman serve` on the demo's database (plus the seeded rows), with the dashboard on."""
    await _seed(demo_root / "foreman.db")
    config = demo_root / "dashboard.toml"
    demo = tomllib.loads((demo_root / "foreman.toml").read_text(encoding="utf-8"))
    write_config(config, merged(demo, {"dashboard": {"token": TOKEN}, "server": {"port": free_port()}}))
    secret = re.search(r'secrets = \["([^"]+)"\]', config.read_text(encoding="utf-8"))
    assert secret
    env = {"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[3]"}  # so the allocator skips #3, with its reason
    async with serve_process(demo_root, config=config, env=env, serve=True, graceful=True) as proc:
        delivery = await asyncio.to_thread(_post_foreign_delivery, proc.url, secret.group(1))

        async def ignored() -> bool:
            rows = {d["delivery"]: d for d in (await asyncio.to_thread(_api, proc.url, "/dashboard/api/deliveries"))
                    ["recent"]}
            return bool(rows.get(delivery, {}).get("status") == "ignored")

        await proc.wait_for(ignored, "the foreign delivery ignored")
        yield proc.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="foreman-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic", f"--user-data-dir={profile}", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _shot(driver: Any, name: str, width: int) -> Path:
    """A screenshot of the whole page at ``width`` (the window grows to the page's height)."""
    height = int(driver.execute_script("return Math.max(document.body.scrollHeight, 400)"))
    driver.set_window_size(width, min(height + 120, 6000))
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000, path
    return path


def _section(driver: Any, section_id: str) -> str:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.ID, section_id)
    assert element.is_displayed(), section_id
    return str(element.text)


def test_a_maintainer_reads_the_demo_in_the_dashboard(dashboard_url: str, browser: Any, demo_root: Path) -> None:
    """A second real ``foreman serve`` with ``[dashboard] token`` over the demo's database (an allocation, a
    bootstrap with its phases, a lock, a release, verified evidence), opened in Debian's Chromium through Selenium
    as a maintainer would: ?token= once (the token leaves the address bar, the cookie is HttpOnly), the front page,
    the issue's page, a phone-sized window. Screenshots go to a temporary folder or $FOREMAN_SCREENSHOTS_DIR
    (docs/screenshots/ refreshes the README's); skipped with one line where Chromium is absent (never in CI)."""
    from selenium.webdriver.common.by import By

    import bot.demo

    # Without the token: 401, and the page says what to do.
    browser.get(f"{dashboard_url}/dashboard")
    assert "not_authorized" in browser.page_source
    # ?token= once: redirected to the bare URL; the cookie is there but not readable by a script.
    browser.get(f"{dashboard_url}/dashboard?token={TOKEN}")
    assert browser.current_url == f"{dashboard_url}/dashboard"
    cookie = browser.get_cookie("foreman_dashboard")
    assert cookie is not None and cookie["httpOnly"] is True and TOKEN not in cookie["value"]
    assert "foreman_dashboard" not in browser.execute_script("return document.cookie")
    assert browser.title == "foreman dashboard"

    repos = _section(browser, "repositories")
    assert f"{bot.demo.OWNER}/{bot.demo.REPO}" in repos
    leases = _section(browser, "leases")
    assert "author-1" in leases and "author" in leases and "implement" in leases and "released" in leases
    bootstrap = _section(browser, "bootstrap")
    for phase in ("accepted", "branch_confirmed", "worktree_confirmed", "lock_established", "completed"):
        assert phase in bootstrap, (phase, bootstrap)
    assert "issue-1-" in bootstrap  # the issue branch
    outbox = _section(browser, "outbox")
    assert "comment" in outbox and "labels" in outbox and "done" in outbox
    deliveries = _section(browser, "deliveries")
    assert "issues/label_updated" in deliveries or "issues/" in deliveries
    assert "ignored_self" in deliveries  # the bot's own label and comment webhooks
    ignored = [line for line in deliveries.splitlines() if "ignored " in line or line.endswith("ignored")]
    assert "browser-foreign-delivery" in deliveries and "elsewhere/other" in deliveries, deliveries
    assert ignored or "ignored" in deliveries
    allocator = _section(browser, "allocator")
    assert "Ready candidates" in allocator and "leased #1 to author-1" in allocator, allocator
    # The decision now: author-1 would get #2; #3 (protected) is skipped with its stable reason.
    now = {d["owner"]: d for d in _api(dashboard_url, "/dashboard/api/allocator")["now"]}["author-1"]
    assert now["decision"] == "select" and now["issue_number"] == 2, now
    (skip,) = [s for s in now["skipped"] if s["issue_number"] == 3]
    tables = browser.find_elements(By.CSS_SELECTOR, '#allocator table[data-test="skipped"]')
    assert tables, allocator
    skipped = tables[0].text
    assert "#3" in skipped and skip["reason"] in skipped, skipped
    assert "would lease #2" in allocator
    # Text from Gitea is text: the hostile label is shown literally and made no element.
    assert HOSTILE in allocator and browser.find_elements(By.CSS_SELECTOR, "main img") == []
    assert browser.title == "foreman dashboard"
    # The failed verification, with both versions.
    needs = browser.find_element(By.CSS_SELECTOR, 'table[data-test="outbox-open"]').text
    assert "verification_failed" in needs and "intended" in needs and "Gitea shows" in needs, needs
    assert "status:in-progress" in needs and "read-back: the labels differ" in needs
    _section(browser, "grants")
    assert TOKEN not in browser.page_source
    _shot(browser, "dashboard.png", 1280)

    # The issue's page, by its link: the whole timeline.
    browser.set_window_size(1280, 900)
    browser.find_element(By.CSS_SELECTOR, 'a[href="/dashboard/issues/1"]').click()
    assert browser.current_url == f"{dashboard_url}/dashboard/issues/1"
    timeline = _section(browser, "timeline")
    for kind in ("delivery", "decision", "lease", "bootstrap", "outbox", "worktree"):
        assert kind in timeline, (kind, timeline)
    assert "acquired" in timeline and "released" in timeline
    writes = _section(browser, "writes")
    assert "foreman:evidence" in writes or "evidence" in writes
    worktree = _section(browser, "worktree")
    assert "branches" in worktree and "issue-1-" in worktree
    _shot(browser, "dashboard-issue.png", 1280)

    # A phone: nothing wider than the screen (tables scroll inside their own box).
    browser.set_window_size(390, 844)
    browser.get(f"{dashboard_url}/dashboard")
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    wide = browser.execute_script(
        "return [...document.querySelectorAll('body *')].filter(e => !e.closest('.scroll'))"
        ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
        ".slice(0, 5).map(e => e.tagName + ' ' + e.textContent.slice(0, 60))"
    )
    assert overflow <= 1, (overflow, wide)
    with contextlib.suppress(Exception):
        _shot(browser, "dashboard-phone.png", 390)
