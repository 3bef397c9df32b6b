"""Gitea as it really is: each behaviour from Gitea's source, in the emulator, and the bot's answer to it end to end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.core.canonical import render
from bot.core.vocabulary import status_labels
from bot.emulator.model import UNITS, Perm
from state.db import utcnow
from state.leases import Lease, LeaseStore
from state.outbox import OutboxEntry, OutboxIntent, OutboxKind
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS
from tests.support import Started, canonical_state, eventually
from tests.world import FULL_NAME, World, open_world


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    # Issue state alone: auto-allocation (on by default with a roster author) would take ready issues away.
    async with open_world(tmp_path, start, allocator={"auto": False}) as opened:
        yield opened


# --- label_cleared; missing issues, assignees, deleted issues ---------------------------------------------------------



async def _lease_to_author(world: World, number: int) -> Lease:
    """A live implement lease of author-1 on ``number``, written straight to the store (no allocation)."""
    async with world.service.db.transaction() as conn:
        return await LeaseStore(world.service.db).acquire(
            conn, repo=FULL_NAME, issue_number=number, owner="author-1", role="author", action="implement",
            ttl=timedelta(hours=1), now=utcnow(), actor="test", fingerprint=None, request={},
        )

async def test_label_cleared_is_read_as_no_labels_though_the_payload_lists_the_old_ones(world: World) -> None:
    """models/issues/issue_label.go clearIssueLabels loads the labels, deletes them and never reloads, and
    services/webhook/notifier.go IssueClearLabels converts that stale list: the payload names the labels from
    before the clear. The bot must store "no labels" (not the removed ones)."""
    number = await world.open_issue()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["feature", "bug"]})
    assert (await world.snapshot(number)).label_names == ("bug", "feature")
    await world.call("alice", "DELETE", f"/issues/{number}/labels")
    [cleared] = [d for d in world.live.emulator.deliveries if d.action == "label_cleared"]
    assert sorted(label["name"] for label in cleared.payload["issue"]["labels"]) == ["bug", "feature"]
    assert world.labels(number) == []
    assert (await world.snapshot(number)).label_names == ()
    events = await world.store.issue_events(FULL_NAME, number)
    assert (events[-1]["action"], events[-1]["removed"]) == ("label_cleared", ["bug", "feature"])


COMMENTS_ROUTE = "/repos/{owner}/{repo}/issues/{index}/comments"


def _requests(world: World, method: str, route: str) -> int:
    return sum(1 for r in world.live.emulator.requests if r.method == method and r.route == route)


async def test_comments_of_a_missing_issue_answer_500_and_the_client_says_issue_gone(world: World) -> None:
    """routers/api/v1/repo/issue_comment.go ListIssueComments and CreateIssueComment send a GetIssueByIndex
    error to ctx.APIErrorInternal (1.26.3; ctx.Error(500) in 1.22.3): a missing issue is a 500, not a 404.
    The client must not retry that 500 as "unavailable": it asks GET /issues/{n} (404) once and raises the
    typed GiteaIssueGone."""
    from bot.gitea import GiteaIssueGone

    status_list: list[int] = []
    status_post: list[int] = []
    for method, body in (("GET", None), ("POST", {"body": "hello"})):
        async with world.live.session.request(
            method, world.live.api(f"/repos/{FULL_NAME}/issues/4242/comments"), json=body, headers=world.live.auth()
        ) as resp:
            (status_list if method == "GET" else status_post).append(resp.status)
    assert (status_list, status_post) == ([500], [500])
    client = world.live.client()
    before = _requests(world, "GET", COMMENTS_ROUTE)
    with pytest.raises(GiteaIssueGone) as caught:
        await client.list_issue_comments(4242)
    assert _requests(world, "GET", COMMENTS_ROUTE) == before + 1
    assert caught.value.envelope.error == "not_found" and "4242" in caught.value.envelope.exact_next_action
    with pytest.raises(GiteaIssueGone):
        await client.create_comment(4242, "hello")


async def _queue(world: World, key: str, number: int, kind: OutboxKind, payload: dict[str, Any]) -> None:
    """One outbox entry of ``kind`` on issue ``number``, as a verb queues it, and the sender woken."""
    intent = OutboxIntent(key=key, issue_number=number, kind=kind, payload=payload)
    await world.service.outbox.add(repo=world.service.settings.repo_key, intent=intent)
    world.service.outbox_wakeup()


async def _sent(world: World, key: str, number: int, kind: OutboxKind, payload: dict[str, Any]) -> OutboxEntry:
    """``_queue``, then settled: the entry as it ended."""
    await _queue(world, key, number, kind, payload)
    await world.settle()
    entry = await world.service.outbox.by_key(key)
    assert entry is not None
    return entry


def _evidence(key: str, text: str = "x") -> dict[str, Any]:
    return {"body": f"{text} <!-- foreman:evidence {key} -->"}


async def test_an_outbox_comment_on_a_missing_issue_parks_at_once_with_a_typed_blocker(world: World) -> None:
    """No retry storm: one attempt, parked, with the issue_gone reason and the exact next action."""
    entry = await _sent(world, "test-comment-on-gone", 4242, "comment", _evidence("test-comment-on-gone", "hello"))
    assert (entry.status, entry.attempts) == ("parked", 1)
    assert entry.last_error is not None and entry.last_error.startswith("GiteaIssueGone")
    assert "exact_next_action" in entry.last_error
    # One request: the first send posts at once (nothing can carry the marker of an entry never sent).
    assert (_requests(world, "POST", COMMENTS_ROUTE), _requests(world, "GET", COMMENTS_ROUTE)) == (1, 0)


async def test_patch_with_an_unassignable_user_keeps_the_other_assignees(world: World) -> None:
    """services/issue/issue.go UpdateAssignees runs DeleteNotPassedAssignee before AddAssigneeIfNotAssigned,
    whose models/perm/access/repo_permission.go CanBeAssigned refusal becomes a 500 (routers/api/v1/repo/
    issue.go EditIssue): a raw PATCH loses the other assignees. The outbox adds first (nothing removed),
    and an unassignable login is a typed refusal, parked once, with the assignees untouched."""
    emu = world.live.emulator
    emu.add_user("carol", token="tok-carol-0009")
    emu.repo(OWNER, REPO).private = True
    number = await world.open_issue()
    await world.call("alice", "PATCH", f"/issues/{number}", {"assignees": ["alice", "bob"]})
    # Gitea's own behaviour, raw: the others are gone although the answer is a 500.
    raw_status: int
    async with world.live.session.patch(
        world.live.api(f"/repos/{FULL_NAME}/issues/{number}"), json={"assignees": ["carol"]}, headers=world.live.auth()
    ) as resp:
        raw_status = resp.status
    assert raw_status == 500 and [u.login for u in emu.issue(OWNER, REPO, number).assignees] == []
    await world.call("alice", "PATCH", f"/issues/{number}", {"assignees": ["alice", "bob"]})
    entry = await _sent(world, "test-assign-carol", number, "assignees", {"assignees": ["alice", "carol"]})
    assert (entry.status, entry.attempts) == ("parked", 1)
    assert (
        entry.last_error is not None
        and entry.last_error.startswith("GiteaUnassignable")
        and "carol" in entry.last_error
    )
    assert sorted(u.login for u in emu.issue(OWNER, REPO, number).assignees) == ["alice", "bob"]


async def test_patch_with_an_unknown_user_changes_nothing_and_parks_typed(world: World) -> None:
    """UpdateAssignees: GetUserByName fails before anything is removed; EditIssue answers 500."""
    emu = world.live.emulator
    number = await world.open_issue()
    await world.call("alice", "PATCH", f"/issues/{number}", {"assignees": ["bob"]})
    entry = await _sent(world, "test-assign-ghost", number, "assignees", {"assignees": ["ghost"]})
    assert (entry.status, entry.attempts) == ("parked", 1)
    assert (
        entry.last_error is not None
        and entry.last_error.startswith("GiteaUnassignable")
        and "ghost" in entry.last_error
    )
    assert [u.login for u in emu.issue(OWNER, REPO, number).assignees] == ["bob"]


async def test_an_assignee_change_that_gitea_accepts_still_replaces_the_set(world: World) -> None:
    """The add-first path still ends with exactly the intended assignees."""
    emu = world.live.emulator
    number = await world.open_issue()
    await world.call("alice", "PATCH", f"/issues/{number}", {"assignees": ["bob"]})
    entry = await _sent(world, "test-assign-alice", number, "assignees", {"assignees": ["alice"]})
    assert entry.status == "done"
    assert [u.login for u in emu.issue(OWNER, REPO, number).assignees] == ["alice"]


async def test_issues_deleted_ends_the_leases_and_cancels_the_outbox(tmp_path: Path, start: Started) -> None:
    """services/webhook/notifier.go DeleteIssue sends issues/deleted from 1.25 (absent in 1.22.3): the bot
    releases the issue's live lease and cancels its open outbox entries (they would only ever 500)."""


    async with open_world(
        tmp_path, start, allocator={"auto": False}, outbox={"backoff_base_s": 60.0, "backoff_max_s": 120.0}
    ) as world:
        emu = world.live.emulator
        number = await world.open_issue()
        lease = await _lease_to_author(world, number)
        emu.faults.fail("POST", COMMENTS_ROUTE, status=503, times=8)
        key = "test-comment-then-deleted"
        await _queue(world, key, number, "comment", _evidence(key))

        async def failed_once() -> bool:
            entry = await world.service.outbox.by_key(key)
            return entry is not None and entry.status == "pending" and entry.attempts == 1

        await eventually(failed_once, "the comment's first attempt failed", poll_s=0.01)
        emu.faults.clear()
        await world.call(OWNER, "DELETE", f"/issues/{number}")
        [deleted] = [d for d in emu.deliveries if d.action == "deleted"]
        assert (deleted.event_type, deleted.payload["issue"]["number"]) == ("issues", number)
        found = await LeaseStore(world.service.db).get(lease.lease_id)
        assert found is not None and (found.status, found.end_reason) == ("released", "issue_deleted")
        entry = await world.service.outbox.by_key(key)
        assert entry is not None and entry.status == "parked"
        assert entry.last_error is not None and entry.last_error.startswith("cancelled: issue_deleted")
        blockers = await world.store.blockers(FULL_NAME, number)
        assert [b["kind"] for b in blockers] == ["issue_deleted"]


# --- org labels and teams ---------------------------------------------------------------------------------------------


async def _as(world: World, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One call to the emulator with ``token`` (users the world does not know), then settle."""
    world.clock.now += 1
    async with world.live.session.request(
        method, world.live.api(path), json=body, headers={"Authorization": f"token {token}"}
    ) as resp:
        status = resp.status
        data = await resp.json() if resp.status != 204 and resp.content_type == "application/json" else None
    await world.settle()
    return status, data


async def _state_comment(world: World, token: str, number: int, state: str) -> None:
    """A Canonical Issue State comment of ``state`` on issue ``number``, posted with ``token``, then settled."""
    body = {"body": render(canonical_state(state))}
    await _as(world, token, "POST", f"/repos/{FULL_NAME}/issues/{number}/comments", body)


def _org_status_labels(world: World) -> None:
    """acme becomes an organization whose status:* labels live at org level (none in the repository)."""
    emu = world.live.emulator
    emu.make_org(OWNER)
    for name in status_labels():
        emu.delete_label(OWNER, REPO, name)
        emu.create_org_label(OWNER, name, color="#00aa00")


@pytest.mark.parametrize("version", ["1.22.3", "1.26.3"])
async def test_org_labels_by_name_per_version_and_the_list_filter_drops_them(world: World, version: str) -> None:
    """routers/api/v1/repo/issue_label.go prepareForReplaceOrAdd resolves names with GetLabelIDsInRepoByNames,
    plus GetLabelIDsInOrgByNames from 1.23 only; ids of the org's labels work in every version.
    routers/api/v1/repo/issue.go ListIssues resolves labels= with GetLabelIDsInRepoByNames (repo labels
    only, all versions): an org label name is dropped, and with it the whole filter."""
    emu = world.live.emulator
    emu.version = version
    _org_status_labels(world)
    plain = await world.open_issue(title="plain")
    target = await world.open_issue(title="target")
    _, by_name = await _as(
        world, "tok-alice-0003", "POST", f"/repos/{FULL_NAME}/issues/{target}/labels", {"labels": ["status:ready"]}
    )
    assert [x["name"] for x in by_name] == ([] if version.startswith("1.22") else ["status:ready"])
    ready = next(label for label in emu.org_labels(emu.user(OWNER)) if label.name == "status:ready")
    _, by_id = await _as(
        world, "tok-alice-0003", "POST", f"/repos/{FULL_NAME}/issues/{target}/labels", {"labels": [ready.id]}
    )
    assert [x["name"] for x in by_id] == ["status:ready"]
    assert by_id[0]["url"].endswith(f"/api/v1/orgs/{OWNER}/labels/{ready.id}")
    _, listed = await _as(world, "tok-alice-0003", "GET", f"/repos/{FULL_NAME}/issues?labels=status:ready")
    assert sorted(i["number"] for i in listed) == [plain, target]  # the filter was dropped
    _, org_labels = await _as(world, "tok-alice-0003", "GET", f"/orgs/{OWNER}/labels")
    assert sorted(x["name"] for x in org_labels) == sorted(status_labels())


async def test_label_sync_with_org_status_labels_on_1_22_adds_them_by_id(world: World) -> None:
    """On 1.22 an org label added by name is ignored silently, so a name-based sync never verifies and
    parks: the outbox resolves names to ids (repository labels, then GET /orgs/{org}/labels)."""
    world.live.emulator.version = "1.22.3"
    _org_status_labels(world)
    number = await world.open_issue()
    await world.comment("alice", number, render(canonical_state("in-progress")))
    assert world.labels(number) == ["status:in-progress"]
    snap = await world.snapshot(number)
    assert snap.label_sync == "in_sync"
    [entry] = await world.label_sync_entries(number)
    assert entry.status == "done"


def _teams(world: World, *, bot_in_owners: bool = True) -> None:
    """acme as an organization with a UI-made team "devs" (general access read, Write on Issues) holding
    dave, and a plain read team holding erin."""
    emu = world.live.emulator
    emu.make_org(OWNER)
    if bot_in_owners:
        next(t for t in emu.teams_of(emu.user(OWNER)) if t.access == "owner").members.append(emu.user(BOT))
    emu.add_user("dave", token="tok-dave-0010")
    emu.add_user("erin", token="tok-erin-0011")
    units: dict[str, Perm] = dict.fromkeys(UNITS, "read")
    emu.add_team(OWNER, "devs", access="read", units={**units, "repo.issues": "write"}, members=["dave"], repos=[REPO])
    emu.add_team(OWNER, "readers", access="read", units=units, members=["erin"], repos=[REPO])


async def test_a_team_writer_on_issues_is_read_to_the_permission_api_but_trusted(world: World) -> None:
    """models/perm/access/repo_permission.go GetIndividualUserRepoPermission: the permission API reports the
    team's AccessMode ("read" for a UI "general access" team), while its per-unit Write on Issues lets the
    member set labels. The bot trusts what Gitea lets the person do: GET /repos/{o}/{r}/teams (units_map)
    and GET /teams/{id}/members/{login}."""
    _teams(world)
    emu = world.live.emulator
    status, perm = await _as(world, TOKENS[BOT], "GET", f"/repos/{FULL_NAME}/collaborators/dave/permission")
    assert (status, perm["permission"]) == (200, "read")
    number = await world.open_issue()
    status, _ = await _as(
        world, "tok-dave-0010", "POST", f"/repos/{FULL_NAME}/issues/{number}/labels", {"labels": ["bug"]}
    )
    assert status == 200  # Gitea lets dave write labels: Write on the Issues unit
    status, _ = await _as(
        world, "tok-erin-0011", "POST", f"/repos/{FULL_NAME}/issues/{number}/labels", {"labels": ["bug"]}
    )
    assert status == 403
    await _state_comment(world, "tok-erin-0011", number, "blocked")
    await _state_comment(world, "tok-dave-0010", number, "in-progress")
    records = {r.author: r for r in await world.store.comment_records(FULL_NAME, number)}
    assert (records["dave"].trusted, records["dave"].trust_reason) == (True, "team:devs:repo.issues=write")
    assert (records["erin"].trusted, records["erin"].trust_reason) == (False, "permission:read")
    assert (await world.snapshot(number)).state == canonical_state("in-progress")
    assert emu.label_names(OWNER, REPO, number) == ["bug", "status:in-progress"]


async def test_a_team_writers_trust_is_read_from_gitea_once_per_permission_ttl(world: World) -> None:
    """The team answer is cached like the permission: two state comments by one team writer read the
    repository's teams once (it was 1 + N Gitea reads per comment)."""
    _teams(world)
    emu = world.live.emulator
    number = await world.open_issue()
    before = len([r for r in emu.requests if r.path.endswith(f"/repos/{FULL_NAME}/teams")])
    for state in ("in-progress", "blocked"):
        await _state_comment(world, "tok-dave-0010", number, state)
    records = await world.store.comment_records(FULL_NAME, number)
    assert [r.trust_reason for r in records] == ["team:devs:repo.issues=write"] * 2
    assert len([r for r in emu.requests if r.path.endswith(f"/repos/{FULL_NAME}/teams")]) - before == 1


async def test_team_membership_the_bot_cannot_read_is_untrusted_with_the_reason(world: World) -> None:
    """reqTeamReadAccess (routers/api/v1/api.go, 1.26.3): only site admins, org owners and team members may
    read a team's members; anyone else gets 403 (an org member) or 404. Fail closed, and say why."""
    _teams(world, bot_in_owners=False)
    number = await world.open_issue()
    await _state_comment(world, "tok-dave-0010", number, "in-progress")
    [record] = await world.store.comment_records(FULL_NAME, number)
    assert record.trusted is False
    assert record.trust_reason.startswith("permission:read; team devs grants repo.issues=write")
    assert "org owner" in record.trust_reason


async def test_repo_teams_of_a_user_owned_repository_is_405_and_the_client_reads_no_teams(world: World) -> None:
    """routers/api/v1/repo/teams.go ListTeams answers 405 "repo is not owned by an organization" (not in the
    swagger's declared responses); the client reads that as "no teams" and trust stays permission-based."""
    status, data = await _as(world, TOKENS[BOT], "GET", f"/repos/{FULL_NAME}/teams")
    assert (status, data["message"]) == (405, "repo is not owned by an organization")
    assert await world.live.client().list_repo_teams() == []


# --- page links from ROOT_URL -----------------------------------------------------------------------------------------

PUBLIC_ROOT = "http://gitea.public.invalid:3000/"


async def test_page_links_point_at_root_url_and_the_client_pages_on_its_own_url() -> None:
    """services/context/api.go genAPILinks builds every Link from setting.AppURL (ROOT_URL) + RequestURI, not
    from the request's host (1.22.3 and 1.26.3). foreman may reach Gitea by another URL: it must keep
    paging there, never sending its token to the ROOT_URL host."""
    from tests.gitea_fixtures import live_emulator

    async with live_emulator(root_url=PUBLIC_ROOT) as live:
        emu = live.emulator
        assert emu.app_url == PUBLIC_ROOT and not live.base_url.startswith(PUBLIC_ROOT.rstrip("/"))
        for n in range(7):
            emu.create_issue(OWNER, REPO, title=f"issue {n}", author="alice")
        async with live.session.get(live.api(f"/repos/{FULL_NAME}/issues?limit=3"), headers=live.auth()) as resp:
            link = resp.headers["Link"]
        assert link.startswith(f"<{PUBLIC_ROOT}api/v1/repos/{FULL_NAME}/issues?") and 'rel="next"' in link
        client = live.client(max_attempts=1)
        titles = [issue.title async for issue in client.iter_issues(limit=3)]
        assert sorted(titles) == sorted(f"issue {n}" for n in range(7))
        pages = [r for r in emu.requests if r.route == "/repos/{owner}/{repo}/issues" and r.method == "GET"]
        assert [dict(r.query).get("page", "1") for r in pages[1:]] == ["1", "2", "3"]


async def test_on_1_22_a_deleted_issue_is_found_by_the_outbox_and_its_leases_end(
    tmp_path: Path, start: Started
) -> None:
    """1.22.3 sends no issues/deleted: the first write to the gone issue (GiteaIssueGone) does the same
    bookkeeping: lease released, the issue's other open entries cancelled, an issue_deleted blocker."""


    async with open_world(tmp_path, start, allocator={"auto": False}) as world:
        emu = world.live.emulator
        emu.version = "1.22.3"
        number = await world.open_issue()
        lease = await _lease_to_author(world, number)
        await world.call(OWNER, "DELETE", f"/issues/{number}")
        assert not [d for d in emu.deliveries if d.action == "deleted"]
        first, second = "test-gone-first", "test-gone-second"
        for key in (first, second):
            await _queue(world, key, number, "comment", _evidence(key))
        await world.settle()
        head = await world.service.outbox.by_key(first)
        after = await world.service.outbox.by_key(second)
        assert head is not None and head.status == "parked" and (head.last_error or "").startswith("GiteaIssueGone")
        assert after is not None and (after.status, after.attempts) == ("parked", 0)
        assert (after.last_error or "").startswith("cancelled: issue_deleted")
        found = await LeaseStore(world.service.db).get(lease.lease_id)
        assert found is not None and (found.status, found.end_reason) == ("released", "issue_deleted")
        assert [b["kind"] for b in await world.store.blockers(FULL_NAME, number)] == ["issue_deleted"]
