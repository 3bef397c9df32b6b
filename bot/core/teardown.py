"""The end of an issue's life, pure: which issue a pull request closes and what its teardown does with what is left."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from bot.core.canonical import CanonicalState
from bot.core.vocabulary import STATES, label_for_state

Reason = Literal["merged", "pr_closed", "issue_closed"]
REASONS: Final[tuple[Reason, ...]] = ("merged", "pr_closed", "issue_closed")

#: Gitea's default ``[repository.pull-request] CLOSE_KEYWORDS``, each followed by an optional colon and one space.
_CLOSING: Final = re.compile(
    r"(?i)(?:^|[\s(\[])(?:close|closes|closed|fix|fixes|fixed|resolve|resolves|resolved):? #([0-9]{1,18})(?![0-9])"
)
_ISSUE_BRANCH: Final = re.compile(r"^issue-([0-9]{1,18})-")


def closing_issue(*, body: str, title: str, head_ref: str) -> int | None:
    """The issue a pull request closes: the first closing keyword reference of its title or body, else the
    issue whose canonical branch (``issue-<N>-<slug>``, bot/core/bootstrap.py) is its head."""
    found = _CLOSING.search(f"{title}\n{body}")
    if found:
        return int(found.group(1))
    branch = _ISSUE_BRANCH.match(head_ref or "")
    return int(branch.group(1)) if branch else None


def pull_key(repo: str, issue_number: int, pr_number: int) -> str:
    """The teardown's idempotency key for a pull request's close: one teardown per PR, whatever replays it."""
    return f"teardown:{repo}:{issue_number}:pr-{pr_number}"


def closed_key(repo: str, issue_number: int, closed_at: str) -> str:
    """The key of an issue closed by a person (no pull request): one teardown per closing."""
    stamp = re.sub(r"[^0-9A-Za-z]", "", closed_at) or "unknown"
    return f"teardown:{repo}:{issue_number}:closed-{stamp}"


# --- the worktree and the branch --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorktreeFacts:
    """What git says of the worktree the bootstrap journal registered, read just before deciding."""

    path: str
    exists: bool
    created_by_foreman: bool
    #: ``git status --porcelain`` entries (tracked changes, untracked and ignored files): empty means clean.
    status: tuple[str, ...]
    head: str | None
    #: The pull request's merged head (None: not merged).
    merged_head: str | None
    #: HEAD is an ancestor of the default branch as fetched after the merge.
    head_in_default: bool
    #: Why git was not run on the worktree (its ``.git`` file or registration is not what foreman wrote), else None.
    refused: str | None = None
    #: The directory is gone but git still registers it (a removal cut short between the files and the registration).
    registered: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["remove", "delete", "keep", "absent"]
    reason: str

    def to_dict(self, done: str | None = None) -> dict[str, Any]:
        return {"action": done or self.action, "reason": self.reason}


def decide_worktree(facts: WorktreeFacts, *, remove_enabled: bool) -> Decision:
    """Remove only a clean worktree whose HEAD is the merged head or already in the default branch; anything else
    is kept as it is (nothing in it is ever lost) and the reason says what is there."""
    if not facts.exists:
        if facts.registered and facts.created_by_foreman and remove_enabled:
            return Decision("remove", "its directory is gone (a removal cut short); its registration goes too")
        return Decision("absent", "the worktree is no longer on disk")
    if not facts.created_by_foreman:
        return Decision("keep", "the worktree was there before foreman's bootstrap: it is not foreman's to remove")
    if facts.refused is not None:
        return Decision("keep", f"git was not run on it: {facts.refused}")
    if not remove_enabled:
        return Decision("keep", "[lifecycle] remove_worktree is off")
    if facts.status:
        shown = ", ".join(entry[3:] if len(entry) > 3 else entry for entry in facts.status[:10])
        more = f" and {len(facts.status) - 10} more" if len(facts.status) > 10 else ""
        return Decision("keep", f"uncommitted changes or untracked files: {shown}{more}")
    if facts.head is None:
        return Decision("keep", "git could not read the worktree's HEAD")
    if facts.head == facts.merged_head or facts.head_in_default:
        return Decision("remove", "clean, and its HEAD is merged into the default branch")
    return Decision("keep", f"HEAD {facts.head[:12]} has commits the default branch does not contain")


@dataclass(frozen=True, slots=True)
class BranchFacts:
    branch: str
    default_branch: str
    #: The branch's head on Gitea now (None: it is gone).
    remote_sha: str | None
    merged_head: str | None


def decide_branch(facts: BranchFacts, *, reason: Reason, delete_enabled: bool) -> Decision:
    """Delete the issue branch on Gitea only after a merge, when configured, never the default branch, and only
    while it still is the merged head (a branch that moved since holds work nobody merged)."""
    if facts.branch == facts.default_branch:
        return Decision("keep", "never the default branch")
    if facts.remote_sha is None:
        return Decision("absent", "the branch is not on Gitea")
    if reason != "merged":
        return Decision("keep", "nothing was merged: the branch keeps the work")
    if not delete_enabled:
        return Decision("keep", "[lifecycle] delete_branch_after_merge is off")
    if facts.remote_sha != facts.merged_head:
        return Decision("keep", f"the branch moved since the merged head (now {facts.remote_sha[:12]})")
    return Decision("delete", "merged, and still at the merged head")


# --- what the end of the life says ------------------------------------------------------------------------------------

_WHAT: Final[Mapping[Reason, str]] = {
    "merged": "pull request #{pr} was merged",
    "pr_closed": "pull request #{pr} was closed without a merge",
    "issue_closed": "the issue was closed",
}


def done_labels() -> dict[str, list[str]]:
    """The label change of a finished issue: ``status:done`` in, every other status label out."""
    done = label_for_state("done")
    return {"add": [done], "remove": sorted(row.label for row in STATES if row.label != done)}


def summary(reason: Reason, pr: int | None, worktree: Mapping[str, Any] | None,
            branch: Mapping[str, Any] | None) -> str:
    """One line for the final comment: why the life ended and what was kept."""
    what = _WHAT[reason].format(pr=pr)
    kept = [f"the worktree was kept ({worktree['reason']})"] if worktree and worktree["action"] == "kept" else []
    if branch and branch["action"] == "kept":
        kept.append(f"the branch was kept ({branch['reason']})")
    tail = "; ".join(kept) if kept else "nothing was left behind"
    return f"Done: {what}; every lease ended; {tail}."


def final_state(reason: Reason, pr: int | None, *, kept: Sequence[str], bot_login: str) -> CanonicalState:
    """The issue's last Canonical Issue State: done, and a person decides about anything kept."""
    what = _WHAT[reason].format(pr=pr)
    return CanonicalState(
        state="done",
        who_is_next="human" if kept else "controller",
        next_action=("a person decides about what was kept: " + "; ".join(kept)) if kept else "none: the issue is done",
        next_prompt="",
        what_happened=f"{what}; foreman ended the issue's leases and tore down what it had set up",
        why=f"teardown on {reason}",
        related_prs=(pr,) if pr else (),
        blockers="none",
        validation="lease records, worktree and branch checked by foreman; this comment and the label read back",
        last_updated_by=bot_login or "foreman",
    )
