"""The dashboard in a real headless Chromium over the demo's state (issue 18 item 2).

`foreman demo --keep`'s run (the emulator, a real `foreman serve`, the author's verbs through `foreman mcp`) leaves
a database with an allocation, a bootstrap transition with its journal phases, a lock, a release and verified
evidence comments. A second real `foreman serve` is started on that database with `[dashboard] token`, and Debian's
Chromium, driven by Selenium through Debian's chromedriver, opens it as a maintainer would: ?token= once (the token
leaves the address bar, the cookie is HttpOnly), the front page, the issue's page, a phone-sized window. Screenshots
go to docs/screenshots/ (or $FOREMAN_SCREENSHOTS_DIR). Skipped with one line where Chromium is absent (never in
CI: `.ci/run` installs it and fails on any skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

CHROMIUM = Path(os.environ.get("FOREMAN_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FOREMAN_CHROMEDRIVER", "/usr/bin/chromedriver"))
TOKEN = "browser-dashboard-token-0123456789"
SHOTS = Path(os.environ.get("FOREMAN_SCREENSHOTS_DIR") or REPO_ROOT / "docs" / "screenshots")


def _missing() -> str | None:
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        return (f"no Chromium at {CHROMIUM} / {CHROMEDRIVER} (apt-get install chromium chromium-driver; "
                ".ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@pytest.fixture(scope="module")
def demo_root() -> Iterator[Path]:
    """The demo's files, kept: foreman.toml, foreman.db, checkouts/."""
    import bot.demo

    out = io.StringIO()
    code = asyncio.run(bot.demo.run_demo(out, keep=True, timeout_s=30))
    text = out.getvalue()
    assert code == 0, text
    found = re.search(r"files kept in (\S+) \(", text)
    assert found, text
    root = Path(found.group(1))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dashboard_url(demo_root: Path) -> Iterator[str]:
    """A real `foreman serve` on the demo's database, with the dashboard on."""
    config = demo_root / "dashboard.toml"
    config.write_text((demo_root / "foreman.toml").read_text(encoding="utf-8")
                      + f'\n[dashboard]\ntoken = "{TOKEN}"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    log = (demo_root / "dashboard-serve.log").open("w+", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--config", str(config)], cwd=demo_root,
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", (demo_root / "dashboard-serve.log")
                              .read_text(encoding="utf-8"))
            port = found.group(1) if found else None
        assert port is not None, (demo_root / "dashboard-serve.log").read_text(encoding="utf-8")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
    allocator = _section(browser, "allocator")
    assert "Ready candidates" in allocator and "leased #1 to author-1" in allocator, allocator
    _section(browser, "grants")
    assert TOKEN not in browser.page_source
    _shot(browser, "dashboard.png", 1280)

    # The page, by its link: the whole timeline.
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
