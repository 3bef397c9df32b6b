"""The merge gate's rules on plain values (issue 29, item 3): which recorded verdict counts, which Gitea verdicts are
named as not counted, and what blocks."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.gitea.values import PullRequest, Review, User
from bot.verbs.merge_gate import merge_gate
from bot.verbs.review import RecordedVerdict
from tests.gitea_fixtures import BOT

HEAD = "a" * 40


def _user(login: str) -> User:
    return User(id=len(login), login=login, full_name="", email="", is_admin=False, raw={})


def _review(review_id: int, login: str, state: str = "APPROVED", *, commit: str = HEAD, official: bool = True,
            dismissed: bool = False) -> Review:
    return Review(id=review_id, user=_user(login), state=state, body="", commit_id=commit, stale=False,
                  official=official, dismissed=dismissed, submitted_at=None, raw={})


def _pull(poster: str = "author-1") -> PullRequest:
    return PullRequest(id=1, number=7, title="t", body="", state="open", user=_user(poster), labels=(), head_ref="b",
                       head_sha=HEAD, base_ref="main", base_sha="b" * 40, merge_base="b" * 40, mergeable=True, merged=False,
                       merged_at=datetime(2026, 1, 1, tzinfo=UTC), merge_commit_sha=None, merged_by=None,
                       html_url="", raw={})


def _recorded(review_id: int, reviewer: str = "author-2", *, verdict: str = "approve", commit: str = HEAD,
              posted_as: str = BOT) -> RecordedVerdict:
    return RecordedVerdict(f"lease-{review_id:x}", reviewer, verdict, review_id, commit, 7,  # type: ignore[arg-type]
                           posted_as)


def _gate(recorded: list[RecordedVerdict], reviews: list[Review], *, poster: str = "author-1",
          reviewers: frozenset[str] = frozenset({"author-2", "author-4"})) -> tuple[str | None, list[tuple[int, str]]]:
    gate = merge_gate(recorded, reviews, _pull(poster), implementer="author-1", reviewers=reviewers)
    assert (gate.counted is None) == (gate.block is not None)
    return gate.block, [(n.review_id, n.why) for n in gate.not_counted]


def test_only_the_latest_recorded_verdict_as_gitea_still_shows_it_counts() -> None:
    assert _gate([_recorded(1)], [_review(1, BOT)]) == (None, [])
    # Recorded but changed on Gitea: another commit, another account, another verdict, gone, not official.
    assert _gate([_recorded(1)], [_review(1, BOT, commit="c" * 40)]) == ("approval_withdrawn",
                                                                         [(1, "changed_on_gitea")])
    assert _gate([_recorded(1)], [_review(1, "alice")]) == ("approval_withdrawn", [(1, "changed_on_gitea")])
    assert _gate([_recorded(1)], [_review(1, BOT, "COMMENT")])[0] == "approval_withdrawn"
    assert _gate([_recorded(1)], []) == ("approval_withdrawn", [])
    assert _gate([_recorded(1)], [_review(1, BOT, official=False)]) == ("approval_withdrawn", [(1, "not_official")])
    # A later recorded request-changes (not on the head any more) leaves no approval; the earlier one is superseded.
    reviews = [_review(1, BOT), _review(2, BOT, "REQUEST_CHANGES", commit="c" * 40)]
    assert _gate([_recorded(1), _recorded(2, verdict="request_changes", commit="c" * 40)], reviews) == (
        "approval_not_recorded", [(1, "superseded"), (2, "superseded")])


def test_a_recorded_reviewer_who_may_not_approve_now_does_not_count() -> None:
    """Off the roster's reviewers, the implementer, or the PR's poster: the recorded approval is named, not counted."""
    assert _gate([_recorded(1, "author-9")], [_review(1, BOT)]) == ("reviewer_not_allowed",
                                                                   [(1, "reviewer_not_allowed")])
    assert _gate([_recorded(1, "author-1")], [_review(1, BOT)],
                 reviewers=frozenset({"author-1"}))[0] == "reviewer_not_allowed"
    assert _gate([_recorded(1, "author-4")], [_review(1, BOT)], poster="author-4")[0] == "reviewer_not_allowed"


def test_other_verdicts_are_named_and_only_a_standing_request_changes_on_the_head_blocks() -> None:
    reviews = [_review(1, BOT), _review(2, "alice"), _review(3, "author-1"), _review(4, "bob", dismissed=True),
               _review(5, "carol", "REQUEST_CHANGES", commit="c" * 40), _review(6, "dave", "REQUEST_CHANGES",
                                                                               official=False)]
    assert _gate([_recorded(1)], reviews, poster="author-5") == (None, [
        (2, "not_recorded"), (3, "by_implementer"), (4, "dismissed"), (5, "not_recorded"), (6, "not_recorded")])
    by_poster = [_review(1, BOT), _review(3, "author-5")]
    assert _gate([_recorded(1)], by_poster, poster="author-5") == (None, [(3, "by_pr_poster")])
    block, _ = _gate([_recorded(1)], [*reviews, _review(7, "erin", "REQUEST_CHANGES")])
    assert block == "changes_requested"
    assert _gate([_recorded(1)], [*reviews, _review(7, "erin", "REQUEST_CHANGES", dismissed=True)])[0] is None
