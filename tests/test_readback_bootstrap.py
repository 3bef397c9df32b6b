"""Read-after-write that really reads: the bootstrap's proof is what git and the database hold, nothing copied."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

from state.db import utcnow
from state.leases import LeaseStore
from tests.test_bootstrap_support import FILES, checkout_snapshot, git, open_bootstrap_world, tree_snapshot

# Each test names the mutation it catches: the code copying a value it should have read back (from the pin, an
# earlier journal record, a constant, an assumed write) or accepting a state it should refuse. The assignment
# (Gitea's side) is pinned in test_readback_assignment.py.


def file_stats(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """(bytes, mode, mtime_ns) of every file under ``root``, and (b"", mode, mtime_ns) of every directory."""
    found: dict[str, tuple[bytes, int, int]] = {}
    for current, dirs, names in os.walk(root, followlinks=False):
        for name in [*dirs, *names]:
            full = Path(current, name)
            info = full.lstat()
            data = b"" if full.is_dir() else full.read_bytes()
            found[str(full.relative_to(root))] = (data, info.st_mode, info.st_mtime_ns)
    return found


# --- every proof field is read back -----------------------------------------------------------------------------------


async def test_the_proof_reads_head_branch_and_base_equivalence_from_git_for_adopted_work() -> None:
    """Seed 004 AC7/AC8: the same owner's branch, with a commit beyond the base, is
    adopted by its next lease; the proof's head_sha is the worktree's HEAD and branch_sha the branch ref, as git
    reports them (not the pin), and base_equivalent is false because git's HEAD is not the base."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        first = await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"
        path, branch = w.path(number), w.branch(number)
        (path / "src" / "app.py").write_text("print('widgets, polished')\n", encoding="utf-8")
        git(path, "commit", "-qam", "Polish the widgets")
        head = git(path, "rev-parse", "HEAD")
        await w.release(first)
        await w.lease(number)
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        base = w.main_sha()
        assert head != base and result.proof["base_sha"] == base
        assert result.proof["head_sha"] == git(path, "rev-parse", "HEAD") == head  # 9a: read in the worktree
        assert result.proof["branch_sha"] == git(w.checkout, "rev-parse", f"refs/heads/{branch}")  # 9a: the ref
        assert result.proof["base_equivalent"] is False  # 9c: computed from git's HEAD, not assumed


async def test_a_fresh_worktree_is_base_equivalent_because_git_says_so() -> None:
    """Seed 004 AC3: base_equivalent is what git says (HEAD equals the live base)."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        result = await w.bootstrap(number)
        head = git(w.path(number), "rev-parse", "HEAD")
        assert result.proof["base_equivalent"] is (head == w.main_sha()) is True


async def test_the_completed_proof_reads_the_lease_from_the_lease_store_at_proof_time() -> None:
    """Seed 004 AC8: a transition interrupted after lock_established is completed by a replay
    after the lease was heartbeated: the proof's lease is the lease row as the store holds it when the proof is
    taken (new heartbeat and expiry), not the copy the lock_established record kept."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        await w.cli_dies_after(number, "lock_established")
        [(recorded,)] = w.rows("SELECT p.proof_json FROM bootstrap_phases p JOIN bootstrap_journal j"
                               " ON j.id = p.journal_id WHERE j.issue_number = ? AND p.phase = 'lock_established'",
                               number)
        beat = await LeaseStore(w.db).heartbeat(lease.lease_id, owner="alice", ttl=timedelta(hours=5),
                                                now=utcnow() + timedelta(seconds=2))
        assert json.loads(recorded)["lease"]["expires_at"] != beat.expires_at.isoformat()
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        stored = await LeaseStore(w.db).get(lease.lease_id)
        assert stored is not None and result.proof["lease"] == stored.to_dict()
        assert result.proof["lease"]["heartbeat_at"] == beat.heartbeat_at.isoformat()


async def test_an_off_branch_control_checkout_is_refused_and_left_as_it_is() -> None:
    """Seed 004 AC6: the control checkout on another branch: refused (checkout_not_clean)
    before anything is created; the checkout stays exactly where it was."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        git(w.checkout, "checkout", "-q", "-b", "someone-elses-branch")
        before = checkout_snapshot(w.checkout)
        result = await w.bootstrap(number)
        assert result.status == "refused", result.to_dict()
        assert result.refusal is not None and result.refusal.error == "invalid_state"
        assert result.refusal.reason == "checkout_not_clean"
        assert "gitea_" in result.refusal.exact_next_action
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert git(w.checkout, "branch", "--list", "issue-*") == ""
        assert checkout_snapshot(w.checkout) == before


async def test_a_dirty_control_checkout_is_refused_and_left_as_it_is() -> None:
    """Seed 004 AC6: with `control_clean_check = "every_transition"`, a control checkout with
    a changed tracked file is refused (checkout_not_clean); nothing is created and the change stays."""
    async with open_bootstrap_world(control_clean_check="every_transition") as w:
        number = w.issue()
        await w.lease(number)
        (w.checkout / "src" / "app.py").write_text("print('edited in the control checkout')\n", encoding="utf-8")
        before = checkout_snapshot(w.checkout)
        result = await w.bootstrap(number)
        assert result.status == "refused", result.to_dict()
        assert result.refusal is not None and result.refusal.reason == "checkout_not_clean"
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert checkout_snapshot(w.checkout) == before


async def test_a_foreign_live_registration_is_refused_never_ended() -> None:
    """Seed 004 AC7, amendment 4: when a transition binds its worktree and the issue already
    has a live worktree registration of another owner (as a concurrent writer could leave it), the bind is
    refused (foreign_registration) and the foreign registration stays live, untouched."""
    async with open_bootstrap_world() as w:
        other = w.issue("Bob's task")
        await w.lease(other, owner="bob")
        assert (await w.bootstrap(other, caller="bob")).status == "completed"
        number = w.issue()
        await w.lease(number)
        await w.cli_dies_after(number, "registration_verified")
        w.rows("UPDATE worktree_registrations SET issue_number = ? WHERE owner = 'bob'", number)
        foreign = w.rows("SELECT * FROM worktree_registrations WHERE owner = 'bob'")
        result = await w.bootstrap(number)
        assert result.status == "compensated", result.to_dict()
        assert result.refusal is not None and result.refusal.reason == "foreign_registration"
        assert w.rows("SELECT * FROM worktree_registrations WHERE owner = 'bob'") == foreign
        assert w.rows("SELECT ended_at FROM worktree_registrations WHERE owner = 'bob'") == [(None,)]


# --- preexisting content is kept --------------------------------------------------------------------------------------


async def test_a_preexisting_directory_identical_to_the_branch_tree_is_kept_byte_mode_and_mtime() -> None:
    """Amendment 4 and 6: a directory someone made at the canonical path, identical to the
    branch tree (one file 0600), is not deleted and re-created: the bootstrap refuses it (path_occupied, typed,
    with a next action) and every file keeps its bytes, mode and mtime; foreman's own branch is undone."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        path = w.path(number)
        path.mkdir(parents=True)
        readme = subprocess.run(["git", "cat-file", "blob", "main:README.md"], cwd=w.bare, capture_output=True,
                                check=True).stdout
        for name, content in {"README.md": readme, **FILES}.items():
            target = path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        os.chmod(path / "docs" / "guide.md", 0o600)
        past = utcnow() - timedelta(days=3)
        for current, _, names in os.walk(path):
            for name in names:
                os.utime(Path(current, name), ns=(int(past.timestamp() * 1e9),) * 2)
        tree = git(w.checkout, "ls-tree", "-r", "--name-only", "origin/main").split()
        assert sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) == sorted(tree)
        before, snapshot = file_stats(path), tree_snapshot(path)
        result = await w.bootstrap(number)
        assert file_stats(path) == before and tree_snapshot(path) == snapshot
        assert result.status != "completed", result.to_dict()
        assert result.refusal is not None and result.refusal.error == "invalid_state"
        assert result.refusal.reason == "path_occupied"
        assert "gitea_" in result.refusal.exact_next_action
        assert "worktree" in result.proof["kept"]
        assert git(w.checkout, "branch", "--list", w.branch(number)) == ""
        assert not [line for line in git(w.checkout, "worktree", "list", "--porcelain").splitlines()
                    if line == f"worktree {path}"]

