"""The transition's git steps (branch, path, worktree, registration), run in a thread, each returning its proof."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bot import gitops, worktree_access, worktree_files
from bot.core.bootstrap import (
    Blocked,
    BranchFacts,
    WorktreeFacts,
    is_issue_branch,
    plan_branch,
    plan_worktree,
    reflog_message,
    worktree_lock_reason,
)
from bot.verbs.bootstrap.faults import FAULT_STEP_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed
from bot.verbs.bootstrap.run import RunState
from state.journal import Transition


class GitSteps(RunState):
    """The git side of the forward phases: observe, plan (``bot.core.bootstrap``), act, read back."""

    def _reflog_creation(self, t: Transition) -> tuple[str, str] | None:
        """The branch's reflog creation entry (sha, message), read once per call and after every change."""
        if "creation" not in self.seen:
            reflog = self.checkout.reflog(t.branch)
            self.seen["creation"] = reflog[0] if reflog else None
            self.seen["newest"] = reflog[-1][0] if reflog else None
        creation: tuple[str, str] | None = self.seen["creation"]
        return creation

    def _created_branch(self, t: Transition) -> bool:
        creation = self._reflog_creation(t)
        return creation is not None and creation[1] == reflog_message(t.key)

    def _branch_facts(self, t: Transition, *, just_created: bool = False, known_absent: bool = False) -> (
        BranchFacts
    ):
        self.seen.pop("creation", None)
        if just_created:
            # git wrote the ref and its reflog entry together: the reflog read back is the ref's value now
            # (the completion reads refs/heads/<branch> itself once more).
            created = self._reflog_creation(t)
            sha = self.seen["newest"] if created is not None else self.checkout.branch_sha(t.branch)
        else:
            sha = None if known_absent else self.checkout.branch_sha(t.branch)
        ours = sha is not None and self._created_branch(t)
        creation = self._reflog_creation(t) if sha is not None else None
        elsewhere = None
        # A branch that did not exist (or that this call just created) cannot be checked out anywhere.
        if sha is not None and not (just_created and ours):
            elsewhere = next((e.path for e in self.checkout.worktrees()
                              if e.branch == t.branch and e.path != t.worktree_path), None)
        return BranchFacts(sha=sha, created_by_this=ours, created_sha=creation[0] if ours and creation else None,
                           prior_same_owner=t.inputs.get("prior_key") is not None, checked_out_elsewhere=elsewhere)

    def _branch_step(self, t: Transition) -> dict[str, Any]:
        # This call's reads of the issue's branches (while accepting) say whether the branch existed; creation is
        # create-only anyway, so a branch that appeared since makes it fail instead of being overwritten.
        refs = self.seen.get("issue_refs")
        facts = self._branch_facts(t, known_absent=refs is not None and is_issue_branch(t.branch, t.issue_number)
                                   and f"refs/heads/{t.branch}" not in refs)
        plan = plan_branch(facts, pin=t.base_sha)
        if plan == "create":
            made = self.checkout.create_branch(t.branch, t.base_sha, reflog_message(t.key))
            if made:
                crash_seam(FAULT_STEP_ENV, "ref_created")
            facts = self._branch_facts(t, just_created=made)  # read back what git holds now
            plan = "ours" if made and facts.created_by_this else plan_branch(facts, pin=t.base_sha)
        if isinstance(plan, Blocked):
            raise StepFailed(plan)
        creation = self._reflog_creation(t)
        return {
            "ref": f"refs/heads/{t.branch}",
            "sha": facts.sha,
            "created": plan == "ours",
            "plan": plan,
            "reflog_creation": {"sha": creation[0], "message": creation[1]} if creation else None,
        }

    def _path_step(self, t: Transition) -> dict[str, Any]:
        root, path = self.checkout.branches_root, Path(t.worktree_path)
        if worktree_files.escapes_root(root, path):
            raise StepFailed(Blocked("invalid_state", "path_escapes_root", f"{path} is or goes through a symbolic link"
                                     " out of branches/"))
        root_existed = root.exists()
        root.mkdir(exist_ok=True)
        if worktree_files.escapes_root(root, path):
            raise StepFailed(Blocked("invalid_state", "path_escapes_root", "branches/ became a symbolic link"))
        facts = self._worktree_facts(t)
        plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=self._created_branch(t))
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

    def _git_file_ok(self, text: str) -> bool:
        return text.startswith(f"gitdir: {self.checkout.git_dir}/worktrees/")

    def _worktree_facts(self, t: Transition, *, every: bool = False) -> WorktreeFacts:
        """What is at the canonical path. Nothing there and no metadata naming it (the usual case) is decided
        from the file system alone; anything else is examined with git (registration, status, content).

        The registration is read directly (``ControlCheckout.worktree_at``, ``admin_dir_for``: the path's own
        metadata, whatever the number of worktrees); ``every`` looks at every registration instead (git's list)."""
        root, path = self.checkout.branches_root, Path(t.worktree_path)
        prior = t.inputs.get("prior_key") is not None
        exists = os.path.lexists(path)
        admin = self.checkout.scanned_admin_dir_for(path) if every else self.checkout.admin_dir_for(path)
        reserved_empty = self._reserved_empty(t)
        if not exists and admin is None:
            return WorktreeFacts(False, False, worktree_files.escapes_root(root, path), None, None, False, False, False,
                                 False, False, prior, reserved_empty)
        entry = self.checkout.listed_worktree_at(path) if every else self.checkout.worktree_at(path)
        admin_ours = entry is None and admin is not None and self._admin_ours(t, admin.locked)
        locked_ours = entry is not None and entry.locked == worktree_lock_reason(t.key)
        is_dir = exists and path.is_dir() and not path.is_symlink()
        clean = False
        if entry is not None and entry.prunable is None and is_dir:
            clean = not self.checkout.worktree_status(path)
        proven = False
        if is_dir and ((locked_ours and not clean) or entry is None):
            creation = self._reflog_creation(t)
            sha = creation[0] if creation else self.checkout.branch_sha(t.branch)
            if sha:
                files = self.checkout.tree_files(sha)
                proven = not worktree_files.content_problems(path, files, git_file_ok=self._git_file_ok)
        return WorktreeFacts(
            path_exists=exists,
            path_is_symlink=path.is_symlink(),
            escapes_root=worktree_files.escapes_root(root, path),
            entry_branch=(entry.branch or "") if entry is not None else None,
            entry_head=entry.head if entry is not None else None,
            # git never calls a locked worktree prunable: a registration without its directory is, for us
            entry_prunable=entry is not None and (entry.prunable is not None or not exists),
            entry_locked_by_this=locked_ours,
            admin_dir_by_this=admin_ours,
            content_proven=proven,
            clean=clean,
            prior_same_owner=prior,
            reserved_empty=reserved_empty,
        )

    def _reserved_empty(self, t: Transition) -> bool:
        """This transition's journal recorded the canonical path free when it reserved it. Only then can anything
        found there since (a half-made checkout, git's "initializing" metadata) be its own: before that, or when
        the path was taken already, whatever is there is preexisting and is kept as it is."""
        reserved = self.proofs.get("path_reserved") if self.proofs_of == t.id else None
        return reserved is not None and reserved.get("existed") is False

    def _admin_ours(self, t: Transition, locked: str | None) -> bool:
        """Worktree metadata this transition provably made: locked with its reason, or with git's own
        "initializing" (an add that never finished) at a path this transition reserved free."""
        return locked == worktree_lock_reason(t.key) or (locked == "initializing" and self._reserved_empty(t))

    def _remove_partial(self, t: Transition, *, force: bool = True) -> list[str]:
        """Remove a worktree this transition provably made (registration, directory, metadata). Without
        ``force`` (a clean worktree) git itself refuses if anything appeared in it since it was judged."""
        path, reason = Path(t.worktree_path), worktree_lock_reason(t.key)
        removed: list[str] = []
        # Which metadata is ours is read before anything changes (unlocking deletes the lock that proves it).
        ours = [a for a in self.checkout.admin_dirs() if a.worktree_path == str(path) and self._admin_ours(t, a.locked)]
        entry = self.checkout.listed_worktree_at(path)
        has_dir = os.path.lexists(path) and path.is_dir() and not path.is_symlink()
        try:
            if entry is not None and entry.locked == reason and has_dir:
                self.checkout.unlock_worktree(path)
                self.checkout.remove_worktree(path, force=force, made_from=t.base_sha or None)
                removed.append("registration")
            if os.path.lexists(path) and path.is_dir() and not path.is_symlink():
                # No registration left to read a commit from: what the service checked out is the pinned base's.
                tracked = self.checkout.tree_files(t.base_sha) if t.base_sha else {}
                if kept := worktree_access.remove_tracked_tree(path, tracked):
                    raise gitops.WorktreeKept(path, kept)
                removed.append("directory")
        except gitops.WorktreeKept as exc:  # an agent's files are never removed with the service's
            raise StepFailed(Blocked("invalid_state", "worktree_kept",
                                     f"{exc}; an operator moves them out of {path} (or removes them), then the "
                                     "bootstrap is called again")) from exc
        for admin in ours:
            if admin.path.is_dir():
                self.checkout.remove_admin_dir(admin)
                removed.append(f"metadata {admin.name}")
        return removed

    def _worktree_step(self, t: Transition) -> dict[str, Any]:
        path = Path(t.worktree_path)
        facts = self._worktree_facts(t)
        plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=self._created_branch(t))
        if isinstance(plan, Blocked):
            raise StepFailed(plan)
        repaired: list[str] = []
        if plan == "repair":
            repaired = self._remove_partial(t)
        if plan in ("create", "repair"):
            try:
                self.checkout.register_worktree(path, t.branch, worktree_lock_reason(t.key))
            except gitops.GitFailure as exc:
                # git looked at every registration and found one at the path (its directory gone) under a name
                # the direct read does not look at (moved there by `git worktree move`): judged as if seen before.
                if "is a missing but" not in exc.stderr:
                    raise
                late = plan_worktree(self._worktree_facts(t, every=True), branch=t.branch, pin=t.base_sha,
                                     branch_created_by_this=self._created_branch(t))
                if isinstance(late, Blocked):
                    raise StepFailed(late) from exc
                raise
            # Registered, locked with this transition's reason, nothing checked out yet: a crash here leaves a
            # half-made checkout of our own, which the replay repairs (every file there is one of the tree's).
            crash_seam(FAULT_STEP_ENV, "worktree_registered")
            self.checkout.check_out(path)
            self._open_to_owner(t, path)
            self.fresh = True
            crash_seam(FAULT_STEP_ENV, "worktree_added")
        entry = self.checkout.worktree_at(path)
        if entry is None or entry.branch != t.branch:
            raise StepFailed(Blocked("invalid_state", "worktree_missing",
                                     "git does not list the worktree on its branch"))
        self.seen["entry"] = entry
        admin = self.checkout.admin_dir_for(path)
        return {
            "entry": entry.to_dict(),
            "created": plan in ("create", "repair", "ours"),
            "plan": plan,
            "repaired": repaired,
            "admin_dir": str(admin.path) if admin is not None else None,
        }

    def _open_to_owner(self, t: Transition, path: Path) -> None:
        """A worktree created for a login with a configured Unix group is handed to that group before anyone
        else can reach it (``bot.worktree_access``); without one it stays the service's alone."""
        group = worktree_access.group_for(self.cfg.worktree_groups, t.owner)
        if group is None:
            return
        try:
            worktree_access.grant(path, self.ctx.checkout_root, group)
        except worktree_access.WorktreeAccessError as exc:
            raise StepFailed(Blocked("invalid_state", "worktree_access", f"{exc}; an operator makes the service "
                                     f"a member of {group} (or fixes [bootstrap] worktree_groups)")) from exc

    def _registration_step(self, t: Transition) -> dict[str, Any]:
        path = Path(t.worktree_path)
        problems: list[str] = []
        if worktree_files.escapes_root(self.checkout.branches_root, path):
            problems.append("the path is or goes through a symbolic link out of branches/")
        view = self.checkout.worktree_view(path)
        entry: gitops.WorktreeEntry | None = self.seen.get("entry") or self.checkout.worktree_at(path)
        git_file = (path / ".git").read_text(encoding="utf-8").strip() if (path / ".git").is_file() else ""
        admin_gitdir = ""
        if git_file.startswith("gitdir: "):
            backlink = Path(git_file.removeprefix("gitdir: ")) / "gitdir"
            admin_gitdir = backlink.read_text(encoding="utf-8").strip() if backlink.is_file() else ""
        if os.path.realpath(view.toplevel) != os.path.realpath(path):
            problems.append(f"git resolves the worktree to {view.toplevel}")
        if os.path.realpath(view.common_dir) != os.path.realpath(self.checkout.git_dir):
            problems.append("the worktree belongs to another repository")
        branch_sha = (self.proofs.get("branch_confirmed") or {}).get("sha")
        if view.head_ref != f"refs/heads/{t.branch}" or (branch_sha and view.head != branch_sha):
            problems.append(f"HEAD is {view.head_ref or 'detached'} at {view.head}, not {t.branch} at {branch_sha}")
        if git_file != f"gitdir: {view.git_dir}" or os.path.realpath(admin_gitdir) != os.path.realpath(path / ".git"):
            problems.append("the worktree's .git file and its metadata do not point at each other")
        created = bool((self.proofs.get("worktree_confirmed") or {}).get("created"))
        if entry is None or entry.branch != t.branch:
            problems.append("git does not list the worktree on the issue branch")
        elif created and entry.locked != worktree_lock_reason(t.key):
            problems.append("the worktree lost the lock foreman gave it")
        if problems:
            raise StepFailed(Blocked("invalid_state", "registration_mismatch", "; ".join(problems)))
        self.seen["view"] = view
        return {
            "view": view.to_dict(),
            "entry": entry.to_dict() if entry is not None else None,
            "git_file": git_file,
            "admin_gitdir": admin_gitdir,
            "complete": "added by this call (git exit status 0)" if self.fresh else "registered earlier",
        }
