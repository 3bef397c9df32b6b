"""The Gitea client's pull-request methods against the emulator over real HTTP: create, list, review, merge."""

from __future__ import annotations

import pytest

from bot.emulator import pullgit
from bot.gitea import GiteaClient, GiteaConflict, GiteaForbidden, GiteaInvalid, GiteaNotFound
from tests.gitea_fixtures import BOT, OWNER, REPO, LiveEmulator, live_emulator


def _branch(live: LiveEmulator, name: str, files: dict[str, str]) -> str:
    return live.emulator.create_branch(OWNER, REPO, name, files=files, message=f"work on {name}")


async def test_create_get_and_list_pulls_with_paging() -> None:
    """routers/api/v1/repo/pull.go CreatePullRequest / GetPullRequest / ListPullRequests."""
    async with live_emulator() as live:
        emu = live.emulator
        issue = emu.create_issue(OWNER, REPO, title="the issue", author="alice")
        sha = _branch(live, "issue/1-x", {"x.txt": "x\n"})
        alice = live.client("alice")
        pr = await alice.create_pull("issue/1-x", title="Fix x", base="main", body=f"Closes #{issue.number}")
        # A PR takes the next number of the issue sequence (models/issues/issue.go NewIssueWithIndex).
        assert pr.number == issue.number + 1 and pr.state == "open" and pr.user.login == "alice"
        assert (pr.head_ref, pr.head_sha, pr.base_ref) == ("issue/1-x", sha, "main")
        assert pr.base_sha == (await alice.get_branch("main")).commit_id
        assert pr.mergeable and not pr.merged and pr.merge_commit_sha is None and pr.merged_by is None
        assert pr.raw["id"] != pr.number and pr.raw["merge_base"] == pr.base_sha
        assert (pr.raw["additions"], pr.raw["changed_files"]) == (1, 1)
        assert (await alice.get_pull(pr.number)).head_sha == sha
        with pytest.raises(GiteaNotFound):
            await alice.get_pull(issue.number)  # a plain issue is no pull request
        with pytest.raises(GiteaNotFound):
            await alice.get_pull(999)
        for n in range(3):
            _branch(live, f"more-{n}", {f"m{n}.txt": "m\n"})
            await alice.create_pull(f"more-{n}", title=f"more {n}", base="main")
        listed = await alice.list_pulls(limit=2)
        assert [p.number for p in listed] == [pr.number + 3, pr.number + 2, pr.number + 1, pr.number]
        assert await alice.list_pulls(state="closed") == []
        assert len(await alice.list_pulls(base_branch="other")) == 0
        # The emulator read the issue listing the same way: the PR is an issue with a pull_request.
        assert (await alice.get_issue(pr.number)).is_pull


async def test_create_pull_refusals_as_gitea() -> None:
    """A second open PR for the same head/base is 409 ErrPullRequestAlreadyExists; head == base is 422; an
    unknown branch 404; a reader may open one (only read on code and pulls is needed)."""
    async with live_emulator() as live:
        _branch(live, "feat", {"f.txt": "f\n"})
        bot = live.client()
        first = await bot.create_pull("feat", title="one", base="main")
        with pytest.raises(GiteaConflict) as twice:
            await bot.create_pull("feat", title="two", base="main")
        assert "pull request already exists for these targets" in twice.value.message
        assert f"issue_id: {first.number}" in twice.value.message
        with pytest.raises(GiteaInvalid) as same:
            await bot.create_pull("main", title="x", base="main")
        assert "no changes between the head and the base" in same.value.message
        with pytest.raises(GiteaNotFound):
            await bot.create_pull("missing", title="x", base="main")
        _branch(live, "bob-work", {"b.txt": "b\n"})
        by_reader = await live.client("bob").create_pull("bob-work", title="by bob", base="main")
        assert by_reader.user.login == "bob"
        # A private repository is invisible (404) to an account without access, as every repository route.
        live.emulator.repo(OWNER, REPO).private = True
        live.emulator.add_user("mallory", token="tok-mallory-0012")
        mallory = GiteaClient(
            live.session, base_url=live.base_url, token="tok-mallory-0012", owner=OWNER, repo=REPO, backoff_base_s=0.005
        )
        with pytest.raises(GiteaNotFound):
            await mallory.list_pulls()
        with pytest.raises(GiteaNotFound):
            await mallory.get_pull(first.number)


async def test_reviews_self_review_refused_and_stale_after_push() -> None:
    """pull_review.go preparePullReviewType: the poster may not approve ("approve your own pull is not allowed")
    nor request changes; REQUEST_CHANGES needs a body. services/pull/review.go: a verdict on an older commit
    is stale; a push marks earlier reviews stale."""
    async with live_emulator() as live:
        emu = live.emulator
        head = _branch(live, "feat", {"f.txt": "f\n"})
        alice, bot, bob = live.client("alice"), live.client(), live.client("bob")
        pr = await alice.create_pull("feat", title="feat", base="main")
        with pytest.raises(GiteaInvalid) as own:
            await alice.submit_review(pr.number, "APPROVED")
        assert own.value.message == "approve your own pull is not allowed"
        with pytest.raises(GiteaInvalid) as own_reject:
            await alice.submit_review(pr.number, "REQUEST_CHANGES", body="no")
        assert own_reject.value.message == "reject your own pull is not allowed"
        with pytest.raises(GiteaInvalid) as empty:
            await bot.submit_review(pr.number, "REQUEST_CHANGES")
        assert empty.value.message == "review event REQUEST_CHANGES requires a body"
        comment = await alice.submit_review(pr.number, "COMMENT", body="a note on my own PR")
        assert comment.state == "COMMENT" and not comment.official
        approval = await bot.submit_review(pr.number, "APPROVED", commit_id=head)
        assert (approval.state, approval.commit_id, approval.stale, approval.official) == (
            "APPROVED",
            head,
            False,
            True,
        )
        # A reader's verdict counts as a review but is not official (IsOfficialReviewer: write on code).
        changes = await bob.submit_review(pr.number, "REQUEST_CHANGES", body="please rename")
        assert changes.state == "REQUEST_CHANGES" and changes.official is False and changes.commit_id == head
        emu.push_commit(OWNER, REPO, "feat", {"g.txt": "g\n"}, pusher="alice")
        reviews = await bob.list_reviews(pr.number)
        assert [r.state for r in reviews] == ["COMMENT", "APPROVED", "REQUEST_CHANGES"]
        assert [r.stale for r in reviews] == [True, True, True]
        old = await bot.submit_review(pr.number, "APPROVED", commit_id=head)
        assert old.stale is True


async def test_merge_with_the_approved_head_closes_the_pr_and_its_issue() -> None:
    """services/pull/merge.go: a merge commit on the base, merged/merge_commit_sha/merged_by recorded, the PR
    closed, the issue named by "Closes #N" closed; GET .../merge is 204 after, 404 before."""
    async with live_emulator() as live:
        emu = live.emulator
        issue = emu.create_issue(OWNER, REPO, title="bug", author="alice")
        head = _branch(live, "fix", {"fix.txt": "fixed\n"})
        alice, bot = live.client("alice"), live.client()
        pr = await alice.create_pull("fix", title="Fix the bug", base="main", body=f"Fixes: #{issue.number}\n")
        assert await bot.is_merged(pr.number) is False
        await bot.submit_review(pr.number, "APPROVED", commit_id=head)
        await bot.merge_pull(pr.number, style="merge", head_commit_id=head)
        assert await bot.is_merged(pr.number) is True
        merged = await bot.get_pull(pr.number)
        assert merged.merged and merged.state == "closed" and merged.merged_by is not None
        assert merged.merged_by.login == BOT and merged.merged_at is not None and not merged.mergeable
        main = await bot.get_branch("main")
        assert merged.merge_commit_sha == main.commit_id
        assert main.commit_message.startswith(f"Merge pull request 'Fix the bug' (#{pr.number}) from fix into main")
        path = emu.repo(OWNER, REPO).path
        assert pullgit.rev(path, f"{main.commit_id}^2") == head
        assert (await bot.get_issue(issue.number)).state == "closed"
        with pytest.raises(GiteaInvalid) as again:
            await bot.merge_pull(pr.number, head_commit_id=head)
        assert again.value.status == 405 and again.value.message == "The PR is already merged"
        with pytest.raises(GiteaInvalid) as late:
            await live.client("bob").submit_review(pr.number, "APPROVED")
        assert late.value.message == "can't submit review for a closed or merged PR"


async def test_merge_refusals_stale_pin_non_writer_closed_and_conflicts() -> None:
    """MergePullRequest: a head_commit_id that is not the head is 409 "head out of date"; a reader is 405 "User
    not allowed to merge PR"; a closed PR is 404; a conflicting PR 405 "Please try again later"."""
    async with live_emulator() as live:
        emu = live.emulator
        approved = _branch(live, "feat", {"f.txt": "f\n"})
        alice, bot, bob = live.client("alice"), live.client(), live.client("bob")
        pr = await alice.create_pull("feat", title="feat", base="main")
        await bot.submit_review(pr.number, "APPROVED", commit_id=approved)
        emu.push_commit(OWNER, REPO, "feat", {"f2.txt": "unreviewed\n"}, pusher="alice")
        with pytest.raises(GiteaConflict) as stale:
            await bot.merge_pull(pr.number, head_commit_id=approved)
        assert stale.value.message == "head out of date"
        assert not await bot.is_merged(pr.number)
        with pytest.raises(GiteaInvalid) as reader:
            await bob.merge_pull(pr.number)
        assert reader.value.message == "User not allowed to merge PR"
        await bot.edit_issue(pr.number, state="closed")
        with pytest.raises(GiteaNotFound):
            await bot.merge_pull(pr.number)
        emu.create_branch(OWNER, REPO, "left", files={"README.md": "left\n"})
        emu.create_branch(OWNER, REPO, "right", files={"README.md": "right\n"})
        emu.push_commit(OWNER, REPO, "main", {"README.md": "main moved\n"}, pusher=BOT)
        conflicting = await alice.create_pull("left", title="left", base="main")
        assert conflicting.mergeable is False
        with pytest.raises(GiteaInvalid) as conflict:
            await bot.merge_pull(conflicting.number)
        assert conflict.value.message == "Please try again later"


@pytest.mark.parametrize("style", ["squash", "rebase", "fast-forward-only", "rebase-merge"])
async def test_merge_styles_move_the_base_as_gitea_does(style: str) -> None:
    """merge_squash.go: one commit with the base as its only parent; merge_rebase.go: the commits replayed;
    merge_ff_only.go: the base moves to the head."""
    async with live_emulator() as live:
        emu = live.emulator
        head = _branch(live, "feat", {"a.txt": "a\n"})
        head = emu.create_branch(OWNER, REPO, "feat", files={"b.txt": "b\n"})
        if style != "fast-forward-only":
            emu.push_commit(OWNER, REPO, "main", {"c.txt": "c\n"}, pusher=BOT)
        bot = live.client()
        pr = await live.client("alice").create_pull("feat", title="feat", base="main")
        before = (await bot.get_branch("main")).commit_id
        await bot.merge_pull(pr.number, style=style, head_commit_id=head)  # type: ignore[arg-type]
        path = emu.repo(OWNER, REPO).path
        tip = (await bot.get_branch("main")).commit_id
        assert (await bot.get_pull(pr.number)).merge_commit_sha == tip
        if style == "squash":
            assert pullgit.rev(path, f"{tip}^") == before and pullgit.rev(path, f"{tip}^2") is None
            [fact] = pullgit.commit_facts(path, [tip])
            alice = emu.user("alice")
            assert (fact["author_email"], fact["committer_email"]) == (alice.email, emu.user(BOT).email)
            assert fact["message"] == f"feat (#{pr.number})\n\nCo-authored-by: alice <{alice.email}>\n" + (
                f"Co-committed-by: alice <{alice.email}>\n"
            )
        elif style == "fast-forward-only":
            assert tip == head
        elif style == "rebase":
            assert pullgit.rev(path, f"{tip}~2") == before and tip != head
        else:
            assert pullgit.rev(path, f"{tip}^") == before and pullgit.rev(path, f"{tip}^2") != head


async def test_delete_branch_rules_and_closing_of_its_pulls() -> None:
    """routers/api/v1/repo/branch.go DeleteBranch: 204; the default branch 403; protected 403; missing 404;
    a reader 403 (reqRepoWriter). AdjustPullsCausedByBranchDeleted closes the open PRs of the branch."""
    async with live_emulator() as live:
        emu = live.emulator
        _branch(live, "gone", {"g.txt": "g\n"})
        bot = live.client()
        pr = await bot.create_pull("gone", title="will lose its branch", base="main")
        with pytest.raises(GiteaForbidden):
            await live.client("bob").delete_branch("gone")
        with pytest.raises(GiteaForbidden) as default:
            await bot.delete_branch("main")
        assert default.value.message == "can not delete default or pull request target branch"
        emu.create_branch(OWNER, REPO, "release", files={"r.txt": "r\n"})
        emu.protect_branch(OWNER, REPO, "release")
        with pytest.raises(GiteaForbidden) as protected:
            await bot.delete_branch("release")
        assert protected.value.message == "branch protected"
        head = (await bot.get_pull(pr.number)).head_sha
        await bot.delete_branch("gone")
        with pytest.raises(GiteaNotFound):
            await bot.delete_branch("gone")
        closed = await bot.get_pull(pr.number)
        assert closed.state == "closed" and not closed.merged
        # services/convert/pull.go: without the branch, head is read from refs/pull/N/head.
        assert (closed.head_ref, closed.head_sha) == (f"refs/pull/{pr.number}/head", head)


async def test_on_1_22_already_merged_has_an_empty_message_and_json_differs() -> None:
    """v1.22.3 pull.go MergePullRequest: ``ctx.Error(405, "PR already merged", "")`` (empty message); the
    PullRequest JSON has no requested_reviewers_teams / content_version and null reviewers (structs at 1.22.3)."""
    async with live_emulator(version="1.22.3") as live:
        head = _branch(live, "feat", {"f.txt": "f\n"})
        bot = live.client()
        pr = await live.client("alice").create_pull("feat", title="feat", base="main")
        assert "requested_reviewers_teams" not in pr.raw and "content_version" not in pr.raw
        assert pr.raw["requested_reviewers"] is None and pr.raw["review_comments"] == 0
        await bot.merge_pull(pr.number, head_commit_id=head)
        with pytest.raises(GiteaInvalid) as again:
            await bot.merge_pull(pr.number)
        assert again.value.status == 405
        assert live.emulator.requests[-1].response_json["message"] == ""  # the client shows the reason phrase
        with pytest.raises(GiteaForbidden) as default:
            await bot.delete_branch("main")
        assert default.value.message == "can not delete default branch"


@pytest.mark.parametrize("version", ["1.26.3", "1.22.3"])
async def test_list_pulls_state_filters_sort_and_version_gates(version: str) -> None:
    """models/issues/pull_list.go listPullRequestStatement: only ``open``/``closed`` filter (no state lists all);
    applySorts ``oldest``; ``poster`` from 1.23 (unknown 400), ``base_branch`` from 1.24 (ignored before)."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        for name in ("a", "b", "c"):
            emu.create_branch(OWNER, REPO, name, files={f"{name}.txt": name})
        emu.create_branch(OWNER, REPO, "dev", files={"dev.txt": "d"})
        a = emu.create_pull(OWNER, REPO, head="a", title="a", author="alice")
        b = emu.create_pull(OWNER, REPO, head="b", title="b", author="bob")
        c = emu.create_pull(OWNER, REPO, head="c", title="c", author="alice", base="dev")
        emu.edit_issue(OWNER, REPO, b.number, actor=BOT, state="closed")
        url = live.api(f"/repos/{OWNER}/{REPO}/pulls")

        async def numbers(**query: str) -> list[int]:
            async with live.session.get(url, params=query, headers=live.auth()) as response:
                assert response.status == 200, await response.text()
                return [p["number"] for p in await response.json()]

        assert await numbers() == [c.number, b.number, a.number]
        assert await numbers(state="all") == await numbers()
        assert await numbers(state="open") == [c.number, a.number]
        assert await numbers(state="closed") == [b.number]
        assert await numbers(sort="oldest") == [a.number, b.number, c.number]
        by_base = await numbers(base_branch="dev")
        assert by_base == ([c.number] if version == "1.26.3" else [c.number, b.number, a.number])
        by_poster = await numbers(poster="alice")
        assert by_poster == ([c.number, a.number] if version == "1.26.3" else [c.number, b.number, a.number])
        async with live.session.get(url, params={"poster": "nobody"}, headers=live.auth()) as response:
            assert response.status == (400 if version == "1.26.3" else 200)
        assert [p.number for p in await live.client().list_pulls(state="all", limit=1)] == [
            c.number,
            b.number,
            a.number,
        ]
