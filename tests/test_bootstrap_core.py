"""The pure bootstrap planning core (bot/core/bootstrap.py): names, keys, paths, phase order and plans."""

from __future__ import annotations

import subprocess
from pathlib import PurePosixPath

import pytest

from bot.core.bootstrap import (
    FORWARD_PHASES,
    PHASES,
    Blocked,
    BranchFacts,
    PathRejected,
    UndoFacts,
    WorktreeFacts,
    branch_for,
    check_canonical,
    derive_key,
    key_problem,
    may_follow,
    next_phase,
    outcome_of,
    plan_branch,
    plan_compensation,
    plan_worktree,
    ref_name_problems,
    resolve_requested,
    sha_problem,
    slugify,
    worktree_path_for,
)

CHECKOUT = PurePosixPath("/srv/checkouts/acme/widgets")
PIN = "a" * 40


def test_the_phase_order_is_the_amendments_list_and_moves_only_forward_or_to_compensation() -> None:
    """Amendment 1: the nine phases, in order; completed and compensated transitions are closed."""
    assert PHASES == ("accepted", "branch_confirmed", "path_reserved", "worktree_confirmed",
                      "registration_verified", "lock_established", "completed", "compensation_required",
                      "compensation_completed")
    assert [next_phase(p) for p in FORWARD_PHASES[:-1]] == list(FORWARD_PHASES[1:])
    assert next_phase("completed") is None and next_phase("compensation_completed") is None
    assert next_phase("compensation_required") == "compensation_completed"
    assert all(may_follow(p, "compensation_required") for p in FORWARD_PHASES[:-1])
    assert not may_follow("completed", "compensation_required")
    assert not may_follow("accepted", "path_reserved")  # no skipping
    assert [outcome_of(p) for p in ("accepted", "completed", "compensation_required", "compensation_completed")] == [
        "open", "completed", "open", "compensated"]


@pytest.mark.parametrize(
    ("title", "slug"),
    [
        ("Make the widgets shine!", "make-the-widgets-shine"),
        ("  Ünïcödé — titles / with ../ dots..lock  ", "unicode-titles-with-dots-lock"),
        ("", "work"),
        ("!!!", "work"),
        ("a" * 80, "a" * 40),
        ("one two three four five six seven eight nine ten", "one-two-three-four-five-six-seven-eight"),
    ],
)
def test_branch_slugs_are_git_safe_and_bounded(title: str, slug: str) -> None:
    assert slugify(title) == slug
    assert branch_for(617, title) == f"issue-617-{slug}"


NAMES = ["issue-1-ok", "a/b", "-x", "a..b", "a.lock", "a/.b", "a//b", "a/", "a.", "a@{b", "@", "a b", "a~b",
         "a^b", "a:b", "a?b", "a*b", "a[b", "a\\b", "HEAD", "a\x01b", "ok.name", "x/y.lock/z"]


def test_ref_name_rules_match_git_check_ref_format() -> None:
    """The derived branch name is validated as a git ref name (the same verdicts as git itself)."""
    for name in NAMES:
        git_ok = subprocess.run(["git", "check-ref-format", "--branch", name], capture_output=True,
                                check=False).returncode == 0
        if name in ("HEAD", "@"):
            git_ok = False  # git --branch reads these as shorthands for HEAD; as branch names they are refused
        assert (not ref_name_problems(name)) == git_ok, (name, ref_name_problems(name))


def test_idempotency_keys_are_derived_per_lease_and_attempt_and_checked_when_given() -> None:
    """Amendment 2: derived from authoritative state; a caller key must be safe in markers and lock reasons."""
    key = derive_key("acme/widgets", 5, "lease-1", 0)
    assert key == derive_key("acme/widgets", 5, "lease-1", 0) and key.startswith("bootstrap-5-")
    assert len({key, derive_key("acme/widgets", 5, "lease-1", 1), derive_key("acme/widgets", 5, "lease-2", 0),
                derive_key("acme/widgets", 6, "lease-1", 0)}) == 4
    assert key_problem(key) is None and key_problem("req-1:x.y_z") is None
    for bad in ("", "../x", "a b", "-lead", "x" * 101, "a\nb"):
        assert key_problem(bad) is not None, bad
    assert sha_problem("b" * 40) is None and sha_problem("c" * 64) is None
    assert sha_problem("B" * 40) and sha_problem("abc") and sha_problem("g" * 40)


def test_the_worktree_path_is_branches_slash_branch_and_nothing_else_passes() -> None:
    """Amendment 6: absolute paths, '..', anything outside branches/ and the root itself are refused."""
    assert worktree_path_for(CHECKOUT, "issue-1-x") == CHECKOUT / "branches" / "issue-1-x"
    with pytest.raises(PathRejected):
        worktree_path_for(CHECKOUT, "../../etc")
    for requested in ("/etc/passwd", "branches/../src", "../x", "src/app", "branches", "branches/./x", "",
                      "branches/a/../../b", "x\x00y"):
        with pytest.raises(PathRejected):
            resolve_requested(CHECKOUT, requested)
    assert resolve_requested(CHECKOUT, "branches/issue-2-y") == CHECKOUT / "branches" / "issue-2-y"
    for path in ("/srv/checkouts/acme/widgets/src", "/srv/checkouts/acme/widgets/branches",
                 "/srv/checkouts/acme/widgets/branches/../x", "relative/branches/x", "/elsewhere/branches/x"):
        with pytest.raises(PathRejected):
            check_canonical(CHECKOUT, PurePosixPath(path))
    with pytest.raises(PathRejected):
        check_canonical(PurePosixPath("relative"), PurePosixPath("/relative/branches/x"))


def branch(**facts: object) -> BranchFacts:
    base: dict[str, object] = {"sha": None, "created_by_this": False, "created_sha": None, "prior_same_owner": False}
    return BranchFacts(**{**base, **facts})  # type: ignore[arg-type]


def test_branch_plans_create_recognise_adopt_or_refuse_without_ever_repointing() -> None:
    """Amendment 3/4: create at the pin; ours (reflog proof) stays ours unless it moved (stale pin); a branch at
    the pin or the same owner's earlier one is adopted; anything else is ambiguous."""
    assert plan_branch(branch(), pin=PIN) == "create"
    assert plan_branch(branch(sha=PIN, created_by_this=True, created_sha=PIN), pin=PIN) == "ours"
    moved = plan_branch(branch(sha="b" * 40, created_by_this=True, created_sha=PIN), pin=PIN)
    assert isinstance(moved, Blocked) and moved.kind == "stale_pin" and moved.reason == "branch_moved"
    assert plan_branch(branch(sha=PIN), pin=PIN) == "adopt"
    assert plan_branch(branch(sha="b" * 40, prior_same_owner=True), pin=PIN) == "adopt"
    foreign = plan_branch(branch(sha="b" * 40), pin=PIN)
    assert isinstance(foreign, Blocked) and foreign.reason == "branch_exists_elsewhere"
    elsewhere = plan_branch(branch(sha=PIN, checked_out_elsewhere="/tmp/x"), pin=PIN)
    assert isinstance(elsewhere, Blocked) and elsewhere.reason == "branch_checked_out_elsewhere"


def wt(**facts: object) -> WorktreeFacts:
    base: dict[str, object] = {
        "path_exists": False, "path_is_symlink": False, "escapes_root": False, "entry_branch": None,
        "entry_head": None, "entry_prunable": False, "entry_locked_by_this": False, "admin_dir_by_this": False,
        "content_proven": False, "clean": False, "prior_same_owner": False,
    }
    return WorktreeFacts(**{**base, **facts})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "created", "plan"),
    [
        ({}, True, "create"),
        ({"escapes_root": True}, True, "path_escapes_root"),
        ({"path_exists": True, "path_is_symlink": True}, True, "path_escapes_root"),
        ({"path_exists": True, "entry_branch": "other"}, True, "incompatible_registration"),
        ({"path_exists": True, "entry_branch": ""}, True, "incompatible_registration"),
        ({"path_exists": True, "entry_branch": "b", "entry_locked_by_this": True, "clean": True}, True, "ours"),
        ({"path_exists": True, "entry_branch": "b", "entry_locked_by_this": True, "content_proven": True}, True,
         "repair"),
        ({"path_exists": True, "entry_branch": "b", "entry_locked_by_this": True}, True, "dirty_unproven"),
        ({"entry_branch": "b", "entry_locked_by_this": True, "entry_prunable": True}, True, "repair"),
        ({"entry_branch": "b", "entry_prunable": True}, False, "stale_registration"),
        ({"path_exists": True, "entry_branch": "b", "clean": True, "entry_head": PIN}, False, "adopt"),
        ({"path_exists": True, "entry_branch": "b", "clean": False, "entry_head": PIN}, False,
         "preexisting_worktree"),
        ({"path_exists": True, "entry_branch": "b", "clean": True, "entry_head": "c" * 40}, False,
         "preexisting_worktree"),
        ({"path_exists": True, "entry_branch": "b", "prior_same_owner": True}, False, "adopt"),
        ({"admin_dir_by_this": True}, True, "repair"),
        ({"path_exists": True, "content_proven": True, "reserved_empty": True}, True, "repair"),
        ({"path_exists": True, "content_proven": True}, True, "path_occupied"),  # preexisting
        ({"path_exists": True, "content_proven": True}, False, "path_occupied"),
        ({"path_exists": True}, True, "path_occupied"),
    ],
)
def test_worktree_plans(facts: dict[str, object], created: bool, plan: str) -> None:
    """Amendment 6: pre-existing content is adopted only when nothing has to change; half-made worktrees of this
    transition are repaired; everything else is refused and left as it is."""
    decided = plan_worktree(wt(**facts), branch="b", pin=PIN, branch_created_by_this=created)
    assert (decided.reason if isinstance(decided, Blocked) else decided) == plan


def undo(**facts: object) -> UndoFacts:
    base: dict[str, object] = {
        "worktree_created": False, "worktree_present": False, "worktree_registered": False,
        "worktree_preserves": False, "branch_created": False, "branch_present": False, "branch_at_created": False,
        "registration_live": False, "lease_live_and_ours": False,
    }
    return UndoFacts(**{**base, **facts})  # type: ignore[arg-type]


def test_compensation_undoes_only_what_the_journal_proves_it_created() -> None:
    """Amendment 4, AC4/AC5: reverse order; foreign artifacts kept; our own but content-bearing ones blocked."""
    everything = undo(worktree_created=True, worktree_present=True, worktree_registered=True,
                      worktree_preserves=True, branch_created=True, branch_present=True, branch_at_created=True,
                      registration_live=True, lease_live_and_ours=True)
    assert plan_compensation(everything, release_lease=True).undo == ("worktree", "branch", "registration", "lease")
    assert plan_compensation(everything, release_lease=False).keep == ("lease",)
    foreign = plan_compensation(undo(worktree_present=True, worktree_registered=True, branch_present=True),
                                release_lease=True)
    assert foreign.undo == () and foreign.keep == ("worktree", "branch") and foreign.blocked == ()
    dirty = plan_compensation(undo(worktree_created=True, worktree_present=True, worktree_registered=True,
                                   branch_created=True, branch_present=True, branch_at_created=True),
                              release_lease=True)
    assert dirty.blocked == ("worktree", "branch") and dirty.undo == ()
    moved = plan_compensation(undo(branch_created=True, branch_present=True, branch_at_created=False),
                              release_lease=True)
    assert moved.blocked == ("branch",)
    loose_dir = plan_compensation(undo(worktree_present=True, branch_created=True, branch_present=True,
                                       branch_at_created=True), release_lease=True)
    assert loose_dir.keep == ("worktree",) and loose_dir.undo == ("branch",)
