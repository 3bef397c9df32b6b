"""The emulator's pull requests as Gitea's source does them: webhooks, pushes over git HTTP, closing keywords."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot.emulator import Emulator, SentWebhook
from bot.emulator.model import EmuIssue
from bot.emulator.pulls import closing_refs
from bot.gitops.environment import git_env
from bot.gitops.remote import auth_env
from bot.gitops.runner import GitRunner
from tests.conftest import SHARED
from tests.gitea_fixtures import (
    BOT,
    HOOK_SECRET,
    OWNER,
    REPO,
    TOKENS,
    LiveEmulator,
    live_emulator,
    seed_acme_widgets,
    webhook_sink,
)

PAYLOADS = SHARED / "gitea" / "payloads"
EVENTS = ["push", "create", "delete", "issues", "pull_request"]


def _hook(live: LiveEmulator, url: str) -> None:
    live.emulator.add_hook(OWNER, REPO, url=url, secret=HOOK_SECRET, events=EVENTS)


def _feature_pull(emu: Emulator, *, notify: bool = False) -> EmuIssue:
    """alice's pull request "Feat" of a new branch ``feat`` (one file) into main."""
    emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
    return emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice", notify=notify)


def _kinds(deliveries: list[SentWebhook]) -> list[tuple[str, str, str | None]]:
    return [(d.event, d.event_type, d.action) for d in deliveries]


def test_closing_keywords_follow_gitea_references(tmp_path: Path) -> None:
    """modules/references/references.go: keyword, optional colon, ONE space, then ``#N`` or ``owner/repo#N``."""
    emu = Emulator(tmp_path)
    seed_acme_widgets(emu)
    repo = emu.repo(OWNER, REPO)
    text = (
        "Closes #1\nfixes: #2, and Resolve acme/widgets#3.\nreopens #6\n"
        "closes#4 xcloses #7 closes  #9 closes other/repo#8 see #10"
    )
    assert closing_refs(repo, text) == [("close", 1), ("close", 2), ("close", 3), ("reopen", 6)]


async def test_opened_with_labels_and_assignees_sends_three_deliveries_in_gitea_order() -> None:
    """services/pull/pull.go NewPullRequest: ``opened`` (pull_request), then ``label_updated``
    (pull_request_label), then one ``assigned`` per assignee (pull_request_assign); X-Gitea-Event pull_request."""
    async with live_emulator() as live, webhook_sink() as sink:
        _hook(live, sink.url)
        emu = live.emulator
        emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
        bug = next(label for label in emu.repo(OWNER, REPO).labels.values() if label.name == "bug")
        response = await live.session.post(
            live.api(f"/repos/{OWNER}/{REPO}/pulls"),
            json={"head": "feat", "base": "main", "title": "Feat", "labels": [bug.id], "assignees": ["alice"]},
            headers=live.auth("alice"),
        )
        assert response.status == 201
        deliveries = await emu.drain_webhooks()
        assert _kinds(deliveries) == [
            ("pull_request", "pull_request", "opened"),
            ("pull_request", "pull_request_label", "label_updated"),
            ("pull_request", "pull_request_assign", "assigned"),
        ]
        opened = deliveries[0].payload
        assert opened["pull_request"]["head"]["sha"] == emu.pull_of(emu.issue(OWNER, REPO, 1)).head_sha()
        assert opened["sender"]["login"] == "alice" and opened["review"] is None
        assert [h.headers["X-Gitea-Event"] for h in sink.received] == ["pull_request"] * 3


async def test_reviews_send_the_review_event_types_with_their_coarse_headers() -> None:
    """services/webhook/notifier.go PullRequestReview: action ``reviewed``; types pull_request_review_approved /
    _rejected / _comment map to X-Gitea-Event pull_request_approved / _rejected / _comment (modules/webhook/type.go);
    ``review`` is ``{type, content}`` and ``requested_reviewer`` the reviewer."""
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _feature_pull(emu)
        _hook(live, sink.url)
        bot = live.client()
        await bot.submit_review(pr.number, "COMMENT", body="looks fine")
        await bot.submit_review(pr.number, "REQUEST_CHANGES", body="rename it")
        await bot.submit_review(pr.number, "APPROVED", body="")
        deliveries = await emu.drain_webhooks()
        assert [(d.event, d.event_type, d.action) for d in deliveries] == [
            ("pull_request_comment", "pull_request_review_comment", "reviewed"),
            ("pull_request_rejected", "pull_request_review_rejected", "reviewed"),
            ("pull_request_approved", "pull_request_review_approved", "reviewed"),
        ]
        assert [d.payload["review"] for d in deliveries] == [
            {"type": "pull_request_review_comment", "content": "looks fine"},
            {"type": "pull_request_review_rejected", "content": "rename it"},
            {"type": "pull_request_review_approved", "content": ""},
        ]
        assert {d.payload["requested_reviewer"]["login"] for d in deliveries} == {BOT}
        assert [h.headers["X-Gitea-Event-Type"] for h in sink.received] == [d.event_type for d in deliveries]


def _clone(url: str, dest: Path) -> GitRunner:
    runner = GitRunner(dest.parent, env=git_env(BOT), timeout_s=30)
    runner.run("clone", "--quiet", url, dest.name, extra_env=auth_env(url, TOKENS["alice"]))
    return GitRunner(dest, env=git_env(BOT), timeout_s=30)


async def test_a_push_over_git_http_synchronizes_the_pr_and_sends_push_and_synchronized(tmp_path: Path) -> None:
    """githttp receive-pack → services/repository/push.go: a new branch sends ``create`` then ``push``; a push
    to a PR's head sends ``push`` and ``pull_request_sync``/``synchronized``; the PR's head sha follows."""
    async with live_emulator(clone_protocol="http") as live, webhook_sink() as sink:
        emu = live.emulator
        _hook(live, sink.url)
        url = (await live.client().get_repo()).clone_url
        work = await asyncio.to_thread(_clone, url, tmp_path / "w")
        env = auth_env(url, TOKENS["alice"])
        (tmp_path / "w" / "a.txt").write_text("a\n")
        work.run("checkout", "-q", "-b", "feat")
        work.run("add", "a.txt")
        work.run("commit", "-q", "-m", "first")
        await asyncio.to_thread(work.run, "push", "-q", "origin", "feat", extra_env=env)
        pr = await live.client("alice").create_pull("feat", title="Feat", base="main")
        (tmp_path / "w" / "b.txt").write_text("b\n")
        work.run("add", "b.txt")
        work.run("commit", "-q", "-m", "second")
        await asyncio.to_thread(work.run, "push", "-q", "origin", "feat", extra_env=env)
        new_head = work.run("rev-parse", "HEAD").strip()
        assert (await live.client().get_pull(pr.number)).head_sha == new_head
        deliveries = await emu.drain_webhooks()
        assert _kinds(deliveries) == [
            ("create", "create", None),
            ("push", "push", None),
            ("pull_request", "pull_request", "opened"),
            ("push", "push", None),
            ("pull_request", "pull_request_sync", "synchronized"),
        ]
        push = deliveries[3].payload
        assert push["ref"] == "refs/heads/feat" and push["after"] == new_head and push["total_commits"] == 1
        assert push["commits"][0]["message"] == "second\n" and push["commits"][0]["added"] == ["b.txt"]
        assert push["pusher"]["login"] == "alice" and push["head_commit"]["id"] == new_head
        assert deliveries[4].payload["pull_request"]["head"]["sha"] == new_head
        assert deliveries[0].payload["ref"] == "feat" and deliveries[0].payload["ref_type"] == "branch"


async def test_merge_sends_push_closed_merged_and_closes_the_issue_with_the_merge_commit() -> None:
    """services/pull/merge.go Merge: the push to the base, ``pull_request``/``closed`` with merged true
    (notifier MergePullRequest), then handleCloseCrossReferences: ``issues``/``closed`` with commit_id."""
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        issue = emu.create_issue(OWNER, REPO, title="bug", author="alice")
        head = emu.create_branch(OWNER, REPO, "fix", files={"f.txt": "f\n"})
        pr = emu.create_pull(OWNER, REPO, head="fix", title="Fix", author="alice", body=f"closes #{issue.number}")
        _hook(live, sink.url)
        await live.client().merge_pull(pr.number, head_commit_id=head)
        deliveries = await emu.drain_webhooks()
        assert _kinds(deliveries) == [
            ("push", "push", None),
            ("pull_request", "pull_request", "closed"),
            ("issues", "issues", "closed"),
        ]
        merge_sha = emu.pull_of(pr).merge_commit_sha
        closed = deliveries[1].payload["pull_request"]
        assert closed["merged"] is True and closed["merge_commit_sha"] == merge_sha and closed["state"] == "closed"
        assert deliveries[2].payload["commit_id"] == merge_sha and deliveries[2].payload["number"] == issue.number
        assert deliveries[0].payload["after"] == merge_sha


async def test_a_stale_pin_leaves_everything_as_it_was() -> None:
    """A merge refused for ``head_commit_id`` (409 "head out of date") moves no branch and sends nothing."""
    async with live_emulator() as live:
        emu = live.emulator
        old = emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice")
        emu.push_commit(OWNER, REPO, "feat", {"g.txt": "g\n"}, pusher="alice")
        main = (await live.client().get_branch("main")).commit_id
        response = await live.session.post(
            live.api(f"/repos/{OWNER}/{REPO}/pulls/{pr.number}/merge"),
            json={"Do": "merge", "head_commit_id": old},
            headers=live.auth(),
        )
        assert response.status == 409 and (await response.json())["message"] == "head out of date"
        assert (await live.client().get_branch("main")).commit_id == main
        assert emu.pull_of(pr).merged is None and pr.closed is None


def _keys(name: str) -> tuple[set[str], set[str]]:
    data: dict[str, Any] = json.loads((PAYLOADS / name).read_text())
    return set(data), set(data["pull_request"])


@pytest.mark.needs_shared
async def test_pull_request_payloads_have_every_key_of_the_real_ones() -> None:
    """Realism: every top-level and ``pull_request`` key of the real 1.2x samples (go-playground opened,
    woodpecker synchronized, zulip's ≥1.23 PR comment) is in the emulator's payloads."""
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        _hook(live, sink.url)
        pr = _feature_pull(emu, notify=True)
        emu.push_commit(OWNER, REPO, "feat", {"g.txt": "g\n"}, pusher="alice")
        emu.create_comment(OWNER, REPO, pr.number, author="bob", body="hi", notify=True)
        deliveries = await emu.drain_webhooks()
        by_action = {(d.event_type, d.action): d.payload for d in deliveries}
        for name, key in (
            ("pull_request-opened--go-playground.json", ("pull_request", "opened")),
            ("pull_request-synchronized--woodpecker-gitea.json", ("pull_request_sync", "synchronized")),
        ):
            top, pull = _keys(name)
            ours = by_action[key]
            assert top - set(ours) == set(), name
            assert pull - set(ours["pull_request"]) == set(), name
        _, pull = _keys("issue_comment-deleted-on-pr--zulip.json")
        comment = by_action[("pull_request_comment", "created")]
        # additions/deletions/changed_files and the head's repo are there too: the emulator computes them.
        assert pull - set(comment["pull_request"]) == set()
        assert set(comment["pull_request"]["head"]) == {"label", "ref", "sha", "repo_id", "repo"}


async def test_on_1_22_review_payloads_have_no_requested_reviewer_and_no_viewer() -> None:
    """v1.22.3 notifier.go PullRequestReview: ``ToAPIPullRequest(ctx, pr, nil)`` and no ``RequestedReviewer``
    (both came with #26178 in 1.23.0): the PR's poster shows the placeholder e-mail."""
    async with live_emulator(version="1.22.3") as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _feature_pull(emu)
        _hook(live, sink.url)
        await live.client().submit_review(pr.number, "APPROVED")
        [delivery] = await emu.drain_webhooks()
        assert delivery.payload["requested_reviewer"] is None
        assert delivery.payload["pull_request"]["user"]["email"].startswith("alice@noreply.")
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _feature_pull(emu)
        _hook(live, sink.url)
        await live.client().submit_review(pr.number, "APPROVED")
        [delivery] = await emu.drain_webhooks()
        assert delivery.payload["requested_reviewer"]["login"] == BOT
        assert delivery.payload["pull_request"]["user"]["email"] == emu.user("alice").email


async def test_state_and_title_changes_of_a_pr_are_pull_request_events() -> None:
    """notifier.go IssueChangeStatus / IssueChangeTitle on a PR: ``PullRequestPayload`` with type
    ``pull_request`` and actions closed, reopened, edited (``changes.title.from``)."""
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _feature_pull(emu)
        _hook(live, sink.url)
        bot = live.client()
        await bot.edit_issue(pr.number, state="closed")
        await bot.edit_issue(pr.number, state="open")
        await bot.edit_issue(pr.number, title="Feat, renamed")
        deliveries = await emu.drain_webhooks()
        assert _kinds(deliveries) == [
            ("pull_request", "pull_request", "closed"),
            ("pull_request", "pull_request", "reopened"),
            ("pull_request", "pull_request", "edited"),
        ]
        assert deliveries[0].payload["pull_request"]["merged"] is False
        assert deliveries[2].payload["changes"]["title"]["from"] == "Feat"
        assert (await bot.get_pull(pr.number)).state == "open"


async def test_deleting_a_branch_sends_delete_then_closes_its_pr() -> None:
    """branch.go DeleteBranch → push.go pushDeleteBranch: ``delete`` (ref the short name, no ``push``), then
    AdjustPullsCausedByBranchDeleted closes the open PR (``pull_request``/``closed``, not merged)."""
    async with live_emulator() as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _feature_pull(emu)
        _hook(live, sink.url)
        await live.client().delete_branch("feat")
        deliveries = await emu.drain_webhooks()
        assert _kinds(deliveries) == [("delete", "delete", None), ("pull_request", "pull_request", "closed")]
        assert deliveries[0].payload["ref"] == "feat" and deliveries[0].payload["pusher_type"] == "user"
        assert deliveries[1].payload["pull_request"]["merged"] is False and pr.closed is not None


@pytest.mark.parametrize("version", ["1.22.3", "1.26.3"])
async def test_a_work_in_progress_title_is_a_draft_gitea_refuses_to_merge(version: str) -> None:
    """models/issues/pull.go ``HasWorkInProgressPrefix`` (default prefixes ``WIP:``, ``[WIP]``, any case):
    ``draft`` true in the PR's JSON and the issue's ``pull_request``; services/pull/check.go ``CheckPullMergeable``
    answers 405 "Work in progress PRs cannot be merged" (after the permission check); retitled, it merges."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        head = emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="[wip] Feat", author="alice")
        client = live.client()
        pulled = await (await live.session.get(live.api(f"/repos/{OWNER}/{REPO}/pulls/{pr.number}"),
                                               headers=live.auth())).json()
        as_issue = await (await live.session.get(live.api(f"/repos/{OWNER}/{REPO}/issues/{pr.number}"),
                                                 headers=live.auth())).json()
        assert pulled["draft"] is True and as_issue["pull_request"]["draft"] is True
        response = await live.session.post(live.api(f"/repos/{OWNER}/{REPO}/pulls/{pr.number}/merge"),
                                           json={"Do": "merge", "head_commit_id": head}, headers=live.auth())
        assert response.status == 405
        assert (await response.json())["message"] == "Work in progress PRs cannot be merged"
        assert emu.pull_of(pr).merged is None
        await live.session.patch(live.api(f"/repos/{OWNER}/{REPO}/issues/{pr.number}"), json={"title": "Feat"},
                                 headers=live.auth())
        assert (await client.get_pull(pr.number)).title == "Feat"
        await client.merge_pull(pr.number, head_commit_id=head)
        assert emu.pull_of(pr).merged is not None
