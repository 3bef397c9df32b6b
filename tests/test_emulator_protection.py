"""The emulator's branch protection as Gitea's source has it: the CRUD API, rule matching, and the merge checks
(services/pull/check.go ``CheckPullMergeable``, services/pull/merge.go ``CheckPullBranchProtections``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.emulator import Emulator
from bot.emulator.model import EmuIssue
from bot.emulator.protection import first_match
from tests.gitea_fixtures import BOT, OWNER, REPO, LiveEmulator, live_emulator

VERSIONS = ["1.22.3", "1.26.3"]


async def _call(live: LiveEmulator, method: str, path: str, *, login: str = BOT, body: Any = None) -> tuple[int, Any]:
    """One API request under ``/repos/acme/widgets``; (status, decoded JSON or None)."""
    url = live.api(f"/repos/{OWNER}/{REPO}{path}")
    async with live.session.request(method, url, json=body, headers=live.auth(login)) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


def _pull(emu: Emulator, *, files: dict[str, str] | None = None, author: str = OWNER) -> EmuIssue:
    """A PR "Feat" from a new branch ``feat`` into main, by the repository's owner (so alice and bob may review)."""
    emu.create_branch(OWNER, REPO, "feat", files=files or {"f.txt": "f\n"})
    return emu.create_pull(OWNER, REPO, head="feat", title="Feat", author=author)


async def _merge(live: LiveEmulator, number: int, *, login: str = BOT, **form: Any) -> tuple[int, Any]:
    return await _call(live, "POST", f"/pulls/{number}/merge", login=login, body={"Do": "merge", **form})


async def _review(live: LiveEmulator, number: int, login: str, event: str, body: str = "why") -> dict[str, Any]:
    form = {"event": event, "body": body}
    status, data = await _call(live, "POST", f"/pulls/{number}/reviews", login=login, body=form)
    assert status == 200, data
    return dict(data)


def _refusal(version: str, reason: str) -> str:
    """1.23+ ``util.ErrorWrap(ErrNotReadyToMerge, reason)``; 1.22 ``models.ErrDisallowedToMerge``."""
    return reason if version.startswith("1.26") else f"not allowed to merge [reason: {reason}]"


@pytest.mark.parametrize("version", VERSIONS)
async def test_branch_protection_crud_needs_repo_admin_and_answers_gitea_json(version: str) -> None:
    """routers/api/v1/repo/branch.go + api.go ``reqAdmin``: a writer is 403; create 201 (``priority``, force-push
    fields and ``block_admin_merge_override`` only from 1.23); duplicate 403; no name 400; unknown whitelist user
    422; edit keeps what is not given; delete 204, then 404."""
    async with live_emulator(version=version) as live:
        status, data = await _call(live, "POST", "/branch_protections", login="alice", body={"rule_name": "main"})
        assert (status, data["message"]) == (
            403,
            "user should be an owner or a collaborator with admin write of a repository",
        )
        form = {"rule_name": "main", "required_approvals": 2, "enable_merge_whitelist": True,
                "merge_whitelist_usernames": ["alice", "bob"], "status_check_contexts": ["ci/*"]}
        status, rule = await _call(live, "POST", "/branch_protections", body=form)
        assert status == 201
        assert rule["branch_name"] == rule["rule_name"] == "main" and rule["required_approvals"] == 2
        # updateUserWhitelist drops users without write on code (bob reads).
        assert rule["merge_whitelist_usernames"] == ["alice"] and rule["status_check_contexts"] == ["ci/*"]
        new = version.startswith("1.26")
        assert ("priority" in rule, "block_admin_merge_override" in rule, "enable_force_push" in rule) == (new,) * 3
        status, data = await _call(live, "POST", "/branch_protections", body={"rule_name": "main"})
        assert (status, data["message"]) == (403, "Branch protection already exist")
        status, data = await _call(live, "POST", "/branch_protections", body={})
        assert (status, data["message"]) == (400, "both rule_name and branch_name are empty")
        status, data = await _call(
            live, "POST", "/branch_protections", body={"rule_name": "x", "merge_whitelist_usernames": ["nobody"]}
        )
        assert (status, data["message"]) == (422, "user does not exist [uid: 0, name: nobody]")
        status, rule = await _call(live, "PATCH", "/branch_protections/main", body={"block_on_rejected_reviews": True})
        assert status == 200 and rule["block_on_rejected_reviews"] is True and rule["required_approvals"] == 2
        status, listed = await _call(live, "GET", "/branch_protections")
        assert [r["rule_name"] for r in listed] == ["main"]
        assert (await _call(live, "DELETE", "/branch_protections/main"))[0] == 204
        assert (await _call(live, "GET", "/branch_protections/main"))[0] == 404


@pytest.mark.parametrize("version", VERSIONS)
async def test_rules_match_plain_names_before_globs_and_by_priority_from_1_23(version: str) -> None:
    """models/git/protected_branch.go ``Match`` (plain names case-insensitively, globs with ``/`` as separator)
    and protected_branch_list.go ``sort``: priority first (1.23+), then plain names, then the oldest."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        glob = emu.protect_branch(OWNER, REPO, "release/*", priority=1)
        plain = emu.protect_branch(OWNER, REPO, "Release/V1", priority=2)
        repo = emu.repo(OWNER, REPO)
        assert first_match(emu, repo, "release/v2") is glob
        assert first_match(emu, repo, "release/v2/x") is None  # ``*`` stops at ``/``
        expected = glob if version.startswith("1.26") else plain
        assert first_match(emu, repo, "release/v1") is expected
        status, listed = await _call(live, "GET", "/branch_protections")
        assert status == 200
        names = [r["rule_name"] for r in listed]
        assert names == (["release/*", "Release/V1"] if version.startswith("1.26") else ["Release/V1", "release/*"])
        assert [r["branch_name"] for r in listed if r["rule_name"] == "release/*"] == [""]
        emu.create_branch(OWNER, REPO, "release/v9", files={"r.txt": "r\n"})
        status, data = await _call(live, "DELETE", "/branches/release/v9")
        assert (status, data["message"]) == (403, "branch protected")


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_merge_whitelist_decides_who_may_merge(version: str) -> None:
    """services/pull/merge.go ``IsUserAllowedToMerge`` → ``IsUserMergeWhitelisted``: with a rule's merge whitelist
    a repo admin who is not listed gets 405 "User not allowed to merge PR"; the listed writer merges."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", enable_merge_whitelist=True, merge_whitelist_usernames=["alice"])
        status, data = await _merge(live, pr.number)
        assert (status, data["message"]) == (405, "User not allowed to merge PR")
        assert (await _merge(live, pr.number, login="alice"))[0] == 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_required_approvals_count_only_official_undismissed_approvals(version: str) -> None:
    """models/issues/pull.go ``HasEnoughApprovals``/``GetGrantedApprovalsCount``: a reader's approval is not
    official (``IsOfficialReviewer``: write on code); a dismissed one does not count; 405 with the version's
    wording until a writer approves."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", required_approvals=1)
        bob = await _review(live, pr.number, "bob", "APPROVED")
        assert bob["official"] is False
        status, data = await _merge(live, pr.number)
        assert (status, data["message"]) == (405, _refusal(version, "Does not have enough approvals"))
        alice = await _review(live, pr.number, "alice", "APPROVED")
        assert alice["official"] is True
        emu.dismiss_review(OWNER, REPO, pr.number, alice["id"])
        assert (await _merge(live, pr.number))[0] == 405
        await _call(live, "POST", f"/pulls/{pr.number}/reviews/{alice['id']}/undismissals")
        assert (await _merge(live, pr.number))[0] == 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_an_approvals_whitelist_makes_only_listed_reviewers_official(version: str) -> None:
    """``IsUserOfficialReviewer`` with ``enable_approvals_whitelist``: the listed reader is official, the
    unlisted writer is not; approving again ends the reviewer's earlier official review."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", enable_approvals_whitelist=True, approvals_whitelist_username=["bob"])
        assert (await _review(live, pr.number, "alice", "APPROVED"))["official"] is False
        first = await _review(live, pr.number, "bob", "APPROVED")
        second = await _review(live, pr.number, "bob", "APPROVED")
        assert second["official"] is True
        status, listed = await _call(live, "GET", f"/pulls/{pr.number}/reviews")
        assert status == 200
        assert {r["id"]: r["official"] for r in listed}[first["id"]] is False


@pytest.mark.parametrize("version", VERSIONS)
async def test_an_official_request_for_changes_blocks_until_dismissed(version: str) -> None:
    """``MergeBlockedByRejectedReview``: 405 "There are requested changes"; a repo admin's dismissal
    (``POST .../dismissals``) lifts it."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", block_on_rejected_reviews=True)
        rejected = await _review(live, pr.number, "alice", "REQUEST_CHANGES", "no")
        status, data = await _merge(live, pr.number)
        assert (status, data["message"]) == (405, _refusal(version, "There are requested changes"))
        status, dismissed = await _call(
            live, "POST", f"/pulls/{pr.number}/reviews/{rejected['id']}/dismissals", body={"message": "ok"}
        )
        assert status == 200 and dismissed["dismissed"] is True
        assert (await _merge(live, pr.number))[0] == 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_an_outdated_head_blocks_until_updated_from_the_base(version: str) -> None:
    """``MergeBlockedByOutdatedBranch`` (CommitsBehind > 0): 405 "The head branch is behind the base branch";
    ``POST .../update`` merges the base into the head, then the merge goes through."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", block_on_outdated_branch=True)
        emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        status, data = await _merge(live, pr.number)
        assert (status, data["message"]) == (405, _refusal(version, "The head branch is behind the base branch"))
        assert (await _call(live, "POST", f"/pulls/{pr.number}/update"))[0] == 200
        assert (await _merge(live, pr.number))[0] == 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_repo_admins_force_merge_skips_protection_unless_blocked_from_1_23(version: str) -> None:
    """``CheckPullMergeable(..., force_merge)``: a repo admin skips a failed protection check; from 1.23 not when
    the rule has ``block_admin_merge_override`` (#32248); a writer's ``force_merge`` does nothing."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", required_approvals=1, block_admin_merge_override=True)
        assert (await _merge(live, pr.number, login="alice", force_merge=True))[0] == 405
        status, _ = await _merge(live, pr.number, force_merge=True)
        assert status == (405 if version.startswith("1.26") else 200)


@pytest.mark.parametrize("version", VERSIONS)
async def test_pushes_stale_reviews_only_when_the_content_changes_and_may_dismiss_approvals(version: str) -> None:
    """services/pull/pull.go ``AddTestPullRequestTask``: ``checkIfPRContentChanged`` (combined diff of new, old and
    the merge base): updating the head from the base changes nothing, so reviews stay fresh; a real change
    marks them stale and, with ``dismiss_stale_approvals``, dismisses the approvals (``DismissApprovalReviews``,
    a timeline comment, no webhook); a request for changes stays."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        pr = _pull(emu)
        emu.protect_branch(OWNER, REPO, "main", dismiss_stale_approvals=True)
        approval = await _review(live, pr.number, "alice", "APPROVED")
        rejection = await _review(live, pr.number, BOT, "REQUEST_CHANGES", "no")
        emu.push_commit(OWNER, REPO, "main", {"other.txt": "o\n"}, pusher=OWNER)
        assert (await _call(live, "POST", f"/pulls/{pr.number}/update"))[0] == 200
        reviews = {r.id: r for r in emu.pull_of(pr).reviews}
        assert not reviews[approval["id"]].stale and not reviews[approval["id"]].dismissed
        emu.add_hook(OWNER, REPO, url="http://127.0.0.1:9/hook", events=["pull_request_review"])
        emu.push_commit(OWNER, REPO, "feat", {"f.txt": "changed\n"}, pusher=OWNER)
        assert reviews[approval["id"]].stale and reviews[approval["id"]].dismissed
        assert reviews[rejection["id"]].stale and not reviews[rejection["id"]].dismissed
        assert [d for d in emu.deliveries if "review" in d.event_type] == []
        assert [c.kind for c in pr.timeline].count("dismiss_review") == 1
