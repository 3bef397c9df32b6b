"""Why a refusal happened, within its kind: the stable machine tokens an envelope carries as ``details.reason``.

Each family's own are named here, below every family that uses them (the bootstrap's ``BlockReason``, the merge
gate's ``MergeBlock``, the verbs'); ``RefusalReason`` is every one, so an envelope built with a reason, and a caller
comparing one, are checked by the type checker (a misspelt reason is an error, not a refusal nobody recognises).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

#: Why a bootstrap cannot go on: the stable machine token of a ``Blocked`` (an envelope's ``details.reason``).
BlockReason = Literal[
    # acceptance: what Gitea and the control checkout show
    "clone_url_unusable", "checkout_not_clean", "path_escapes_root", "ambiguous_branches", "foreign_work",
    "remote_branch_exists",
    # the steps: the live base, git, the plans on observed state, the binding, the read-back
    "base_unreadable", "base_moved", "git_failed", "worktree_refused", "branch_checked_out_elsewhere",
    "branch_moved", "branch_exists_elsewhere", "incompatible_registration", "dirty_unproven", "stale_registration",
    "preexisting_worktree", "path_occupied", "worktree_access", "worktree_missing", "registration_mismatch",
    "owner_unassignable", "assignment_unverified", "foreign_registration", "lease_changed", "readback_failed",
    # compensation, and a recorded failure read back without its reason
    "worktree_kept", "compensation_blocked", "stale_pin", "failed",
]

#: Why the merge gate counts no approval, or blocks one: no verdict of foreman's review verb approves the PR; the
#: one it recorded is no longer on Gitea as recorded (dismissed, gone, changed); its reviewer may not approve this
#: PR now (off the roster's reviewers, the implementer, the PR's poster); a request-changes verdict stands on the
#: head.
#: Under branch protection and required statuses: fewer counted approvals on the head than the rule requires, a
#: required status not yet reported or pending, one failing, the head behind its base (``block_on_outdated_branch``).
MergeBlock = Literal["approval_not_recorded", "approval_withdrawn", "reviewer_not_allowed", "changes_requested",
                     "approvals_missing", "status_pending", "status_failed", "branch_outdated"]

#: The verbs' own: the allocation (a busy author or owner, a proof that failed, a selection or fingerprint that
#: changed, an issue excluded while its controller holds it), the leases and the worktree bootstrap's door checks,
#: the review and merge (a lease on the issue, a verdict on one's own PR, a head that moved), the publish (a nested
#: repository), the control checkout's origin and the token Gitea or git refused.
VerbReason = Literal[
    "authors_busy", "owner_busy", "bootstrap_preflight_failed", "selection_changed", "fingerprint_mismatch",
    "excluded_owned_lease", "lease_ended", "no_worktree_for_action", "leased", "review_by_pr_poster", "head_moved",
    "nested_repository", "checkout_origin", "origin_not_same_repository", "gitea_token_refused", "clone_auth_failed",
    "clone_repository_not_found", "lease_expired", "lease_released", "pull_request_draft",
    # the merge as Gitea decides it: still checking mergeability, a conflict (handed back), the merge whitelist,
    # a push Gitea rejected, a fast-forward-only merge on a diverged base, Gitea's own protection refusal
    "mergeability_checking", "merge_conflict", "merger_not_allowed", "merge_push_rejected", "base_diverged",
    "protection_refused",
    # the update of a PR from its base (a conflict, a PR not behind), and the publish after one (bot/verbs/update.py)
    "update_conflict", "pull_not_behind", "branch_behind_remote",
    # the reads (bot/verbs/reads.py): an issue of a repository the door does not serve, a number that is a pull
    # request (or a plain issue with none), a number Gitea does not know, a diff file the pull request does not change
    "other_repository", "not_an_issue", "no_pull_request", "issue_not_found", "file_not_in_diff",
]

RefusalReason = Literal[VerbReason, MergeBlock, BlockReason]
REFUSAL_REASONS: Final[frozenset[str]] = frozenset(get_args(VerbReason) + get_args(MergeBlock) + get_args(BlockReason))
