"""`foreman demo` end to end with real subprocesses: exit 0 only when every step verified, else the failed step."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bot.demo
from tests.conftest import REPO_ROOT
from tests.support import HANG_S, SLOW_HANG_S

pytestmark = [pytest.mark.process, pytest.mark.slow]

STEPS = ("gitea", "serve", "config", "webhook", "issue", "label", "candidate", "allocate", "bootstrap", "evidence",
         "loop", "mcp", "lock", "heartbeat", "state", "publish", "pr", "release", "claim", "review", "merge",
         "teardown")


def test_foreman_demo_runs_the_loop_and_exits_0() -> None:
    """`python -m bot demo --verbose` from a directory without any config: every step is printed in full and
    verified, with the evidence comments."""
    done = subprocess.run(
        [sys.executable, "-m", "bot", "demo", "--verbose", "--timeout", str(HANG_S)], cwd=REPO_ROOT / "tests",
        capture_output=True, text=True, timeout=SLOW_HANG_S, check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    lines = out.splitlines()
    printed = [line[9:].split()[0] for line in lines if line.startswith("[") and len(line) > 9 and line[9:].strip()]
    assert [step for step in printed if step in STEPS] == list(STEPS), printed
    assert "maintainer labelled #1 status:ready" in out and "answered 202" in out
    assert "lease lease-" in out and "Gitea now shows assignee author-1 and label status:in-progress" in out
    assert "WHO_IS_NEXT: author" in out and "NEXT_ACTION: author-1: lock #1 with gitea_lock_issue" in out
    assert "NEXT_PROMPT:" in out and "<!-- foreman:evidence bootstrap-1-" in out
    assert "gitea_lock_issue: #1 locked" in out and "released (pull_request_opened)" in out
    # The whole life: four identities, each its own session of foreman serve's /mcp, each step read back from Gitea.
    assert "author-1 connected to foreman serve's /mcp (Streamable HTTP, its own token;" in out
    assert re.search(r"commit [0-9a-f]{12} by author-1 pushed to issue-1-make-the-widget-blue", out), out
    assert "PR #2 issue-1-make-the-widget-blue -> main, posted as author-1, body \"Closes #1\"" in out
    # Nobody allocates the review or the merge: the queues hand them out, each agent reads its runtime context.
    assert re.search(r"the review queue leased the review of #1 to reviewer-1 by itself \(lease lease-\S+", out), out
    assert re.search(r"the merge queue leased the approved PR #2 to merger-1 by itself \(lease lease-\S+", out), out
    assert "controller-bot through /mcp: gitea_allocate_next_work" not in out
    assert "APPROVED as reviewer-1" in out and "PR #2 merged by merger-1" in out
    assert "worktree removed, issue-1-make-the-widget-blue deleted, status:done, issue closed" in out
    assert "<!-- foreman:evidence teardown:demo/widgets:1:pr-2:evidence -->" in out
    assert "final evidence comment" in out and out.rstrip().splitlines()[-1].startswith("foreman demo: every step")
    assert "FAILED" not in out
    # The repository is private and the control checkout comes over git smart HTTP with the bot's token.
    assert re.search(r"control checkout cloned over HTTP from http://127\.0\.0\.1:\d+/demo/widgets\.git \(private"
                     r" repository\) with foreman-bot's token", out), out
    assert "gitea-foreman-bot-" not in out  # the bot's token (demo tokens are gitea-<login>-<hex>)


def test_foreman_demo_leads_with_a_short_timeline() -> None:
    """Issue 34 item 3: the demo's output was 260 lines, the evidence JSON first; by default it is now a timeline,
    one short line per verified step with its time, the verdict last, and the evidence behind --verbose."""
    done = subprocess.run(
        [sys.executable, "-m", "bot", "demo", "--timeout", str(HANG_S)], cwd=REPO_ROOT / "tests", capture_output=True,
        text=True, timeout=SLOW_HANG_S, check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    lines = out.splitlines()
    steps = [line for line in lines if re.match(r"\[\s*\d+\.\ds\] \w", line)]
    assert [line[9:].split()[0] for line in steps] == list(STEPS), lines
    assert lines[1:len(STEPS) + 1] == steps  # the timeline leads, right after the one-line heading
    assert len(lines) <= len(STEPS) + 5 and max(len(line) for line in lines) <= 130, out
    assert "<!-- foreman:evidence" not in out and '"schema"' not in out and "NEXT_PROMPT" not in out
    assert "foreman demo --verbose" in out and lines[-1].startswith("foreman demo: every step verified in ")


async def test_the_demo_fails_with_the_step_that_did_not_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repository without the `status:in-progress` label: Gitea silently drops it, foreman's read-back catches
    it, and the demo stops at the allocation step with exit 1 instead of printing success."""
    monkeypatch.setattr(bot.demo, "status_labels", lambda: ("status:ready",))
    out = io.StringIO()
    code = await bot.demo.run_demo(out, timeout_s=HANG_S)
    text = out.getvalue()
    assert code == 1, text
    assert "FAILED at step 'allocate'" in text and "verification_failed" in text, text
    assert "every step verified" not in text
    kept = Path(text.split("the demo's files are kept in ")[-1].strip())
    assert kept.name.startswith("foreman-demo-") and (kept / "serve.log").is_file(), kept
    shutil.rmtree(kept, ignore_errors=True)
