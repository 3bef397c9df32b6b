"""A whole organization served by a real `foreman serve` (its repositories discovered from Gitea while running),
and Gitea's system webhooks (one admin hook brings every repository's events)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import AsyncIterator

import pytest

from bot.config_writer import write_config
from tests.gitea_fixtures import OWNER, REPO, seed_sibling_repository
from tests.serve_support import Served, served_emulator
from tests.support import SECRET

pytestmark = [pytest.mark.process]

WIDGETS = f"{OWNER}/{REPO}"
#: A repository owned by a user, not by the organization: an org hook never sees it, a system hook does.
STRAY_OWNER, STRAY = "alice", "scratch"
EVENTS = ["issues", "issue_comment"]


class SystemHooked(Served):
    """A live emulator with one system hook (or an org hook) pointing at a `foreman serve`."""

    def deliveries_of(self, full_name: str) -> list[tuple[str, str | None, dict[str, str]]]:
        """(status, ignored_reason, headers) of every stored delivery whose payload names ``full_name``."""
        return [(status, reason, json.loads(headers)) for status, reason, headers, body in
                self.db("SELECT status, ignored_reason, headers_json, body FROM deliveries ORDER BY id")
                if json.loads(body)["repository"]["full_name"] == full_name]


@pytest.fixture
async def system_hooked() -> AsyncIterator[SystemHooked]:
    """A `foreman serve` of acme/widgets only, running, and a system hook to it."""
    async with served_emulator("foreman-system-hook-", clone_protocol="http") as (live, proc):
        live.emulator.create_repo(STRAY_OWNER, STRAY, files={"README.md": "# scratch\n"})
        write_config(proc.config, proc.serve_document(live.base_url, {"reconcile": {"interval_s": 0, "overlap_s": 5}}))
        await proc.serve()
        live.emulator.add_system_hook(url=proc.hook_url, secret=SECRET, events=EVENTS)
        yield SystemHooked(live, proc)


async def test_a_system_hook_brings_a_configured_repository_handled_and_another_ignored_with_its_reason(
    system_hooked: SystemHooked,
) -> None:
    t = system_hooked
    served = t.emu.create_issue(OWNER, REPO, title="Served work", author="alice", notify=True)
    stray = t.emu.create_issue(STRAY_OWNER, STRAY, title="Nobody serves this", author="alice", notify=True)
    sent = await t.emu.drain_webhooks()
    # The emulator sent both through the one system hook (no repository or org hook exists), marked `system`.
    assert {d.payload["repository"]["full_name"] for d in sent} == {WIDGETS, f"{STRAY_OWNER}/{STRAY}"}
    assert all(d.ok and d.headers["X-Gitea-Hook-Installation-Target-Type"] == "system" for d in sent)

    await t.wait(lambda: bool(t.db("SELECT 1 FROM issues WHERE repo = ? AND number = ?", (WIDGETS, served.number)))
                 and all(status == "done" for status, _, _ in t.deliveries_of(WIDGETS)),
                 "the configured repository's delivery handled")
    handled = t.deliveries_of(WIDGETS)
    assert handled and all(reason is None for _, reason, _ in handled)
    assert handled[0][2].get("X-Gitea-Hook-Installation-Target-Type") == "system"

    ignored = t.deliveries_of(f"{STRAY_OWNER}/{STRAY}")
    assert ignored and all(status == "ignored" for status, _, _ in ignored)
    assert all(reason is not None and reason.startswith("foreign_repository") and f"{STRAY_OWNER}/{STRAY}" in reason
               for _, reason, _ in ignored)
    assert not t.db("SELECT 1 FROM issues WHERE repo = ?", (f"{STRAY_OWNER}/{STRAY}",))
    assert not [c for c in t.emu.issue(STRAY_OWNER, STRAY, stray.number).comments]


# --- a whole organization ---------------------------------------------------------------------------------------------

SIBLING, EXCLUDED, LATER = "gadgets", "legacy", "tools"
GADGETS, LEGACY, TOOLS = f"{OWNER}/{SIBLING}", f"{OWNER}/{EXCLUDED}", f"{OWNER}/{LATER}"
ORG_REPOS = f"/api/v1/orgs/{OWNER}/repos"


async def served(t: SystemHooked) -> list[str]:
    return sorted((await t.readyz())["checks"]["repositories"])


@pytest.fixture
async def organization() -> AsyncIterator[SystemHooked]:
    """acme as an organization with widgets, gadgets and an excluded legacy, one org hook to a `foreman serve`
    whose config names only ``[organization] name = "acme"`` (no repository) and a short catch-up interval."""
    async with served_emulator("foreman-org-", clone_protocol="http") as (live, proc):
        for name in (SIBLING, EXCLUDED):
            seed_sibling_repository(live.emulator, name)
        live.emulator.make_org(OWNER)
        document = proc.serve_document(live.base_url, {"reconcile": {"interval_s": 0.3}})
        checkouts = document.pop("repository")["checkout_root"]
        document["organization"] = {"name": OWNER, "exclude": [EXCLUDED.upper()], "checkout_root": checkouts}
        write_config(proc.config, document)
        live.emulator.add_org_hook(OWNER, url=proc.hook_url, secret=SECRET, events=EVENTS)
        yield SystemHooked(live, proc)


async def test_an_organization_is_discovered_a_new_repository_served_and_an_archived_one_let_go(
    organization: SystemHooked,
) -> None:
    t = organization
    await t.proc.serve()
    # The start-up listing served widgets and gadgets; legacy is excluded (the list is case-insensitive).
    assert await served(t) == [GADGETS, WIDGETS]
    found = (await t.readyz())["checks"]["organization"]
    assert found["ok"] is True and found["discovered"] == [REPO, SIBLING]
    assert found["skipped"] == {LEGACY: "excluded (organization.exclude)"}

    for name in (REPO, SIBLING, EXCLUDED):
        t.emu.create_issue(OWNER, name, title=f"Work item of {name}", author="alice", notify=True)
    await t.emu.drain_webhooks()
    for key in (WIDGETS, GADGETS):
        await t.wait(lambda key=key: bool(t.db("SELECT 1 FROM issues WHERE repo = ?", (key,)))  # type: ignore[misc]
                     and all(status == "done" for status, _, _ in t.deliveries_of(key)), f"{key}'s issue stored")
    ignored = t.deliveries_of(LEGACY)
    assert ignored and all(status == "ignored" and reason is not None and LEGACY in reason
                           and reason.startswith("foreign_repository") for status, reason, _ in ignored)
    assert not t.db("SELECT 1 FROM issues WHERE repo = ?", (LEGACY,))

    # A repository created while the service runs is served from the next pass, with its own catch-up.
    seed_sibling_repository(t.emu, LATER)
    await t.wait(lambda: bool(t.db("SELECT 1 FROM reconcile_passes WHERE repo = ?", (TOOLS,))),
                 "the new repository's start-up catch-up")
    assert await served(t) == [GADGETS, TOOLS, WIDGETS]
    issue = t.emu.create_issue(OWNER, LATER, title="New work", author="alice", notify=True)
    await t.emu.drain_webhooks()
    await t.wait(lambda: bool(t.db("SELECT 1 FROM issues WHERE repo = ? AND number = ?", (TOOLS, issue.number))),
                 "the new repository's issue stored")

    # An archived repository stops being served at the next pass, with a log line; its deliveries are ignored.
    t.emu.archive_repo(OWNER, SIBLING)
    await t.wait(lambda: "acme/gadgets is no longer served (archived)" in t.proc.stderr.read_text(),
                 "the archived repository let go")
    assert await served(t) == [TOOLS, WIDGETS]
    before = len(t.deliveries_of(GADGETS))
    t.emu.create_issue(OWNER, SIBLING, title="After archiving", author="alice", notify=True)
    await t.emu.drain_webhooks()
    await t.wait(lambda: len(t.deliveries_of(GADGETS)) > before and t.deliveries_of(GADGETS)[-1][0] == "ignored",
                 "the archived repository's delivery ignored")

    # Each pass is one listing call (three repositories fit one page of 50).
    passes = (await t.readyz())["checks"]["organization"]["passes"]
    listings = [r for r in t.emu.requests if r.path == ORG_REPOS]
    assert passes >= 3 and abs(len(listings) - passes) <= 1
    assert all(dict(r.query).get("limit") == "50" for r in listings)


async def test_an_organization_gitea_cannot_list_serves_only_its_explicit_entry_until_a_pass_works(
    organization: SystemHooked,
) -> None:
    t = organization
    document = tomllib.loads(t.proc.config.read_text())
    root = document["organization"]["checkout_root"]
    document["repositories"] = [{"owner": OWNER, "name": REPO, "checkout_root": root}]
    write_config(t.proc.config, document)
    listing_down = t.emu.faults.fail("GET", "/orgs/{org}/repos", status=500, times=None)
    await t.proc.serve()
    # Fail closed: the explicit entry is served, nothing guessed; /readyz says why and stays ready.
    doc = await t.readyz()
    assert doc["ready"] is True and sorted(doc["checks"]["repositories"]) == [WIDGETS]
    found = doc["checks"]["organization"]
    assert found["ok"] is False and "500" in found["last_error"] and found["discovered"] is None
    t.emu.create_issue(OWNER, SIBLING, title="Not served yet", author="alice", notify=True)
    await t.emu.drain_webhooks()
    await t.wait(lambda: bool(t.deliveries_of(GADGETS)) and t.deliveries_of(GADGETS)[0][0] == "ignored",
                 "the undiscovered repository's delivery ignored")
    # Gitea answers again: the next pass serves what it lists.
    t.emu.faults.rules.remove(listing_down)
    await t.wait(lambda: bool(t.db("SELECT 1 FROM reconcile_passes WHERE repo = ?", (GADGETS,))),
                 "gadgets served after Gitea came back")
    found = (await t.readyz())["checks"]["organization"]
    assert found["ok"] is True and found["errors_total"] >= 1 and found["discovered"] == [REPO, SIBLING]
    assert await served(t) == [GADGETS, WIDGETS]


async def test_an_organization_alone_that_gitea_cannot_list_serves_nothing_and_says_so(
    organization: SystemHooked,
) -> None:
    t = organization
    t.emu.faults.fail("GET", "/orgs/{org}/repos", status=500, times=None)
    await t.proc.serve()
    doc = await t.readyz()
    assert doc["ready"] is True and doc["checks"]["repositories"] == {}
    reconcile = doc["checks"]["reconcile"]
    assert reconcile["ok"] is None and "no repository served yet" in reconcile["detail"]
    assert doc["checks"]["organization"]["ok"] is False
    t.emu.create_issue(OWNER, REPO, title="Nothing is served", author="alice", notify=True)
    await t.emu.drain_webhooks()
    await t.wait(lambda: bool(t.deliveries_of(WIDGETS)) and t.deliveries_of(WIDGETS)[0][0] == "ignored",
                 "the delivery ignored while nothing is served")
    assert not t.db("SELECT 1 FROM issues") and not t.db("SELECT 1 FROM reconcile_passes")
