"""Stranded work comes back (issue 31, item 3): another author bootstraps an issue whose earlier owner's lease ended
without a handover; the earlier owner's worktree is kept aside for it, never deleted or reset."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot import invariants
from bot.catalog import open_door
from bot.core.bootstrap import KEPT_DIR
from bot.core.teardown import closed_key
from bot.loops.teardown import TeardownCall, teardown_issue
from bot.verbs.bootstrap import bootstrap_preflight, lock_issue
from bot.verbs.bootstrap.faults import FAULT_EXIT_CODE, FAULT_STEP_ENV
from bot.verbs.bootstrap.takeover import stranded
from bot.verbs.runtime import caller_for
from state.db import utcnow
from state.journal import JournalStore, Registration
from state.leases import Lease, LeaseStore
from tests.gitea_fixtures import BOT
from tests.test_bootstrap_support import BootstrapWorld, git, open_bootstrap_world, tree_snapshot, worktree_entries

NOTES = "half a thought, never committed\n"


async def expire(w: BootstrapWorld, lease: Lease) -> None:
    """The lease runs out and foreman's stranded-work sweep ends it (``expired``), past its grace."""
    from bot.verbs.stranded import expire_stranded

    later = lease.expires_at + timedelta(seconds=w.settings.allocator.lease_grace_s + 1)
    ended = await expire_stranded(w.db, w.ctx.repo, grace=timedelta(seconds=w.settings.allocator.lease_grace_s),
                                  now=later, bot_login="foreman-bot", delivery_id=None)
    assert [e.lease_id for e in ended] == [lease.lease_id]


async def publish(w: BootstrapWorld, number: int, caller: str, message: str) -> dict[str, Any]:
    """``gitea_publish_worktree`` through the door, after the lock it needs."""
    locked = await lock_issue(w.ctx, issue_number=number, caller=caller)
    assert locked.status == "locked", locked.to_dict()
    door = open_door(w.db, w.settings, w.gitea, bot_login=BOT)
    result = await door.call("publish_worktree", caller_for(w.settings, caller, "mcp"),
                             {"issue_number": number, "message": message})
    assert result.ok, result.doc
    return result.doc


def remote_sha(w: BootstrapWorld, branch: str) -> str:
    return git(w.bare, "rev-parse", f"refs/heads/{branch}")


async def registrations(w: BootstrapWorld, number: int) -> list[Registration]:
    return await JournalStore(w.db).registrations(w.ctx.repo, number)


def takeover_proofs(w: BootstrapWorld, key: str | None) -> dict[str, Any]:
    rows = w.rows("SELECT p.phase, p.proof_json FROM bootstrap_phases p JOIN bootstrap_journal j ON j.id = p.journal_id"
                  " WHERE j.idempotency_key = ?", key)
    return {phase: json.loads(doc).get("takeover") for phase, doc in rows}


async def worktree_violations(w: BootstrapWorld) -> list[invariants.Violation]:
    """``foreman invariants`` on the worktrees: every one under branches/ registered (a kept one as kept, detached),
    no stray directory (the outbox is not sent here: the other invariants are not looked at)."""
    facts = invariants.Facts(await invariants.gather_db(w.settings.database.path, repo=w.ctx.repo),
                             invariants.facts.GiteaFacts(), BOT, invariants.gather_checkout(w.checkout))
    return [v for v in invariants.check(facts) if v.invariant.startswith(("worktrees.", "branches."))]


def detached_head(path: Path) -> str:
    """The kept worktree's HEAD, asserting it is detached (it holds no branch)."""
    assert git(path, "symbolic-ref", "-q", "HEAD", check=False) == ""
    return git(path, "rev-parse", "HEAD")


async def test_another_author_takes_over_published_work_and_the_old_worktree_is_kept_detached() -> None:
    """(a) alice bootstrapped, published one commit, committed once more without pushing and left a file
    uncommitted; her lease expired. bob, leased next, bootstraps: his worktree is at the canonical path on the issue
    branch at the commit Gitea has; alice's worktree is kept aside (her file and her unpushed commit there, HEAD
    detached), her registration ended saying where; the takeover is in bob's journal."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path, branch = w.path(number), w.branch(number)
        (path / "feature.txt").write_text("blue\n", encoding="utf-8")
        await publish(w, number, "alice", "Make the widget blue")
        pushed = remote_sha(w, branch)
        assert pushed != w.main_sha()
        (path / "later.txt").write_text("not pushed\n", encoding="utf-8")
        git(path, "add", "later.txt")
        git(path, "commit", "-q", "-m", "Local only")
        local = git(path, "rev-parse", "HEAD")
        (path / "notes.txt").write_text(NOTES, encoding="utf-8")
        kept_files = tree_snapshot(path, skip=frozenset({".git"}))
        await expire(w, alice)
        preflight = (await bootstrap_preflight(w.ctx, number, "bob")).to_dict()
        assert preflight["checks"]["path_free"]["ok"] is True, preflight
        assert preflight["worktree_path"] == str(path), preflight
        bob = await w.lease(number, owner="bob")

        result = await w.bootstrap(number, caller="bob")

        assert result.status == "completed", result.to_dict()
        assert result.proof["worktree_path"] == str(path) and result.proof["branch"] == branch
        assert result.proof["head_sha"] == result.proof["branch_sha"] == pushed
        assert git(w.checkout, "rev-parse", f"refs/heads/{branch}") == pushed
        entry = next(e for e in worktree_entries(w.checkout) if e["worktree"] == str(path))
        assert entry["branch"] == f"refs/heads/{branch}"
        assert (path / "feature.txt").read_text(encoding="utf-8") == "blue\n"
        assert not (path / "notes.txt").exists() and not (path / "later.txt").exists()
        # alice's worktree, kept aside byte for byte, on a detached HEAD holding her unpushed commit
        [old, new] = [r for r in await registrations(w, number) if not r.kept]
        [kept_row] = [r for r in await registrations(w, number) if r.kept]
        kept = Path(kept_row.worktree_path)
        assert kept.parent == w.checkout / "branches" / KEPT_DIR and "alice" in kept.name
        assert str(old.journal_id) in kept.name
        assert tree_snapshot(kept, skip=frozenset({".git"})) == kept_files
        assert (kept / "notes.txt").read_text(encoding="utf-8") == NOTES
        assert detached_head(kept) == local
        assert git(kept, "status", "--porcelain") == "?? notes.txt"
        assert (old.owner, old.ended_at is not None, new.owner, new.ended_at) == ("alice", True, "bob", None)
        assert str(kept) in (old.end_reason or "") and "bob" in (old.end_reason or "")
        assert (kept_row.owner, kept_row.lease_id, kept_row.branch) == ("alice", alice.lease_id, branch)
        assert new.lease_id == bob.lease_id and new.worktree_path == str(path)
        # the takeover in bob's journal
        proofs = takeover_proofs(w, result.idempotency_key)
        for phase in ("accepted", "branch_confirmed"):
            done = proofs[phase]
            assert done["from_owner"] == "alice" and done["from_lease"] == alice.lease_id, done
            assert done["from_lease_status"] == "expired" and done["kept_path"] == str(kept), done
            assert done["start_sha"] == pushed and done["start_from"] == "gitea", done
        assert proofs["branch_confirmed"]["kept_head"] == local
        assert proofs["branch_confirmed"]["branch_before"] == local
        assert result.proof["takeover"]["from_owner"] == "alice"
        # bob's worktree is his: locked to his lease
        locked = await lock_issue(w.ctx, issue_number=number, caller="bob")
        assert locked.status == "locked", locked.to_dict()
        assert await worktree_violations(w) == []


async def test_unpublished_stranded_work_restarts_from_the_base() -> None:
    """(b) alice bootstrapped and committed locally but never published; her lease was released without a handover.
    bob starts from the default branch's head; alice's commit and her uncommitted file stay in her kept worktree."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path, branch = w.path(number), w.branch(number)
        base = w.main_sha()
        (path / "draft.txt").write_text("draft\n", encoding="utf-8")
        git(path, "add", "draft.txt")
        git(path, "commit", "-q", "-m", "Draft")
        local = git(path, "rev-parse", "HEAD")
        (path / "notes.txt").write_text(NOTES, encoding="utf-8")
        await w.release(alice)
        bob = await w.lease(number, owner="bob")

        result = await w.bootstrap(number, caller="bob")

        assert result.status == "completed", result.to_dict()
        assert result.proof["head_sha"] == result.proof["branch_sha"] == base
        assert git(w.checkout, "rev-parse", f"refs/heads/{branch}") == base
        assert not (path / "draft.txt").exists() and not (path / "notes.txt").exists()
        [kept_row] = [r for r in await registrations(w, number) if r.kept]
        kept = Path(kept_row.worktree_path)
        assert detached_head(kept) == local
        assert (kept / "notes.txt").read_text(encoding="utf-8") == NOTES
        assert (kept / "draft.txt").read_text(encoding="utf-8") == "draft\n"
        accepted = takeover_proofs(w, result.idempotency_key)["accepted"]
        assert accepted["start_from"] == "base" and accepted["start_sha"] == base, accepted
        assert accepted["from_lease_status"] == "released" and accepted["from_owner"] == "alice", accepted
        live = await JournalStore(w.db).live_registration(w.ctx.repo, number)
        assert live is not None and live.lease_id == bob.lease_id


async def test_a_prior_owner_whose_lease_is_live_is_not_taken_over() -> None:
    """(c) alice still holds her lease: bob is refused as before and nothing of alice's moves. Only a lease that ended
    (expired, released) or is still marked live past its expiry and the grace leaves its work stranded."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path = w.path(number)
        (path / "notes.txt").write_text(NOTES, encoding="utf-8")
        before = tree_snapshot(path)
        refused = await w.bootstrap(number, caller="bob")
        assert refused.status == "refused" and refused.refusal is not None, refused.to_dict()
        assert refused.refusal.error == "not_authorized"
        proof = (await bootstrap_preflight(w.ctx, number, "bob")).to_dict()
        assert proof["checks"]["no_foreign_lease"]["ok"] is False and proof["checks"]["path_free"]["ok"] is False
        assert tree_snapshot(path) == before
        assert not (w.checkout / "branches" / KEPT_DIR).exists()
        assert [r.kept for r in await registrations(w, number)] == [False]
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(1,)]
        grace = timedelta(seconds=w.settings.allocator.lease_grace_s)
        now = utcnow()
        assert not stranded(alice, now=now, grace=grace)
        assert not stranded(alice, now=alice.expires_at + grace - timedelta(seconds=1), grace=grace)
        assert stranded(alice, now=alice.expires_at + grace, grace=grace)
        await w.release(alice)
        released = await LeaseStore(w.db).get(alice.lease_id)
        assert released is not None and stranded(released, now=now, grace=grace)


async def test_the_same_author_leased_again_after_expiry_resumes_its_own_worktree() -> None:
    """(d) alice's lease expired and she is leased the issue again: her registered worktree is resumed as it is
    (her file still there, nothing kept aside, no takeover), the old registration superseded by the new one."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        first = await w.lease(number)
        done = await w.bootstrap(number)
        assert done.status == "completed"
        path = w.path(number)
        (path / "notes.txt").write_text(NOTES, encoding="utf-8")
        before = tree_snapshot(path)
        await expire(w, first)
        again = await w.lease(number)

        result = await w.bootstrap(number)

        assert result.status == "completed", result.to_dict()
        assert result.idempotency_key != done.idempotency_key
        assert result.proof["worktree_path"] == str(path) and result.proof["created"]["worktree"] is False
        assert tree_snapshot(path) == before
        assert "takeover" not in result.proof
        assert takeover_proofs(w, result.idempotency_key)["accepted"] is None
        assert not (w.checkout / "branches" / KEPT_DIR).exists()
        old, new = await registrations(w, number)
        assert old.end_reason == f"superseded by {result.idempotency_key}" and not old.kept
        assert (new.lease_id, new.ended_at, new.worktree_path) == (again.lease_id, None, str(path))


async def test_the_issues_teardown_removes_a_kept_worktree_like_any_other() -> None:
    """(e) alice's kept worktree (clean, at the base) is judged and removed by the issue's teardown, beside bob's; its
    kept registration is cleared, so a later teardown does not look at it again."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        await expire(w, alice)
        await w.lease(number, owner="bob")
        assert (await w.bootstrap(number, caller="bob")).status == "completed"
        [kept_row] = [r for r in await registrations(w, number) if r.kept]
        kept = Path(kept_row.worktree_path)
        assert kept.is_dir() and await worktree_violations(w) == []
        call = TeardownCall(number, "issue_closed", closed_key(w.ctx.repo, number, "2026-01-01T00:00:00Z"), None,
                            "test")

        report = await teardown_issue(w.db, w.settings, w.gitea, call, bot_login=BOT)

        assert report is not None and report.status == "done", report
        actions = {doc["path"]: doc["action"] for doc in report.outcome["worktrees"]}
        assert actions == {str(kept): "removed", str(w.path(number)): "removed"}, report.outcome
        assert report.outcome["worktree"]["path"] == str(w.path(number))  # the summary's is the live one
        assert not kept.exists() and not w.path(number).exists()
        assert not kept.parent.exists()  # branches/.kept/ goes with its last kept worktree
        assert [e for e in worktree_entries(w.checkout) if "/branches/" in e["worktree"]] == []
        rows = await registrations(w, number)
        assert [r for r in rows if r.kept] == [] and all(r.ended_at is not None for r in rows)
        assert any("kept worktree removed" in (r.end_reason or "") for r in rows), [r.end_reason for r in rows]
        assert await worktree_violations(w) == []


async def test_a_takeover_killed_after_the_worktree_was_kept_is_finished_by_the_replay() -> None:
    """A ``foreman bootstrap`` of bob's killed right after alice's worktree was moved aside (crash seam
    ``worktree_kept``, before the branch moved and before anything was recorded): the replay finds the worktree kept,
    moves the branch, ends alice's registration and completes, with one kept worktree and one kept registration."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path = w.path(number)
        (path / "notes.txt").write_text(NOTES, encoding="utf-8")
        await expire(w, alice)
        await w.lease(number, owner="bob")
        code, _, err = await w.cli("--issue", str(number), "--owner", "bob", env={FAULT_STEP_ENV: "worktree_kept"})
        assert code == FAULT_EXIT_CODE, err[-800:]
        [moved] = list((w.checkout / "branches" / KEPT_DIR).iterdir())
        assert not path.exists() and (moved / "notes.txt").read_text(encoding="utf-8") == NOTES
        assert [r.kept for r in await registrations(w, number)] == [False]  # nothing recorded yet

        result = await w.bootstrap(number, caller="bob")

        assert result.status == "completed", result.to_dict()
        assert result.proof["takeover"]["kept_path"] == str(moved) and result.proof["head_sha"] == w.main_sha()
        [kept_row] = [r for r in await registrations(w, number) if r.kept]
        assert kept_row.worktree_path == str(moved) and detached_head(moved) == w.main_sha()
        assert (moved / "notes.txt").read_text(encoding="utf-8") == NOTES
        assert await worktree_violations(w) == []


async def test_a_stranded_worktree_whose_git_file_was_rewritten_is_never_taken_over_by_git_it_points_at(
    tmp_path: Path,
) -> None:
    """The earlier owner is an adversary with a shell: before its lease expires it points its worktree's `.git` file
    at a repository of its own (whose config would run a program through core.fsmonitor if git read it). The
    takeover must not run git with that file as its repository: bob's bootstrap is refused, nothing is moved, the
    program never runs, and alice's worktree is left exactly as she left it."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        alice = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path = w.path(number)
        evil = tmp_path / "evil"
        git(tmp_path, "init", "-q", str(evil))
        ran = tmp_path / "ran"
        (evil / ".git" / "config").write_text(
            (evil / ".git" / "config").read_text(encoding="utf-8")
            + f"[core]\n\tfsmonitor = touch {ran}\n", encoding="utf-8")
        (path / ".git").write_text(f"gitdir: {evil / '.git'}\n", encoding="utf-8")
        before = tree_snapshot(path)
        await expire(w, alice)
        await w.lease(number, owner="bob")

        result = await w.bootstrap(number, caller="bob")

        refusal = result.to_dict()
        assert result.status != "completed", refusal
        # Typed and final (a retry would meet the same file): never "unavailable ... resume".
        assert (refusal["error"], refusal["details"]["reason"]) == ("invalid_state", "worktree_refused"), refusal
        assert not ran.exists(), "git ran the earlier owner's core.fsmonitor"
        assert tree_snapshot(path) == before
        assert not (w.checkout / "branches" / KEPT_DIR).exists() or list((w.checkout / "branches" / KEPT_DIR)
                                                                          .iterdir()) == []
