"""The emulator's asynchronous conflict checks (services/pull/check.go), the merge's git refusals
(routers/api/v1/repo/pull.go ``MergePullRequest`` after services/pull/merge.go ``Merge``) and updating a PR from
its base (``UpdatePullRequest``, services/pull/update.go)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from bot.emulator import Emulator
from bot.emulator.model import EmuIssue
from bot.emulator.pullgit import branch_sha
from tests.gitea_fixtures import BOT, HOOK_SECRET, OWNER, REPO, LiveEmulator, live_emulator, webhook_sink

VERSIONS = ["1.22.3", "1.26.3"]


async def _call(live: LiveEmulator, method: str, path: str, *, login: str = BOT, body: Any = None) -> tuple[int, Any]:
    url = live.api(f"/repos/{OWNER}/{REPO}{path}")
    async with live.session.request(method, url, json=body, headers=live.auth(login)) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


def _pull(emu: Emulator, files: dict[str, str] | None = None) -> EmuIssue:
    emu.create_branch(OWNER, REPO, "feat", files=files or {"f.txt": "f\n"})
    return emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice")


async def _mergeable(live: LiveEmulator, number: int) -> bool:
    status, data = await _call(live, "GET", f"/pulls/{number}")
    assert status == 200
    return bool(data["mergeable"])


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_held_check_keeps_the_pr_checking_and_unmergeable_until_released(version: str) -> None:
    """A push queues a conflict check (``AddTestPullRequestTask`` → ``StartPullRequestCheckDelayable``): while it
    runs, ``mergeable`` is false (models/issues/pull.go ``Mergeable``) and merging is 405 "Please try again
    later" (``!CanAutoMerge()`` → ``ErrNotMergeableState``); pushes to the base re-check PRs on it too."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        assert await _mergeable(live, pr.number)
        emu.hold_mergeability_checks()
        emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        assert not await _mergeable(live, pr.number)
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "merge"})
        assert (status, data["message"]) == (405, "Please try again later")
        emu.release_mergeability_checks()
        assert await _mergeable(live, pr.number)
        assert (await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "merge"}))[0] == 200


async def test_a_delayed_check_finishes_on_its_own() -> None:
    """``mergeability_delay_s``: the check ends that long after the push, on the event loop."""
    async with live_emulator() as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.mergeability_delay_s = 0.3
        emu.push_commit(OWNER, REPO, "feat", {"g.txt": "g\n"}, pusher="alice")
        assert not await _mergeable(live, pr.number)
        await asyncio.sleep(0.6)
        assert await _mergeable(live, pr.number)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_conflicting_pr_is_not_mergeable_and_merging_says_try_again_later(version: str) -> None:
    """services/pull/patch.go ``checkConflicts``: status conflict, ``mergeable`` false; ``CheckPullMergeable``
    answers ``ErrNotMergeableState`` → 405 "Please try again later"."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        emu.create_branch(OWNER, REPO, "feat", files={"README.md": "theirs\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice")
        emu.push_commit(OWNER, REPO, "main", {"README.md": "ours\n"}, pusher=OWNER)
        assert not await _mergeable(live, pr.number)
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "merge"})
        assert (status, data["message"]) == (405, "Please try again later")


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_work_in_progress_pr_is_not_mergeable(version: str) -> None:
    """services/convert/pull.go ``Mergeable: pr.Mergeable(ctx)``, which is false for a work-in-progress title."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="WIP: Feat", author="alice")
        assert not await _mergeable(live, pr.number)
        emu.edit_issue(OWNER, REPO, pr.number, actor="alice", title="Feat")
        assert await _mergeable(live, pr.number)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_base_moved_before_the_merge_push_is_merge_push_out_of_date(version: str) -> None:
    """``git.ErrPushOutOfDate`` → 409 "merge push out of date"; the PR stays open, the base keeps the other push."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.race_next_merge_push(OWNER, REPO, files={"race.txt": "r\n"}, pusher=OWNER)
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "merge"})
        assert (status, data["message"]) == (409, "merge push out of date")
        assert emu.pull_of(pr).merged is None and pr.closed is None
        assert (await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "merge"}))[0] == 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_rebase_conflict_while_merging_answers_the_go_error_struct(version: str) -> None:
    """A head whose commits do not replay onto the base (though the merge tree is clean) → ``ErrRebaseConflicts``
    written with ``ctx.JSON(http.StatusConflict, conflictError)``: the struct's exported fields (Style, CommitSHA,
    StdOut, StdErr, Err), no ``message``."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        first = emu.create_branch(OWNER, REPO, "feat", files={"README.md": "changed\n"})
        emu.create_branch(OWNER, REPO, "feat", files={"README.md": "# widgets\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice")
        emu.push_commit(OWNER, REPO, "main", {"README.md": "main's\n"}, pusher=OWNER)
        assert await _mergeable(live, pr.number)
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "rebase"})
        assert status == 409
        assert set(data) == {"Style", "CommitSHA", "StdOut", "StdErr", "Err"}
        assert (data["Style"], data["CommitSHA"]) == ("rebase", first)


@pytest.mark.parametrize("version", VERSIONS)
async def test_fast_forward_only_on_a_diverged_base_is_a_500_with_no_message_for_non_admins(version: str) -> None:
    """``ErrMergeDivergingFastForwardOnly`` is not caught by ``MergePullRequest``: ``APIErrorInternal`` in prod
    hides the text from everyone but site admins."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", body={"Do": "fast-forward-only"})
        assert (status, data["message"]) == (500, "")
        status, data = await _call(live, "POST", f"/pulls/{pr.number}/merge", login="root",
                                   body={"Do": "fast-forward-only"})
        assert status == 500 and data["message"].startswith("Merge DivergingFastForwardOnly Error: ")


@pytest.mark.parametrize("version", VERSIONS)
async def test_updating_a_pr_by_merge_pushes_a_merge_commit_and_synchronizes(version: str) -> None:
    """``UpdatePullRequest`` → services/pull/update.go ``Update``: a commit "Merge branch 'main' into feat" with
    both parents on the head branch; ``push`` and ``synchronized``; 200 with an empty body."""
    async with live_emulator(version=version) as live, webhook_sink() as sink:
        emu = live.emulator
        pr = _pull(emu)
        base = emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        old = branch_sha(emu.repo(OWNER, REPO).path, "feat")
        emu.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["push", "pull_request"])
        status, body = await _call(live, "POST", f"/pulls/{pr.number}/update?style=merge", login="alice")
        assert (status, body) == (200, None)
        deliveries = await emu.drain_webhooks()
        assert [(d.event_type, d.action) for d in deliveries] == [("push", None), ("pull_request_sync", "synchronized")]
        messages = [c["message"] for c in deliveries[0].payload["commits"]]
        assert "Merge branch 'main' into feat\n" in messages
        head = emu.pull_of(pr).head_sha()
        assert await asyncio.to_thread(_parents, emu, head) == [old, base]


def _parents(emu: Emulator, sha: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(emu.repo(OWNER, REPO).path), "rev-list", "--parents", "-n", "1", sha],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return out[1:]


@pytest.mark.parametrize("version", VERSIONS)
async def test_update_refusals_follow_update_pull_request(version: str) -> None:
    """A reader 403 with an empty body (``IsUserAllowedToUpdate``; 1.22 lets a reader's rebase through to a
    refused push, a 500); a head that is not behind 500 (empty message
    for non-admins); a conflict 409 "merge failed because of conflict"; a merged PR 422 with Gitea's nil error."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu, {"README.md": "theirs\n"})
        path = f"/pulls/{pr.number}/update"
        assert await _call(live, "POST", path, login="bob") == (403, None)
        # 1.22's IsUserAllowedToUpdate lets a reader rebase; the push is then refused: an uncaught 500.
        status, _ = await _call(live, "POST", f"{path}?style=rebase", login="bob")
        assert status == (403 if version.startswith("1.26") else 500)
        status, data = await _call(live, "POST", path, login="alice")
        assert (status, data["message"]) == (500, "")
        emu.push_commit(OWNER, REPO, "main", {"README.md": "ours\n"}, pusher=OWNER)
        status, data = await _call(live, "POST", path, login="alice")
        assert (status, data["message"]) == (409, "merge failed because of conflict")
        status, data = await _call(live, "POST", f"{path}?style=rebase", login="alice")
        assert (status, data["message"]) == (409, "rebase failed because of conflict")
        other = emu.create_branch(OWNER, REPO, "other", files={"x.txt": "x\n"})
        done = emu.create_pull(OWNER, REPO, head="other", title="Other", author="alice")
        merge = {"Do": "merge", "head_commit_id": other}
        assert (await _call(live, "POST", f"/pulls/{done.number}/merge", body=merge))[0] == 200
        status, data = await _call(live, "POST", f"/pulls/{done.number}/update", login="alice")
        assert (status, data["message"]) == (422, "%!s(<nil>)")


@pytest.mark.parametrize("version", VERSIONS)
async def test_updating_by_rebase_replays_the_head_onto_the_base(version: str) -> None:
    """``style=rebase`` (``updateHeadByRebaseOnToBase``): the head's commits on top of the new base tip."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        base = emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        assert (await _call(live, "POST", f"/pulls/{pr.number}/update?style=rebase", login="alice"))[0] == 200
        head = emu.pull_of(pr).head_sha()
        assert await asyncio.to_thread(_parents, emu, head) == [base]
