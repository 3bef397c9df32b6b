"""Two repositories served by one `foreman serve` process, each with its own issue #1, over one org hook."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.config_writer import write_config
from tests.gitea_fixtures import (
    BOT,
    OWNER,
    REPO,
    seed_foreman,
    seed_sibling_repository,
)
from tests.serve_support import Served, ServeProcess, served_emulator
from tests.support import SECRET
from tests.world import EXTRA_TOKENS

pytestmark = [pytest.mark.process]

SIBLING = "gadgets"
UNLISTED = "unlisted"
WIDGETS, GADGETS = f"{OWNER}/{REPO}", f"{OWNER}/{SIBLING}"
#: One roster each: widgets' authors come from the top-level [roster], gadgets' from its entry's own roster.
WIDGETS_AUTHOR, GADGETS_AUTHOR = "author-1", "author-2"
READY, IN_PROGRESS = "status:ready", "status:in-progress"
DASHBOARD_TOKEN = "dashboard-token-0123456789"


class TwoRepositories(Served):
    """A live emulator whose ``acme`` is an organization with three repositories (two of them configured) and
    one org hook to a `foreman serve` subprocess."""

    async def dashboard(self, path: str) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}
        async with aiohttp.ClientSession() as session, session.get(f"{self.proc.url}/dashboard{path}",
                                                                   headers=headers) as resp:
            return resp.status, await (resp.json() if "json" in resp.content_type else resp.text())

    def issue_facts(self, name: str, number: int) -> dict[str, Any]:
        issue = self.emu.issue(OWNER, name, number)
        return {
            "labels": sorted(self.emu.label_names(OWNER, name, number)),
            "assignees": sorted(user.login for user in issue.assignees),
            "bot_comments": [c.body for c in issue.comments if c.poster.login == BOT],
        }

    def allocated(self, name: str, author: str) -> bool:
        facts = self.issue_facts(name, 1)
        journals = self.db("SELECT outcome FROM bootstrap_journal WHERE repo = ?", (f"{OWNER}/{name}",))
        return (IN_PROGRESS in facts["labels"] and facts["assignees"] == [author] and journals == [("completed",)]
                and not self.db("SELECT 1 FROM outbox WHERE status != 'done' OR hooked_at IS NULL"))


async def _cli(t: TwoRepositories, *args: str) -> tuple[int, dict[str, Any]]:
    """`foreman --config <the service's config> ARGS` beside the service: its exit code and JSON output."""
    code, out, err = await t.cli(*args)
    assert out, err
    doc: dict[str, Any] = json.loads(out)
    return code, doc


def _config(proc: ServeProcess, base_url: str) -> dict[str, Any]:
    document = proc.serve_document(base_url, {
        "worker": {"concurrency": 2},
        "outbox": {"poll_interval_s": 0.1, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
        "reconcile": {"interval_s": 0, "overlap_s": 5},
        "roster": {WIDGETS_AUTHOR: ["author"]},
        "dashboard": {"token": DASHBOARD_TOKEN},
    })
    checkouts = document.pop("repository")["checkout_root"]
    document["repositories"] = [
        {"owner": OWNER, "name": REPO, "checkout_root": checkouts},
        {"owner": OWNER.upper(), "name": SIBLING.capitalize(), "checkout_root": checkouts,
         "roster": {GADGETS_AUTHOR: ["author"]}},
    ]
    return document


@pytest.fixture
async def two() -> AsyncIterator[TwoRepositories]:
    """The organization's three repositories, and its hook to a running `foreman serve` of two of them."""
    async with served_emulator("foreman-repos-", clone_protocol="http") as (live, proc):
        seed_foreman(live.emulator, {WIDGETS_AUTHOR: EXTRA_TOKENS[WIDGETS_AUTHOR]})
        seed_sibling_repository(live.emulator, SIBLING, authors={GADGETS_AUTHOR: EXTRA_TOKENS[GADGETS_AUTHOR]})
        seed_sibling_repository(live.emulator, UNLISTED)
        live.emulator.make_org(OWNER)
        write_config(proc.config, _config(proc, live.base_url))
        await proc.serve()
        live.emulator.add_org_hook(OWNER, url=proc.hook_url, secret=SECRET, events=["issues", "issue_comment"])
        yield TwoRepositories(live, proc)


async def test_two_repositories_each_with_issue_1_stay_apart_and_an_unlisted_repository_is_ignored(
    two: TwoRepositories,
) -> None:
    t = two
    for name in (REPO, SIBLING):
        issue = t.emu.create_issue(OWNER, name, title=f"Work item of {name}", author="alice", notify=True)
        assert issue.number == 1
    stray = t.emu.create_issue(OWNER, UNLISTED, title="Nobody serves this", author="alice", notify=True)
    await t.emu.drain_webhooks()
    for name in (REPO, SIBLING):
        t.emu.add_labels(OWNER, name, 1, [READY], actor="alice", notify=True)
    await t.emu.drain_webhooks()

    # Each repository's #1 goes to its own roster's author: leased, labelled, assigned, bootstrapped, evidenced.
    await t.wait(lambda: t.allocated(REPO, WIDGETS_AUTHOR) and t.allocated(SIBLING, GADGETS_AUTHOR),
                 "both issues #1 allocated and bootstrapped in their own repository")
    assert t.db("SELECT repo, issue_number, owner FROM leases WHERE status = 'live' ORDER BY repo") == [
        (GADGETS, 1, GADGETS_AUTHOR), (WIDGETS, 1, WIDGETS_AUTHOR)]
    registrations = dict(t.db("SELECT repo, worktree_path FROM worktree_registrations"))
    assert sorted(registrations) == [GADGETS, WIDGETS]
    checkouts = t.root / "checkouts"  # <checkout_root>/<owner>/<name> as configured (routing ignores the case)
    assert Path(registrations[WIDGETS]).is_relative_to(checkouts / OWNER / REPO)
    assert Path(registrations[GADGETS]).is_relative_to(checkouts / OWNER.upper() / SIBLING.capitalize())
    assert t.db("SELECT repo, COUNT(*) FROM bootstrap_journal WHERE outcome = 'completed' GROUP BY repo") == [
        (GADGETS, 1), (WIDGETS, 1)]
    # Every outbox entry is filed under its repository, and each repository's comments name only its own lease.
    assert {repo for (repo,) in t.db("SELECT repo FROM outbox")} == {GADGETS, WIDGETS}
    for name, other in ((REPO, SIBLING), (SIBLING, REPO)):
        leases = dict(t.db("SELECT repo, lease_id FROM leases"))
        bodies = "\n".join(t.issue_facts(name, 1)["bot_comments"])
        assert leases[f"{OWNER}/{name}"] in bodies and leases[f"{OWNER}/{other}"] not in bodies
        keys = {key for (key,) in t.db("SELECT idempotency_key FROM outbox WHERE repo = ?", (f"{OWNER}/{name}",))}
        assert all(key in bodies for key in keys if key.endswith(":evidence"))
    # The unlisted repository of the same org: stored, then ignored with a reason naming it; nothing else happened.
    rows = [(status, reason, headers) for status, reason, headers, body in
            t.db("SELECT status, ignored_reason, headers_json, body FROM deliveries")
            if json.loads(body)["repository"]["full_name"] == f"{OWNER}/{UNLISTED}"]
    assert rows and all(status == "ignored" for status, _, _ in rows)
    assert all(reason.startswith("foreign_repository") and f"{OWNER}/{UNLISTED}" in reason for _, reason, _ in rows)
    assert json.loads(rows[0][2]).get("X-Gitea-Hook-Installation-Target-Type") == "organization"
    assert t.issue_facts(UNLISTED, stray.number) == {"labels": [], "assignees": [], "bot_comments": []}
    assert not t.db("SELECT 1 FROM issues WHERE repo = ?", (f"{OWNER}/{UNLISTED}",))

    # /readyz shows catch-up per repository; each one's start-up pass read its own repository.
    ready = await t.readyz()
    assert sorted(ready["checks"]["repositories"]) == [GADGETS, WIDGETS]
    assert t.db("SELECT DISTINCT repo FROM reconcile_passes ORDER BY repo") == [(GADGETS,), (WIDGETS,)]

    # The dashboard shows one repository at a time (?repository=, default the first), listing every served one.
    status, doc = await t.dashboard("/api/overview?repository=acme/gadgets")
    assert status == 200 and [(r["key"], r["selected"]) for r in doc["repositories"]] == [(WIDGETS, False),
                                                                                          (GADGETS, True)]
    assert [(r["issue_number"], r["owner"]) for r in doc["leases"]["live"]] == [(1, GADGETS_AUTHOR)]
    status, doc = await t.dashboard("/api/overview")
    assert status == 200 and [(r["issue_number"], r["owner"]) for r in doc["leases"]["live"]] == [(1, WIDGETS_AUTHOR)]
    status, doc = await t.dashboard("/api/issues/1?repository=acme/gadgets")
    assert status == 200 and doc["repository"] == GADGETS and doc["bot_writes"]
    assert all(w["repo"] == GADGETS for w in doc["bot_writes"])
    status, page = await t.dashboard("/?repository=acme/gadgets")
    assert status == 200 and 'href="/dashboard/issues/1?repository=acme%2Fgadgets"' in page
    status, doc = await t.dashboard("/api/leases?repository=acme/nowhere")
    assert status == 400 and doc["error"] == "invalid_input" and doc["details"]["repositories"] == [WIDGETS, GADGETS]

    # The CLI: a command on one repository needs --repository (the envelope lists them); the inbox's catch-up
    # figures are shown per repository.
    code, doc = await _cli(t, "leases", "--json")
    assert code == 2 and doc["error"] == "invalid_input" and doc["repositories"] == [WIDGETS, GADGETS]
    assert doc["exact_next_action"].startswith(f"foreman --repository {WIDGETS} leases")
    code, doc = await _cli(t, "--repository", "Acme/Gadgets", "leases", "--live", "--json")
    assert code == 0 and [(r["issue_number"], r["owner"]) for r in doc["live"]] == [(1, GADGETS_AUTHOR)]
    code, doc = await _cli(t, "leases", "--repository", "acme/nowhere", "--json")
    assert code == 2 and "acme/nowhere" in doc["message"] and doc["repositories"] == [WIDGETS, GADGETS]
    code, doc = await _cli(t, "check-config", "--json")  # every served repository exists and the bot may write
    assert code == 0, doc
    assert [(c["check"], c["repository"], c["status"]) for c in doc["checks"] if "repository" in c] == [
        ("repository", WIDGETS, "ok"), ("permission", WIDGETS, "ok"),
        ("repository", GADGETS, "ok"), ("permission", GADGETS, "ok")]
    code, doc = await _cli(t, "deliveries", "--reconcile", "--json")
    assert code == 0 and [d["repository"] for d in doc["repositories"]] == [WIDGETS, GADGETS]
    assert all(d["last_success"] is not None for d in doc["repositories"])

    # Stopped, each repository's #1 gets a label no webhook brings; after the restart each one's catch-up reads
    # its own repository and records it on its own issue #1 (nothing crosses over).
    await t.proc.kill()
    t.emu.add_labels(OWNER, REPO, 1, ["bug"], actor="alice", notify=True)
    t.emu.add_labels(OWNER, SIBLING, 1, ["feature"], actor="alice", notify=True)
    await t.emu.drain_webhooks()
    await t.proc.serve()

    def labels_of(repo: str) -> set[str]:
        rows = t.db("SELECT labels_json FROM issues WHERE repo = ? AND number = 1", (repo,))
        return {label["name"] for label in json.loads(rows[0][0])} if rows and rows[0][0] else set()

    await t.wait(lambda: "bug" in labels_of(WIDGETS) and "feature" in labels_of(GADGETS), "catch-up of both")
    assert "feature" not in labels_of(WIDGETS) and "bug" not in labels_of(GADGETS)
    assert not t.db("SELECT idempotency_key FROM outbox WHERE repo NOT IN (?, ?)", (WIDGETS, GADGETS))
    passes = t.db("SELECT repo, found_json FROM reconcile_passes WHERE trigger = 'start' AND outcome = 'ok'"
                  " ORDER BY id")
    found = {repo: json.loads(doc) for repo, doc in passes[-2:]}
    assert sorted(found) == [GADGETS, WIDGETS] and all(sum(doc.values()) >= 1 for doc in found.values()), passes
    async with aiohttp.ClientSession() as session, session.get(f"{t.proc.url}/metrics") as resp:
        metrics = await resp.text()
    for repo in (WIDGETS, GADGETS):  # labelled by the configured repositories only, never by a payload's
        series = [line for line in metrics.splitlines()
                 if line.startswith("foreman_reconcile_repository_found_total{") and f'repository="{repo}"' in line
                 and 'kind="issue"' in line]
        assert series and float(series[0].rsplit(" ", 1)[1]) >= 1, metrics
    assert UNLISTED not in metrics
