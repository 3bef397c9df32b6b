"""The merge rules on plain values (issue 32): which protection rule applies to a base branch, the required
statuses, the merge whitelist, the gate under required approvals, and what each of Gitea's refusals of a merge means."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from bot.core.canonical import CanonicalState, as_line, as_prompt
from bot.core.protection import MergeRules, merge_rules, rule_for, rule_matches, status_check
from bot.gitea.errors import GiteaConflict, GiteaInvalid, GiteaUnavailable
from bot.verbs.merge_attempts import classify
from bot.verbs.merge_gate import merge_gate
from tests.test_merge_gate_rules import HEAD, _pull, _recorded, _review


@dataclass(frozen=True)
class Rule:
    rule_name: str
    priority: int = 0
    created_at: datetime | None = None
    required_approvals: int = 0
    block_on_rejected_reviews: bool = False
    block_on_outdated_branch: bool = False
    dismiss_stale_approvals: bool = False
    ignore_stale_approvals: bool = False
    enable_merge_whitelist: bool = False
    merge_whitelist_usernames: tuple[str, ...] = ()
    merge_whitelist_teams: tuple[str, ...] = ()
    enable_status_check: bool = False
    status_check_contexts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Status:
    context: str
    state: str
    target_url: str = ""
    description: str = ""


def _at(day: int) -> datetime:
    return datetime(2026, 1, day, tzinfo=UTC)


def test_the_rule_for_a_branch_is_gitea_s_first_match() -> None:
    """Priority first, then a plain name before a glob, then the oldest; a plain name matches in any case; a glob's
    ``*`` stops at ``/``, ``**`` does not."""
    glob_old, plain_new = Rule("ma*", created_at=_at(1)), Rule("main", created_at=_at(2))
    assert rule_for("main", [glob_old, plain_new]) is plain_new
    assert rule_for("MAIN", [plain_new]) is plain_new
    first = Rule("ma*", priority=1, created_at=_at(1))
    assert rule_for("main", [Rule("main", priority=2), first]) is first
    older, newer = Rule("release/*", created_at=_at(1)), Rule("release/?", created_at=_at(2))
    assert rule_for("release/1", [newer, older]) is older
    assert rule_for("release/1/2", [older]) is None
    assert rule_matches("release/**", "release/1/2") and not rule_matches("release/*", "release/1/2")
    assert rule_matches("{main,dev}", "dev") and not rule_matches("[!m]ain", "main")


def test_required_statuses_come_from_the_rule_then_the_config_then_the_base() -> None:
    rule = Rule("main", required_approvals=2, enable_status_check=True, status_check_contexts=("ci/*",))
    assert merge_rules("main", rule, require_status=["lint"]).required_contexts == ("ci/*",)
    assert merge_rules("main", None, require_status=["lint"]).contexts_from == "config"
    found = merge_rules("main", None, require_status=None, base_contexts=["ci/build", "ci/build", "lint"])
    assert (found.required_contexts, found.contexts_from) == (("ci/build", "lint"), "base")
    assert merge_rules("main", None, require_status=[]).contexts_from == "none"
    assert merge_rules("main", Rule("main"), require_status=None).required_approvals == 1  # foreman's floor


def test_a_required_status_is_pending_until_every_pattern_has_a_passing_status() -> None:
    assert status_check([], ["ci/*"]).state == "pending"
    assert status_check([Status("ci/build", "success")], ["ci/*", "lint"]).missing == ("lint",)
    assert status_check([Status("ci/build", "success")], ["ci/*", "lint"]).state == "pending"
    failing = status_check([Status("ci/build", "failure", "https://ci/7", "2 failed"), Status("lint", "pending")],
                           ["ci/*", "lint"])
    assert failing.state == "failure" and failing.failing == (("ci/build", "failure", "https://ci/7", "2 failed"),)
    assert "status check ci/build failure (https://ci/7)" in failing.summary()
    assert status_check([Status("ci/a", "success"), Status("ci/b", "skipped")], ["ci/*"]).state == "success"
    assert status_check([Status("ci/a", "warning")], ["ci/*"]).state == "failure"
    assert status_check([Status("other", "failure")], []).state == "success"  # nothing required


def test_the_merge_whitelist_refuses_a_user_off_it_and_leaves_teams_to_gitea() -> None:
    users = merge_rules("main", Rule("main", enable_merge_whitelist=True, merge_whitelist_usernames=("Merger-1",)),
                        require_status=[])
    assert users.may_merge("merger-1") is True and users.may_merge("merger-2") is False
    teams = merge_rules("main", Rule("main", enable_merge_whitelist=True, merge_whitelist_teams=("mergers",)),
                        require_status=[])
    assert teams.may_merge("merger-2") is None
    assert merge_rules("main", Rule("main"), require_status=[]).may_merge("anyone") is True


def test_two_required_approvals_count_one_per_reviewer_on_the_head() -> None:
    rules = MergeRules("main", "main", required_approvals=2)
    reviewers = frozenset({"author-2", "author-4"})
    one = merge_gate([_recorded(1)], [_review(1, "foreman-bot")], _pull(), implementer="author-1",
                     reviewers=reviewers, rules=rules)
    assert (one.block, one.missing(), one.approved) == ("approvals_missing", "approvals 1 of 2", False)
    twice = merge_gate([_recorded(1), _recorded(2)], [_review(1, "foreman-bot"), _review(2, "foreman-bot")],
                       _pull(), implementer="author-1", reviewers=reviewers, rules=rules)
    assert twice.block == "approvals_missing" and [n.why for n in twice.not_counted] == ["superseded"]
    two = merge_gate([_recorded(1), _recorded(2, "author-4")], [_review(1, "foreman-bot"), _review(2, "foreman-bot")],
                     _pull(), implementer="author-1", reviewers=reviewers, rules=rules)
    assert two.block is None and two.approved and two.approvers == {"author-2", "author-4"}
    # One of the two on an older commit: the head needs another of its own.
    old = merge_gate([_recorded(1, commit="c" * 40), _recorded(2, "author-4")],
                     [_review(1, "foreman-bot", commit="c" * 40), _review(2, "foreman-bot")], _pull(),
                     implementer="author-1", reviewers=reviewers, rules=rules)
    assert old.block == "approvals_missing" and len(old.approvals) == 1
    assert [(n.review_id, n.why) for n in old.not_counted] == [(1, "stale")]
    assert HEAD == _pull().head_sha


def test_a_rejection_on_an_older_commit_blocks_only_under_block_on_rejected_reviews() -> None:
    reviews = [_review(1, "foreman-bot"), _review(5, "carol", "REQUEST_CHANGES", commit="c" * 40)]
    reviewers = frozenset({"author-2"})
    assert merge_gate([_recorded(1)], reviews, _pull(), implementer="author-1", reviewers=reviewers).block is None
    blocked = merge_gate([_recorded(1)], reviews, _pull(), implementer="author-1", reviewers=reviewers,
                         rules=MergeRules("main", "main", block_on_rejected_reviews=True))
    assert blocked.block == "changes_requested" and blocked.missing() == "blocked by request_changes from carol"


def test_each_of_gitea_s_merge_refusals_means_one_thing() -> None:
    def invalid(message: str) -> GiteaInvalid:
        return GiteaInvalid(message, status=405, method="POST", path="/merge")

    def conflict(message: str) -> GiteaConflict:
        return GiteaConflict(message, status=409, method="POST", path="/merge")

    assert classify(invalid("Please try again later"), "merge") == "checking"
    assert classify(invalid("User not allowed to merge PR"), "merge") == "not_allowed"
    assert classify(invalid("Does not have enough approvals"), "merge") == "protection"
    assert classify(invalid("Not all required status checks successful"), "merge") == "protection"
    assert classify(conflict("head out of date"), "merge") == "head_moved"
    assert classify(conflict("merge push out of date"), "merge") == "checking"
    assert classify(conflict("PushRejected with remote message: no"), "merge") == "push_rejected"
    assert classify(conflict(""), "rebase") == "conflict"
    empty = GiteaUnavailable("", status=500, method="POST", path="/merge")
    assert classify(empty, "fast-forward-only") == "diverged" and classify(empty, "merge") == "other"


def test_outside_text_becomes_what_a_canonical_state_field_takes() -> None:
    """A CI's status description, a file name or Gitea's message in a hand-back's state: a line with a break,
    trailing spaces or control characters would make the state invalid (and the queue's run fail)."""
    assert as_line("  2 tests failed  \nSTATE: done\t\x1b[31m ") == "2 tests failed STATE: done [31m"
    assert as_line("   ") == "none" and len(as_line("x" * 500, limit=50)) == 50
    assert as_prompt("\n\nfirst  \r\nsecond\x00\n\n") == "first\nsecond"
    state = CanonicalState(state="in-progress", who_is_next="author", next_action="fix it",
                           next_prompt=as_prompt("a  \n\x07b  "), what_happened=as_line("x\ny"), why="w",
                           related_prs=(), blockers=as_line(""), validation="v", last_updated_by="foreman")
    assert (state.next_prompt, state.what_happened, state.blockers) == ("a\n b", "x y", "none")
