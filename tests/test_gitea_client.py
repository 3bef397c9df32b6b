"""GiteaClient against the live emulator: retries, typed errors, pagination, label rules, token hygiene."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bot.gitea import (
    GiteaClient,
    GiteaConflict,
    GiteaError,
    GiteaForbidden,
    GiteaInvalid,
    GiteaNotFound,
    GiteaUnavailable,
)
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS, LiveEmulator, live_emulator
from tests.support import free_port

ISSUE = "/repos/{owner}/{repo}/issues/{index}"
ISSUES = "/repos/{owner}/{repo}/issues"
COMMENTS = "/repos/{owner}/{repo}/issues/{index}/comments"


@pytest.fixture
async def live() -> AsyncIterator[LiveEmulator]:
    async with live_emulator() as env:
        yield env


def _requests_to(live: LiveEmulator, method: str, route: str) -> int:
    return sum(1 for r in live.emulator.requests if r.method == method and r.route == route)


async def test_retries_5xx_then_succeeds(live: LiveEmulator) -> None:
    """5xx answers are retried with backoff until one succeeds."""
    live.emulator.create_issue(OWNER, REPO, title="flaky", author="alice")
    live.emulator.faults.fail("GET", ISSUE, status=503, times=2)
    issue = await live.client().get_issue(1)
    assert issue.title == "flaky"
    assert _requests_to(live, "GET", ISSUE) == 3


async def test_unavailable_after_retries_are_exhausted(live: LiveEmulator) -> None:
    """After max_attempts 5xx answers the client raises GiteaUnavailable carrying the last status."""
    live.emulator.create_issue(OWNER, REPO, title="down", author="alice")
    live.emulator.faults.fail("GET", ISSUE, status=502, times=10, message="bad gateway")
    with pytest.raises(GiteaUnavailable) as caught:
        await live.client(max_attempts=3).get_issue(1)
    assert caught.value.status == 502
    assert "bad gateway" in str(caught.value)
    assert _requests_to(live, "GET", ISSUE) == 3


async def test_timeout_is_retried_per_attempt(live: LiveEmulator) -> None:
    """Each attempt is bounded by timeout_s; a slow answer is abandoned and the request retried."""
    live.emulator.create_issue(OWNER, REPO, title="slow", author="alice")
    live.emulator.faults.delay("GET", ISSUE, 0.6, times=1)
    issue = await live.client(timeout_s=0.2).get_issue(1)
    assert issue.title == "slow"
    assert _requests_to(live, "GET", ISSUE) == 2


async def test_connection_refused_is_unavailable() -> None:
    """Nothing listening: GiteaUnavailable with no status, after every attempt."""
    port = free_port()
    async with aiohttp.ClientSession() as session:
        client = GiteaClient(
            session,
            base_url=f"http://127.0.0.1:{port}",
            token="tok-x",
            owner=OWNER,
            repo=REPO,
            max_attempts=2,
            backoff_base_s=0.001,
        )
        with pytest.raises(GiteaUnavailable) as caught:
            await client.get_repo()
    assert caught.value.status is None
    assert "2 attempts" in str(caught.value)


async def test_a_post_whose_answer_is_lost_is_not_retried_so_it_lands_once(live: LiveEmulator) -> None:
    """A POST (not idempotent) gets one attempt: a lost answer raises GiteaUnavailable and the write landed once.

    Idempotent methods are still retried (see the 5xx tests); the outbox retries POSTs after a marker search."""
    live.emulator.create_issue(OWNER, REPO, title="outbox", author="alice")
    live.emulator.faults.drop_after_store("POST", COMMENTS)
    with pytest.raises(GiteaUnavailable):
        await live.client().create_comment(1, "hello")
    bodies = [c.body for c in live.emulator.issue(OWNER, REPO, 1).comments]
    assert bodies == ["hello"]


async def test_typed_errors_by_meaning(live: LiveEmulator) -> None:
    """404 → GiteaNotFound, 401/403 → GiteaForbidden, 400/422 → GiteaInvalid with Gitea's message, 409 → Conflict."""
    emu = live.emulator
    emu.create_issue(OWNER, REPO, title="mine", author="alice")
    own = emu.create_comment(OWNER, REPO, 1, author="alice", body="alice's words")
    bot, bob = live.client(), live.client("bob")
    with pytest.raises(GiteaNotFound) as missing:
        await bot.get_issue(404)
    assert missing.value.status == 404
    with pytest.raises(GiteaForbidden) as forbidden:
        await bob.edit_comment(own.id, "bob was here")
    assert forbidden.value.status == 403
    with pytest.raises(GiteaForbidden):
        await bob.get_user_permission("alice")
    with pytest.raises(GiteaInvalid) as invalid:
        await bot.remove_label(1, 9999)
    assert invalid.value.status == 422
    assert "label does not exist" in invalid.value.message
    with pytest.raises(GiteaConflict):
        await bot.edit_issue(1, body="new", content_version=41)
    stranger = GiteaClient(live.session, base_url=live.base_url, token="not-a-token", owner=OWNER, repo=REPO)
    with pytest.raises(GiteaForbidden) as unauthorised:
        await stranger.get_repo()
    assert unauthorised.value.status == 401
    assert all(isinstance(e.value, GiteaError) for e in (missing, forbidden, invalid, unauthorised))


async def test_pagination_follows_link_next_across_three_pages(live: LiveEmulator) -> None:
    """list_issues follows Link rel="next" (absolute URLs) until there is none; newest first."""
    for n in range(7):
        live.emulator.create_issue(OWNER, REPO, title=f"issue {n}", author="alice")
    live.emulator.create_issue(OWNER, REPO, title="a PR", author="alice", pull=True)
    issues = await live.client().list_issues(limit=3)
    assert [i.number for i in issues] == [7, 6, 5, 4, 3, 2, 1]
    pages = [dict(r.query).get("page", "1") for r in live.emulator.requests if r.route == ISSUES]
    assert pages == ["1", "2", "3"]
    with_prs = await live.client().list_issues(type_=None, limit=50)
    assert (with_prs[0].number, with_prs[0].is_pull) == (8, True)


async def test_list_issues_label_filter_and_state(live: LiveEmulator) -> None:
    """Label filters are names with AND semantics; closed issues need state=closed/all."""
    emu = live.emulator
    emu.create_issue(OWNER, REPO, title="both", author="alice", labels=["bug", "priority:p0"])
    emu.create_issue(OWNER, REPO, title="bug only", author="alice", labels=["bug"])
    emu.create_issue(OWNER, REPO, title="closed bug", author="alice", labels=["bug"], closed=True)
    client = live.client()
    assert [i.title for i in await client.list_issues(labels=["bug", "priority:p0"])] == ["both"]
    assert [i.title for i in await client.list_issues(labels=["bug"], state="closed")] == ["closed bug"]
    assert len(await client.list_issues(state="all")) == 3


async def test_repo_labels_page_until_short_page_without_link(live: LiveEmulator) -> None:
    """Repo labels carry X-Total-Count and no Link header; the client pages by page/limit."""
    labels = await live.client().list_repo_labels(page_size=2)
    assert sorted(label.name for label in labels) == sorted(
        ["bug", "feature", "status/ready", "status/in-progress", "priority:p0"]
    )
    label_requests = [r for r in live.emulator.requests if r.route == "/repos/{owner}/{repo}/labels"]
    assert [dict(r.query)["page"] for r in label_requests] == ["1", "2", "3"]
    assert all("Link" not in r.response_headers for r in label_requests)
    assert label_requests[0].response_headers["X-Total-Count"] == "5"


async def test_label_mix_is_rejected_before_sending(live: LiveEmulator) -> None:
    """Labels must be all ids or all names: a mix raises GiteaInvalid locally and nothing is sent."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    before = len(live.emulator.requests)
    client = live.client()
    mixed: list[int | str] = [1, "bug"]
    with pytest.raises(GiteaInvalid):
        await client.add_labels(1, mixed)  # type: ignore[arg-type]
    with pytest.raises(GiteaInvalid):
        await client.replace_labels(1, "bug")
    with pytest.raises(GiteaInvalid):
        await client.add_labels(1, [True])
    assert len(live.emulator.requests) == before


async def test_labels_by_name_and_id(live: LiveEmulator) -> None:
    """add/replace accept names or ids and return the full list; unknown names are ignored."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    client = live.client()
    after_add = await client.add_labels(1, ["bug", "no-such-label"])
    assert [label.name for label in after_add] == ["bug"]
    feature = next(label for label in await client.list_repo_labels() if label.name == "feature")
    after_replace = await client.replace_labels(1, [feature.id])
    assert [label.name for label in after_replace] == ["feature"]
    await client.remove_label(1, feature.id)
    assert await client.list_issue_labels(1) == []


async def test_token_never_appears_in_logs_or_errors(live: LiveEmulator, caplog: pytest.LogCaptureFixture) -> None:
    """The token is sent only in the Authorization header: never logged, never in an exception."""
    caplog.set_level(logging.DEBUG)
    token = TOKENS[BOT]
    client = live.client(max_attempts=2)
    live.emulator.faults.fail("GET", ISSUE, status=500, times=5)
    failures: list[BaseException] = []
    for call in (client.get_issue(1), client.get_issue(999), client.get_comment(424242)):
        try:
            await call
        except GiteaError as exc:
            failures.append(exc)
    assert len(failures) == 3
    texts = [caplog.text, repr(client), *(str(e) for e in failures), *(repr(e) for e in failures)]
    texts += [repr(e.__cause__) for e in failures if e.__cause__ is not None]
    assert all(token not in text for text in texts)
    assert "attempt 1/2 answered 500" in caplog.text


async def test_get_comment_of_a_timeline_event_is_not_found(live: LiveEmulator) -> None:
    """Timeline items (label changes) take comment ids; Gitea answers 204 and the client says not found."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    await live.client().add_labels(1, ["bug"])
    timeline_id = live.emulator.issue(OWNER, REPO, 1).timeline[-1].id
    with pytest.raises(GiteaNotFound):
        await live.client().get_comment(timeline_id)


async def test_branch_with_slashes_and_typed_values(live: LiveEmulator) -> None:
    """Branch names may hold slashes; values are typed and keep the raw JSON."""
    sha = live.emulator.create_branch(OWNER, REPO, "issue/7-fix", files={"fix.txt": "x"}, message="fix")
    branch = await live.client().get_branch("issue/7-fix")
    assert branch.commit_id == sha
    assert branch.raw["commit"]["id"] == sha
    repo = await live.client().get_repo()
    assert repo.default_branch == "main"
    assert repo.clone_url.startswith("file://")
    assert (await live.client().get_own_user()).login == BOT
    with pytest.raises(GiteaNotFound):
        await live.client().get_branch("no/such/branch")
