"""The transition's git steps (branch, path, worktree, registration), run in a thread, each returning its proof,
and their compensations (undo only what the journal proves the transition made)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot import gitops, worktree_access, worktree_files
from bot.core.bootstrap import (
    Blocked,
    BranchFacts,
    UndoFacts,
    UndoPlan,
    WorktreeFacts,
    is_issue_branch,
    plan_branch,
    plan_compensation,
    plan_worktree,
    reflog_message,
    worktree_lock_reason,
)
from bot.verbs.bootstrap.faults import FAULT_STEP_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed
from bot.verbs.bootstrap.run import Run
from state.journal import Transition


def reflog_creation(run: Run, t: Transition) -> tuple[str, str] | None:
    """The branch's reflog creation entry (sha, message), read once per call and after every change."""
    if not run.seen.reflog_read:
        reflog = run.checkout.reflog(t.branch)
        run.seen.creation = reflog[0] if reflog else None
        run.seen.newest = reflog[-1][0] if reflog else None
        run.seen.reflog_read = True
    return run.seen.creation


def created_branch(run: Run, t: Transition) -> bool:
    creation = reflog_creation(run, t)
    return creation is not None and creation[1] == reflog_message(t.key)


def branch_facts(run: Run, t: Transition, *, just_created: bool = False, known_absent: bool = False) -> (
    BranchFacts
):
    run.seen.reflog_read = False
    if just_created:
        # git wrote the ref and its reflog entry together: the reflog read back is the ref's value now
        # (the completion reads refs/heads/<branch> itself once more).
        created = reflog_creation(run, t)
        sha = run.seen.newest if created is not None else run.checkout.branch_sha(t.branch)
    else:
        sha = None if known_absent else run.checkout.branch_sha(t.branch)
    ours = sha is not None and created_branch(run, t)
    creation = reflog_creation(run, t) if sha is not None else None
    elsewhere = None
    # A branch that did not exist (or that this call just created) cannot be checked out anywhere.
    if sha is not None and not (just_created and ours):
        elsewhere = next((e.path for e in run.checkout.worktrees()
                          if e.branch == t.branch and e.path != t.worktree_path), None)
    # A takeover (takeover.py) pointed the branch at its start commit itself: there it is the work taken over.
    takeover = t.inputs.get("takeover")
    taken_over = takeover is not None and sha is not None and sha == takeover.get("start_sha")
    return BranchFacts(sha=sha, created_by_this=ours, created_sha=creation[0] if ours and creation else None,
                       prior_same_owner=t.inputs.get("prior_key") is not None or taken_over,
                       checked_out_elsewhere=elsewhere)


def confirm_branch(run: Run, t: Transition) -> dict[str, Any]:
    # This call's reads of the issue's branches (while accepting) say whether the branch existed; creation is
    # create-only anyway, so a branch that appeared since makes it fail instead of being overwritten.
    refs = run.seen.issue_refs
    facts = branch_facts(run, t, known_absent=refs is not None and is_issue_branch(t.branch, t.issue_number)
                               and f"refs/heads/{t.branch}" not in refs)
    plan = plan_branch(facts, pin=t.base_sha)
    if plan == "create":
        made = run.checkout.create_branch(t.branch, t.base_sha, reflog_message(t.key))
        if made:
            crash_seam(FAULT_STEP_ENV, "ref_created")
        facts = branch_facts(run, t, just_created=made)  # read back what git holds now
        plan = "ours" if made and facts.created_by_this else plan_branch(facts, pin=t.base_sha)
    if isinstance(plan, Blocked):
        raise StepFailed(plan)
    creation = reflog_creation(run, t)
    return {
        "ref": f"refs/heads/{t.branch}",
        "sha": facts.sha,
        "created": plan == "ours",
        "plan": plan,
        "reflog_creation": {"sha": creation[0], "message": creation[1]} if creation else None,
    }


def reserve_path(run: Run, t: Transition) -> dict[str, Any]:
    root, path = run.checkout.branches_root, Path(t.worktree_path)
    if worktree_files.escapes_root(root, path):
        raise StepFailed(Blocked("invalid_state", "path_escapes_root", f"{path} is or goes through a symbolic link"
                                 " out of branches/"))
    root_existed = root.exists()
    root.mkdir(exist_ok=True)
    if worktree_files.escapes_root(root, path):
        raise StepFailed(Blocked("invalid_state", "path_escapes_root", "branches/ became a symbolic link"))
    facts = worktree_facts(run, t)
    plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=created_branch(run, t))
    if isinstance(plan, Blocked):
        raise StepFailed(plan)
    return {
        "path": str(path),
        "branches_root": str(root),
        "branches_root_created": not root_existed,
        "existed": facts.path_exists,
        "plan": "reserved" if plan == "create" else plan,
        "parent_realpath": os.path.realpath(path.parent),
    }


def git_file_ok(run: Run, text: str) -> bool:
    return text.startswith(f"gitdir: {run.checkout.git_dir}/worktrees/")


def worktree_facts(run: Run, t: Transition, *, every: bool = False) -> WorktreeFacts:
    """What is at the canonical path. Nothing there and no metadata naming it (the usual case) is decided
    from the file system alone; anything else is examined with git (registration, status, content).

    The registration is read directly (``ControlCheckout.worktree_at``, ``admin_dir_for``: the path's own
    metadata, whatever the number of worktrees); ``every`` looks at every registration instead (git's list)."""
    root, path = run.checkout.branches_root, Path(t.worktree_path)
    prior = t.inputs.get("prior_key") is not None
    exists = os.path.lexists(path)
    admin = run.checkout.scanned_admin_dir_for(path) if every else run.checkout.admin_dir_for(path)
    reserved = reserved_empty(run, t)
    if not exists and admin is None:
        return WorktreeFacts(False, False, worktree_files.escapes_root(root, path), None, None, False, False, False,
                             False, False, prior, reserved)
    entry = run.checkout.listed_worktree_at(path) if every else run.checkout.worktree_at(path)
    admin_by_this = entry is None and admin is not None and admin_ours(run, t, admin.locked)
    locked_ours = entry is not None and entry.locked == worktree_lock_reason(t.key)
    is_dir = exists and path.is_dir() and not path.is_symlink()
    clean = False
    if entry is not None and entry.prunable is None and is_dir:
        clean = not run.checkout.worktree_status(path)
    proven = False
    if is_dir and ((locked_ours and not clean) or entry is None):
        creation = reflog_creation(run, t)
        sha = creation[0] if creation else run.checkout.branch_sha(t.branch)
        if sha:
            files = run.checkout.tree_files(sha)
            proven = not worktree_files.content_problems(path, files, git_file_ok=lambda text: git_file_ok(run, text))
    return WorktreeFacts(
        path_exists=exists,
        path_is_symlink=path.is_symlink(),
        escapes_root=worktree_files.escapes_root(root, path),
        entry_branch=(entry.branch or "") if entry is not None else None,
        entry_head=entry.head if entry is not None else None,
        # git never calls a locked worktree prunable: a registration without its directory is, for us
        entry_prunable=entry is not None and (entry.prunable is not None or not exists),
        entry_locked_by_this=locked_ours,
        admin_dir_by_this=admin_by_this,
        content_proven=proven,
        clean=clean,
        prior_same_owner=prior,
        reserved_empty=reserved,
    )


def reserved_empty(run: Run, t: Transition) -> bool:
    """This transition's journal recorded the canonical path free when it reserved it. Only then can anything
    found there since (a half-made checkout, git's "initializing" metadata) be its own: before that, or when
    the path was taken already, whatever is there is preexisting and is kept as it is."""
    reserved = run.proofs.get("path_reserved") if run.proofs_of == t.id else None
    return reserved is not None and reserved.get("existed") is False


def admin_ours(run: Run, t: Transition, locked: str | None) -> bool:
    """Worktree metadata this transition provably made: locked with its reason, or with git's own
    "initializing" (an add that never finished) at a path this transition reserved free."""
    return locked == worktree_lock_reason(t.key) or (locked == "initializing" and reserved_empty(run, t))


def remove_partial(run: Run, t: Transition, *, force: bool = True) -> list[str]:
    """Remove a worktree this transition provably made (registration, directory, metadata). Without
    ``force`` (a clean worktree) git itself refuses if anything appeared in it since it was judged."""
    path, reason = Path(t.worktree_path), worktree_lock_reason(t.key)
    removed: list[str] = []
    # Which metadata is ours is read before anything changes (unlocking deletes the lock that proves it).
    ours = [a for a in run.checkout.admin_dirs() if a.worktree_path == str(path) and admin_ours(run, t, a.locked)]
    entry = run.checkout.listed_worktree_at(path)
    has_dir = os.path.lexists(path) and path.is_dir() and not path.is_symlink()
    try:
        if entry is not None and entry.locked == reason and has_dir:
            run.checkout.unlock_worktree(path)
            run.checkout.remove_worktree(path, force=force, made_from=t.base_sha or None)
            removed.append("registration")
        if os.path.lexists(path) and path.is_dir() and not path.is_symlink():
            # No registration left to read a commit from: what the service checked out is the pinned base's.
            tracked = run.checkout.tree_files(t.base_sha) if t.base_sha else {}
            if kept := worktree_access.remove_tracked_tree(path, tracked):
                raise gitops.WorktreeKept(path, kept)
            removed.append("directory")
    except gitops.WorktreeKept as exc:  # an agent's files are never removed with the service's
        raise StepFailed(Blocked("invalid_state", "worktree_kept",
                                 f"{exc}; an operator moves them out of {path} (or removes them), then the "
                                 "bootstrap is called again")) from exc
    for admin in ours:
        if admin.path.is_dir():
            run.checkout.remove_admin_dir(admin)
            removed.append(f"metadata {admin.name}")
    return removed


def confirm_worktree(run: Run, t: Transition) -> dict[str, Any]:
    path = Path(t.worktree_path)
    facts = worktree_facts(run, t)
    plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=created_branch(run, t))
    if isinstance(plan, Blocked):
        raise StepFailed(plan)
    repaired: list[str] = []
    if plan == "repair":
        repaired = remove_partial(run, t)
    if plan in ("create", "repair"):
        try:
            run.checkout.register_worktree(path, t.branch, worktree_lock_reason(t.key))
        except gitops.GitFailure as exc:
            # git looked at every registration and found one at the path (its directory gone) under a name
            # the direct read does not look at (moved there by `git worktree move`): judged as if seen before.
            if "is a missing but" not in exc.stderr:
                raise
            late = plan_worktree(worktree_facts(run, t, every=True), branch=t.branch, pin=t.base_sha,
                                 branch_created_by_this=created_branch(run, t))
            if isinstance(late, Blocked):
                raise StepFailed(late) from exc
            raise
        # Registered, locked with this transition's reason, nothing checked out yet: a crash here leaves a
        # half-made checkout of our own, which the replay repairs (every file there is one of the tree's).
        crash_seam(FAULT_STEP_ENV, "worktree_registered")
        run.checkout.check_out(path)
        open_to_owner(run, t, path)
        run.fresh = True
        crash_seam(FAULT_STEP_ENV, "worktree_added")
    entry = run.checkout.worktree_at(path)
    if entry is None or entry.branch != t.branch:
        raise StepFailed(Blocked("invalid_state", "worktree_missing",
                                 "git does not list the worktree on its branch"))
    run.seen.entry = entry
    admin = run.checkout.admin_dir_for(path)
    return {
        "entry": entry.to_dict(),
        "created": plan in ("create", "repair", "ours"),
        "plan": plan,
        "repaired": repaired,
        "admin_dir": str(admin.path) if admin is not None else None,
    }


def open_to_owner(run: Run, t: Transition, path: Path) -> None:
    """A worktree created for a login with a configured Unix group is handed to that group before anyone
    else can reach it (``bot.worktree_access``); without one it stays the service's alone."""
    group = worktree_access.group_for(run.cfg.worktree_groups, t.owner)
    if group is None:
        return
    try:
        worktree_access.grant(path, run.ctx.checkout_root, group)
    except worktree_access.WorktreeAccessError as exc:
        raise StepFailed(Blocked("invalid_state", "worktree_access", f"{exc}; an operator makes the service "
                                 f"a member of {group} (or fixes [bootstrap] worktree_groups)")) from exc


def verify_registration(run: Run, t: Transition) -> dict[str, Any]:
    path = Path(t.worktree_path)
    problems: list[str] = []
    if worktree_files.escapes_root(run.checkout.branches_root, path):
        problems.append("the path is or goes through a symbolic link out of branches/")
    view = run.checkout.worktree_view(path)
    entry = run.seen.entry or run.checkout.worktree_at(path)
    git_file = (path / ".git").read_text(encoding="utf-8").strip() if (path / ".git").is_file() else ""
    admin_gitdir = ""
    if git_file.startswith("gitdir: "):
        backlink = Path(git_file.removeprefix("gitdir: ")) / "gitdir"
        admin_gitdir = backlink.read_text(encoding="utf-8").strip() if backlink.is_file() else ""
    if os.path.realpath(view.toplevel) != os.path.realpath(path):
        problems.append(f"git resolves the worktree to {view.toplevel}")
    if os.path.realpath(view.common_dir) != os.path.realpath(run.checkout.git_dir):
        problems.append("the worktree belongs to another repository")
    branch_sha = (run.proofs.get("branch_confirmed") or {}).get("sha")
    if view.head_ref != f"refs/heads/{t.branch}" or (branch_sha and view.head != branch_sha):
        problems.append(f"HEAD is {view.head_ref or 'detached'} at {view.head}, not {t.branch} at {branch_sha}")
    if git_file != f"gitdir: {view.git_dir}" or os.path.realpath(admin_gitdir) != os.path.realpath(path / ".git"):
        problems.append("the worktree's .git file and its metadata do not point at each other")
    created = bool((run.proofs.get("worktree_confirmed") or {}).get("created"))
    if entry is None or entry.branch != t.branch:
        problems.append("git does not list the worktree on the issue branch")
    elif created and entry.locked != worktree_lock_reason(t.key):
        problems.append("the worktree lost the lock foreman gave it")
    if problems:
        raise StepFailed(Blocked("invalid_state", "registration_mismatch", "; ".join(problems)))
    run.seen.view = view
    return {
        "view": view.to_dict(),
        "entry": entry.to_dict() if entry is not None else None,
        "git_file": git_file,
        "admin_gitdir": admin_gitdir,
        "complete": "added by this call (git exit status 0)" if run.fresh else "registered earlier",
    }


# --- compensation: undo only what this journal proves it made ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Undo:
    """What compensation observed and planned, handed to each step's ``compensate``."""

    plan: UndoPlan
    clean: bool  # the worktree had no change: without force git refuses if anything appeared in it since
    created_sha: str | None  # where this transition created the branch (its reflog), None: not created by it


#: A step's compensation: undo in git what the step made, as the plan says; returns what it removed.
GitUndo = Callable[[Run, Transition, Undo], list[str]]


def undo_git(run: Run, t: Transition, undoers: Sequence[GitUndo], *, release: bool, registration_live: bool,
             lease_ours: bool) -> tuple[UndoPlan, dict[str, Any], list[str]]:
    """Observe, plan and perform the git side of compensation (only artifacts this journal proves it made): each
    step's ``undoers`` in turn, the last step's first. Returns the plan, what was observed and what was removed."""
    if not run.checkout.exists():
        facts = UndoFacts(False, False, False, False, False, False, False, registration_live, lease_ours)
        return plan_compensation(facts, release_lease=release), {"checkout": "absent"}, []
    reflog = run.checkout.reflog(t.branch)
    branch_ours = bool(reflog) and reflog[0][1] == reflog_message(t.key)
    created_sha = reflog[0][0] if branch_ours else None
    branch_sha = run.checkout.branch_sha(t.branch)
    wt = worktree_facts(run, t, every=True)  # a failure's undo looks at every registration (git's own list)
    entry_dir_present = wt.path_exists and not wt.path_is_symlink
    present = wt.entry_branch is not None or wt.admin_dir_by_this or entry_dir_present
    # An unregistered directory is ours only if the path was reserved free (a directory that was there before,
    # even one identical to the branch tree, is preexisting work and stays byte for byte).
    created = wt.entry_locked_by_this or wt.admin_dir_by_this or (
        wt.entry_branch is None and entry_dir_present and wt.content_proven and branch_ours and wt.reserved_empty)
    head_ok = wt.entry_head is None or wt.entry_head == created_sha
    preserves = head_ok and (wt.entry_prunable or not entry_dir_present or wt.clean or wt.content_proven)
    facts = UndoFacts(
        worktree_created=created,
        worktree_present=present,
        worktree_registered=wt.entry_branch is not None,
        worktree_preserves=preserves,
        branch_created=branch_ours,
        branch_present=branch_sha is not None,
        branch_at_created=branch_sha is not None and branch_sha == created_sha,
        registration_live=registration_live,
        lease_live_and_ours=lease_ours,
    )
    undo = Undo(plan_compensation(facts, release_lease=release), wt.clean, created_sha)
    done = [item for undoer in undoers for item in undoer(run, t, undo)]
    observed = {"branch_sha": branch_sha, "branch_created_sha": created_sha,
                "worktree": {"present": present, "created_by_this": created, "preserves": preserves,
                             "registered_branch": wt.entry_branch, "path_exists": wt.path_exists}}
    return undo.plan, observed, done


def undo_worktree(run: Run, t: Transition, undo: Undo) -> list[str]:
    """The worktree step's compensation: remove the worktree it made (registration, directory, metadata)."""
    if "worktree" not in undo.plan.undo:
        return []
    done = [f"worktree {item}" for item in remove_partial(run, t, force=not undo.clean)]
    crash_seam(FAULT_STEP_ENV, "worktree_removed")
    return done


def undo_branch(run: Run, t: Transition, undo: Undo) -> list[str]:
    """The branch step's compensation: delete the branch where it created it (git refuses if it moved)."""
    if "branch" not in undo.plan.undo or undo.created_sha is None:
        return []
    if not run.checkout.delete_branch(t.branch, undo.created_sha):
        return []
    crash_seam(FAULT_STEP_ENV, "branch_deleted")
    return [f"branch {t.branch} at {undo.created_sha}"]
