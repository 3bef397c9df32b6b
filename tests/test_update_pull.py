"""Updating an outdated pull request from its base (issue 32 item 4): the author holding the issue's implement lease
asks Gitea (as its own account) to bring the PR's branch up to date, and the issue goes back to review; real HTTP
against the emulator and real git, on each Gitea version the emulator switches between."""

from __future__ import annotations

import grp
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.core.canonical import CanonicalState
from bot.core.evidence import find_marker, parse_evidence
from bot.emulator.webhooks import expand_hook_events
from bot.verbs.handback import HandBackSource, hand_back
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import LOOP, ROSTER, ok, pull_state, tool
from tests.support import Started
from tests.test_publish import states, worktree_of
from tests.world import EXTRA_TOKENS, FULL_NAME, Sections, World, open_world

TITLE = "Paint the widget"


@pytest.fixture(params=["1.22.3", "1.26.3"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, start: Started) -> AsyncIterator[World]:
    """author-1 implements with its own Gitea token (a writer: it posts the PR and updates it as itself), author-2
    reviews and author-3 merges as foreman; once per Gitea version."""
    sections: Sections = {**LOOP, "gitea": {"identity_tokens": {"author-1": EXTRA_TOKENS["author-1"]}}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as opened:
        opened.live.emulator.version = request.param
        opened.live.emulator.set_permission(OWNER, REPO, "author-1", "write")
        yield opened


def git(world: World, *args: str, cwd: Path | None = None) -> str:
    """git in the emulator's bare repository (or in ``cwd``), as a test reads it."""
    where = cwd or world.live.emulator.repo(OWNER, REPO).path
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True).stdout.strip()


def contains(world: World, older: str, newer: str) -> bool:
    repo = world.live.emulator.repo(OWNER, REPO).path
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer],
                          check=False).returncode == 0


async def in_review(world: World, files: dict[str, str]) -> tuple[int, int, Path]:
    """A ready issue auto-allocated to author-1 and bootstrapped; author-1 locks it, writes ``files`` in its worktree,
    publishes and opens the PR (the lease ends: the issue is in review). (issue, PR, worktree)."""
    number = await world.open_issue("alice", TITLE)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    worktree, _ = await worktree_of(world, number)
    await ok(world, "author-1", "gitea_lock_issue", issue_number=number)
    for name, text in files.items():
        (worktree / name).write_text(text, encoding="utf-8")
    await ok(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Paint it")
    opened = await ok(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert world.labels(number) == ["status:review"]
    return number, int(opened["pull_request"]), worktree


async def approve(world: World, number: int) -> dict[str, Any]:
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)
    return await ok(world, "author-2", "gitea_submit_review", issue_number=number, verdict="approve")


async def back_to_author(world: World, number: int, source: HandBackSource = "branch_outdated") -> None:
    """The merge's hand-back (bot/verbs/handback.py, as the merge queue runs it on a refused merge): author-1 holds
    the issue's implement lease again, the issue is in status:in-progress."""
    service = world.service
    next_action = (f"author-1: call gitea_update_pull_request with issue_number={number}" if source != "merge_conflict"
                   else f"author-1: merge the base into the branch of #{number}")
    state = CanonicalState(state="in-progress", who_is_next="author", next_action=next_action, next_prompt="",
                           what_happened="the merge was refused", why="the base moved past the head",
                           related_prs=(), blockers="none", validation="test", last_updated_by="foreman-bot")
    back = await hand_back(service.db, service.settings, issue=number, implementer="author-1", source=source,
                           state=state, actor="author-3", now=datetime.now(UTC), delivery_id=None,
                           key=f"test:{number}:{source}", detail={})
    assert back is not None
    await world.settle()
    assert world.labels(number) == ["status:in-progress"]


def move_base(world: World, files: dict[str, str]) -> str:
    return world.live.emulator.push_commit(OWNER, REPO, "main", files, pusher="alice", message="The base moves on")


async def last_lease(world: World, number: int) -> Any:
    return (await LeaseStore(world.service.db).history(FULL_NAME, number))[-1]


def update_merges(world: World, branch: str) -> list[str]:
    """The merge commits Gitea's update made on ``branch`` ("Merge branch 'main' into <branch>")."""
    log = git(world, "log", "--format=%s", branch)
    return [line for line in log.splitlines() if line == f"Merge branch 'main' into {branch}"]


async def test_an_outdated_pull_request_is_updated_by_its_author_and_merges_after_a_re_review(world: World) -> None:
    """The update as the author (merge style): the head contains the base, the lease ends pull_request_updated, the
    issue is back in status:review with evidence naming the reviewer next; the approval of the old head no longer
    counts (the merge is refused head_moved) and a re-review lets the merge through."""
    number, pull, _ = await in_review(world, {"widget.txt": "blue\n"})
    await approve(world, number)
    base = move_base(world, {"other.txt": "unrelated\n"})
    await back_to_author(world, number)
    before = pull_state(world, pull)[2]
    doc = await ok(world, "author-1", "gitea_update_pull_request", issue_number=number)
    head = pull_state(world, pull)[2]
    assert (doc["head_before"], doc["head_sha"], doc["base_sha"], doc["style"]) == (before, head, base, "merge"), doc
    assert head != before and contains(world, base, head) and contains(world, before, head)
    assert doc["contains_base"] is True and doc["handed_over"]["reason"] == "pull_request_updated", doc
    branch = doc["head"]
    assert len(update_merges(world, branch)) == 1
    committer = git(world, "log", "-1", "--format=%an", head)
    assert committer != "foreman-bot"  # Gitea updated it as author-1's own account
    lease = await last_lease(world, number)
    assert (lease.owner, lease.status, lease.end_reason) == ("author-1", "released", "pull_request_updated")
    assert world.labels(number) == ["status:review"]
    last = states(world, number)[-1]
    assert (last.state, last.who_is_next) == ("review", "reviewer") and last.related_prs == (pull,)
    assert "re-review" in last.next_action and head[:12] in last.what_happened, last
    comments = world.live.emulator.issue(OWNER, REPO, number).comments
    evidence = [parse_evidence(c.body) for c in comments if (find_marker(c.body) or "").endswith(":updated:evidence")]
    assert len(evidence) == 1 and evidence[0] is not None and evidence[0]["action"] == "update_pull_request"
    refused, merge = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=number)
    assert refused and merge["error"] == "stale_pin" and merge["details"]["reason"] == "head_moved", merge
    assert pull_state(world, pull)[0] is False
    approved = await approve(world, number)
    assert approved["review"]["commit_id"] == head
    merged = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=number)
    assert merged["merged"] and merged["approved_commit"] == head, merged
    assert pull_state(world, pull)[0] is True


async def test_a_replay_answers_the_recorded_update_and_never_updates_twice(world: World) -> None:
    number, pull, _ = await in_review(world, {"widget.txt": "blue\n"})
    move_base(world, {"other.txt": "unrelated\n"})
    await back_to_author(world, number)
    first = await ok(world, "author-1", "gitea_update_pull_request", issue_number=number)
    move_base(world, {"more.txt": "the base moves again\n"})  # behind again: a second update would merge it
    again = await ok(world, "author-1", "gitea_update_pull_request", issue_number=number)
    recorded = {key: value for key, value in first.items() if key != "auto_allocation"}
    assert again == {**recorded, "replayed": True}, again
    assert pull_state(world, pull)[2] == first["head_sha"] and len(update_merges(world, first["head"])) == 1
    updates = [r for r in world.live.emulator.requests if r.method == "POST" and (r.route or "").endswith("/update")]
    assert len(updates) == 1
    comments = world.live.emulator.issue(OWNER, REPO, number).comments
    assert len([c for c in comments if (find_marker(c.body) or "").endswith(":updated:evidence")]) == 1
    # A run's reserved teardown after the update changes nothing either.
    released = await ok(world, "author-1", "gitea_release_lease", issue_number=number)
    assert released["already_ended"] == "pull_request_updated", released


async def test_a_conflicting_update_is_refused_and_loses_nothing_and_its_next_action_works(world: World) -> None:
    """Gitea's 409 "merge failed because of conflict": update_conflict, nothing changed (branch, lease, labels); the
    exact next action (merge the base in the worktree, resolve, publish, open the PR) brings the PR up to date."""
    number, pull, worktree = await in_review(world, {"widget.txt": "blue\n"})
    base = move_base(world, {"widget.txt": "red\n"})
    await back_to_author(world, number, "merge_conflict")
    await ok(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=number)  # the same worktree back
    await ok(world, "author-1", "gitea_lock_issue", issue_number=number)
    before, labels = pull_state(world, pull)[2], world.labels(number)
    refused, doc = await tool(world, "author-1", "gitea_update_pull_request", issue_number=number)
    assert refused and doc["error"] == "conflict" and doc["details"]["reason"] == "update_conflict", doc
    assert doc["details"]["gitea_status"] == 409 and "merge failed because of conflict" in doc["message"]
    assert doc["details"]["base_sha"] == base and "gitea_publish_worktree" in doc["exact_next_action"]
    assert pull_state(world, pull)[2] == before and world.labels(number) == labels
    lease = await last_lease(world, number)
    assert (lease.owner, lease.status) == ("author-1", "live")
    # The next action, as an agent runs it in its worktree (the base commit is in the shared object store).
    command = doc["exact_next_action"].split("`")[1].split()
    assert command[:2] == ["git", "merge"] and base in command, command
    merging = subprocess.run(["git", "-C", str(worktree), *command[1:]], capture_output=True, text=True, check=False)
    assert merging.returncode != 0 and "CONFLICT" in merging.stdout, merging
    (worktree / "widget.txt").write_text("purple\n", encoding="utf-8")
    git(world, "add", "widget.txt", cwd=worktree)
    published = await ok(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Merge main")
    assert contains(world, base, published["commit"]) and contains(world, before, published["commit"])
    opened = await ok(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert opened["pull_request"] == pull and opened["adopted"] and world.labels(number) == ["status:review"]


async def test_a_pull_request_not_behind_its_base_is_refused_before_gitea_is_asked(world: World) -> None:
    number, _, _ = await in_review(world, {"widget.txt": "blue\n"})
    await back_to_author(world, number)
    refused, doc = await tool(world, "author-1", "gitea_update_pull_request", issue_number=number)
    assert refused and doc["error"] == "invalid_state" and doc["details"]["reason"] == "pull_not_behind", doc
    assert "gitea_open_pull_request" in doc["exact_next_action"]
    assert not [r for r in world.live.emulator.requests if (r.route or "").endswith("/update")]
    assert (await last_lease(world, number)).status == "live"


async def test_callers_without_the_issues_implement_lease_are_refused(world: World) -> None:
    number, pull, _ = await in_review(world, {"widget.txt": "blue\n"})
    move_base(world, {"other.txt": "unrelated\n"})
    before = pull_state(world, pull)[2]
    refused, doc = await tool(world, "author-1", "gitea_update_pull_request", issue_number=number)  # lease ended
    assert refused and doc["error"] == "not_authorized", doc
    for login in ("author-2", "author-3", "controller-bot"):  # not authors
        refused, doc = await tool(world, login, "gitea_update_pull_request", issue_number=number)
        assert refused and doc["error"] == "not_authorized" and "author role" in doc["message"], doc
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)  # a review lease is no implement lease
    refused, doc = await tool(world, "author-1", "gitea_update_pull_request", issue_number=number)
    assert refused and doc["error"] == "not_authorized", doc
    assert pull_state(world, pull)[2] == before
    assert not [r for r in world.live.emulator.requests if (r.route or "").endswith("/update")]


async def test_gitea_refusing_the_authors_account_is_not_authorized(world: World) -> None:
    """Gitea's 403 (IsUserAllowedToUpdate: author-1 may no longer write): gitea_refusal's not_authorized."""
    number, pull, _ = await in_review(world, {"widget.txt": "blue\n"})
    move_base(world, {"other.txt": "unrelated\n"})
    await back_to_author(world, number)
    world.live.emulator.set_permission(OWNER, REPO, "author-1", "read")
    before = pull_state(world, pull)[2]
    refused, doc = await tool(world, "author-1", "gitea_update_pull_request", issue_number=number)
    assert refused and doc["error"] == "not_authorized" and doc["details"]["gitea_status"] == 403, doc
    assert pull_state(world, pull)[2] == before and (await last_lease(world, number)).status == "live"


async def test_after_an_update_the_next_publish_builds_on_the_branch_as_gitea_has_it(world: World) -> None:
    """The author's worktree is behind its branch after the update: the next publish of the handed-back issue
    fast-forwards the worktree to it first (uncommitted changes carried along), then commits and pushes (never
    forced)."""
    number, pull, worktree = await in_review(world, {"widget.txt": "blue\n"})
    base = move_base(world, {"other.txt": "unrelated\n"})
    await back_to_author(world, number)
    updated = await ok(world, "author-1", "gitea_update_pull_request", issue_number=number)
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=number, verdict="request_changes",
             body="Make it bigger")
    await ok(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=number)
    await ok(world, "author-1", "gitea_lock_issue", issue_number=number)
    (worktree / "size.txt").write_text("big\n", encoding="utf-8")
    published = await ok(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Bigger")
    assert published["caught_up"] == {"from": updated["head_before"], "to": updated["head_sha"], "update": "merge"}
    assert git(world, "rev-parse", f"{published['commit']}^") == updated["head_sha"]
    assert contains(world, base, published["commit"]) and (worktree / "other.txt").read_text() == "unrelated\n"
    assert pull_state(world, pull)[2] == published["commit"]


async def test_after_a_rebase_update_the_next_publish_is_refused_with_the_git_command(world: World) -> None:
    number, pull, worktree = await in_review(world, {"widget.txt": "blue\n"})
    move_base(world, {"other.txt": "unrelated\n"})
    await back_to_author(world, number)
    updated = await ok(world, "author-1", "gitea_update_pull_request", issue_number=number, style="rebase")
    assert updated["style"] == "rebase" and not contains(world, updated["head_before"], updated["head_sha"])
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=number, verdict="request_changes",
             body="Make it bigger")
    await ok(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=number)
    await ok(world, "author-1", "gitea_lock_issue", issue_number=number)
    (worktree / "size.txt").write_text("big\n", encoding="utf-8")
    refused, doc = await tool(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Bigger")
    assert refused and doc["details"]["reason"] == "branch_behind_remote" and doc["details"]["update"] == "rebase"
    assert pull_state(world, pull)[2] == updated["head_sha"]  # nothing pushed, nothing forced
    command = doc["exact_next_action"].split("`")[1].split()
    env = {"GIT_COMMITTER_NAME": "author-1", "GIT_COMMITTER_EMAIL": "author-1@example.invalid"}
    subprocess.run(["git", "-C", str(worktree), *command[1:]], check=True, capture_output=True,
                   env={**os.environ, **env})
    published = await ok(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Bigger")
    assert git(world, "rev-parse", f"{published['commit']}^") == updated["head_sha"]
    assert (worktree / "size.txt").read_text() == "big\n"


LIFE_ROSTER = {"author-1": ["author"], "reviewer-1": ["reviewer"], "reviewer-2": ["reviewer"], "merger-1": ["merger"]}


async def agent_turn(world: World, login: str) -> str | None:
    """One agent's turn, as tests/test_queues_life.py's agents take it, with the update a hand-back names."""
    context = await ok(world, login, "gitea_get_runtime_context")
    if not context["leases"]:
        return None
    lease = context["leases"][0]
    n, action, next_action = lease["issue_number"], lease["action"], context["exact_next_action"]
    if action == "review":
        await ok(world, login, "gitea_submit_review", issue_number=n, verdict="approve")
        return f"{login} approved #{n}"
    if action == "merge":
        await ok(world, login, "gitea_merge_pull_request", issue_number=n)
        return f"{login} merged #{n}"
    if "gitea_update_pull_request" in next_action:
        await ok(world, login, "gitea_update_pull_request", issue_number=n)
        return f"{login} updated #{n}"
    if "gitea_bootstrap_issue_worktree" in next_action:
        await ok(world, login, "gitea_bootstrap_issue_worktree", issue_number=n)
        return f"{login} bootstrapped #{n}"
    await ok(world, login, "gitea_lock_issue", issue_number=n)
    (Path(lease["worktree_path"]) / f"issue-{n}.txt").write_text(f"done #{n}\n", encoding="utf-8")
    await ok(world, login, "gitea_publish_worktree", issue_number=n, message=f"Implement #{n}")
    await ok(world, login, "gitea_open_pull_request", issue_number=n)
    return f"{login} opened the PR of #{n}"


@pytest.mark.parametrize("version", ["1.22.3", "1.26.3"])
async def test_an_outdated_branch_goes_through_its_life_with_the_queues(
    tmp_path: Path, start: Started, version: str
) -> None:
    """Branch protection blocks an outdated branch: the base moves after the PR opened, the approved PR is handed
    back by the merge queue, the author's runtime context names gitea_update_pull_request, and after the update a
    re-review and the merge end the issue's life, with nobody but the agents acting."""
    tokens = {login: EXTRA_TOKENS[login] for login in LIFE_ROSTER}
    async with open_world(tmp_path, start, roster=LIFE_ROSTER, gitea={"identity_tokens": tokens},
                          bootstrap={"on_allocate": "run"}, reconcile={"interval_s": 0}) as world:
        emu = world.live.emulator
        emu.version = version
        for login in LIFE_ROSTER:
            emu.set_permission(OWNER, REPO, login, "write")
        world.hook.events = expand_hook_events(["issues", "pull_request"])
        emu.protect_branch(OWNER, REPO, "main", block_on_outdated_branch=True)
        number = await world.open_issue("alice", TITLE)
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        steps: list[str] = []
        for _ in range(30):
            if world.labels(number) == ["status:done"]:
                break
            for login in LIFE_ROSTER:
                did = await agent_turn(world, login)
                if did is not None:
                    steps.append(did)
                    if did.endswith(f"opened the PR of #{number}") and not any("updated" in s for s in steps):
                        move_base(world, {"other.txt": "the base moves on\n"})
            await world.settle()
        else:
            raise AssertionError(f"the life never ended: {steps}; labels {world.labels(number)}")
        assert [s for s in steps if "updated" in s] == [f"author-1 updated #{number}"], steps
        assert sum(" approved " in s for s in steps) == 2 and steps[-1] == f"merger-1 merged #{number}", steps
        ends = [(lease.action, lease.end_reason) for lease in await LeaseStore(world.service.db).history(FULL_NAME,
                                                                                                       number)]
        assert ("implement", "pull_request_updated") in ends, ends


async def test_what_the_catch_up_writes_into_a_shared_worktree_is_handed_to_the_agents_group(
        tmp_path: Path, start: Started) -> None:
    """With [bootstrap] worktree_groups, the bootstrap hands the worktree to the agent's Unix group; the publish's
    fast-forward after an update writes the base's files as the service: they are handed to that group too, so the
    agent can read and change them."""
    group = grp.getgrgid(os.getgid()).gr_name  # a group this (test) service is a member of
    sections: Sections = {**LOOP, "gitea": {"identity_tokens": {"author-1": EXTRA_TOKENS["author-1"]}}}
    sections["bootstrap"] = {**sections.get("bootstrap", {}), "worktree_groups": {"author-1": group}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        world.live.emulator.set_permission(OWNER, REPO, "author-1", "write")
        number, _, worktree = await in_review(world, {"widget.txt": "blue\n"})
        move_base(world, {"other.txt": "unrelated\n"})
        await back_to_author(world, number)
        await ok(world, "author-1", "gitea_update_pull_request", issue_number=number)
        await ok(world, "author-2", "gitea_claim_review", issue_number=number)
        await ok(world, "author-2", "gitea_submit_review", issue_number=number, verdict="request_changes",
                 body="Make it bigger")
        await ok(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=number)
        await ok(world, "author-1", "gitea_lock_issue", issue_number=number)
        (worktree / "size.txt").write_text("big\n", encoding="utf-8")
        published = await ok(world, "author-1", "gitea_publish_worktree", issue_number=number, message="Bigger")
        assert published["caught_up"]["update"] == "merge"
        mode = stat.S_IMODE(os.stat(worktree / "other.txt").st_mode)
        assert mode & 0o060 == 0o060, oct(mode)  # group read and write, as every file the bootstrap handed over
