"""Catch-up planning, pure: what Gitea says changed and the service never saw, as synthetic deliveries."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

#: The body field and header every synthetic delivery carries (``foreman deliveries`` shows them as such).
MARKER_FIELD = "foreman_reconcile"
MARKER_HEADER = "X-Foreman-Reconcile"
DELIVERY_PREFIX = "reconcile:"
READY_LABEL = "status:ready"

Kind = Literal["issue", "comment", "pull"]


def instant(text: str) -> str:
    """An RFC 3339 time from Gitea as the stored fixed-width UTC text (same form as state.db.to_db_time)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_instant(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def since_for(watermark: str, overlap_s: float) -> str:
    """The ``since`` to ask Gitea for: the watermark minus the overlap, in whole seconds (Gitea's resolution),
    as RFC 3339 UTC."""
    moment = parse_instant(watermark) - timedelta(seconds=overlap_s)
    return moment.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_synthetic(delivery_id: str) -> bool:
    return delivery_id.startswith(DELIVERY_PREFIX)


@dataclass(frozen=True, slots=True)
class DownWindow:
    """When the service was last known alive, and how long ago that is (None: never ran on this database)."""

    since: datetime | None
    seconds: float | None

    def describe(self) -> str:
        if self.since is None:
            return "no earlier run recorded on this database: catch-up starts from now"
        return (
            f"the service was down from {self.since.strftime('%Y-%m-%dT%H:%M:%SZ')} to now"
            f" ({self.seconds:.0f} s without webhooks); catching up from Gitea"
        )


def down_window(last_alive: datetime | None, now: datetime) -> DownWindow:
    if last_alive is None:
        return DownWindow(None, None)
    return DownWindow(last_alive, max(0.0, (now - last_alive).total_seconds()))


@dataclass(frozen=True, slots=True)
class KnownIssue:
    """What the service's issue store holds for an issue: its labels (None: never observed) and status."""

    labels: frozenset[str] | None
    is_open: bool | None


@dataclass(frozen=True, slots=True)
class Known:
    """What the service already saw: issues by number, comment revisions by id (newest ``updated_at`` in stored
    form), the comment ids whose command a delivery has claimed and the pull requests whose close was torn down."""

    issues: Mapping[int, KnownIssue] = field(default_factory=dict)
    comments: Mapping[int, str] = field(default_factory=dict)
    claimed: frozenset[int] = frozenset()
    torn_down: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Synthetic:
    """One delivery to insert into the inbox: Gitea's current view, shaped as the webhook it never sent."""

    delivery_id: str
    kind: Kind
    event: str
    action: str
    sender_login: str
    payload: dict[str, Any]
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    issues: tuple[Synthetic, ...]
    comments: tuple[Synthetic, ...]
    #: Comments whose issue was in neither listing: the edge reads them and plans again.
    missing_issues: tuple[int, ...]
    skipped: Mapping[str, int]


_NUMBER = re.compile(r"/(?:issues|pulls)/([0-9]{1,19})/?$")


def comment_issue_number(comment: Mapping[str, Any]) -> int | None:
    """The issue (or pull request) number a repository-wide comment belongs to (models/issues/comment.go
    ``IssueURL`` / ``PRURL``: the HTML URL of the issue)."""
    for key in ("issue_url", "pull_request_url"):
        found = _NUMBER.search(str(comment.get(key) or ""))
        if found:
            return int(found.group(1))
    return None


def _labels(issue: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(label.get("name")) for label in issue.get("labels") or () if isinstance(label, Mapping))


def _issue_action(issue: Mapping[str, Any], known: KnownIssue | None) -> tuple[str, str] | None:
    """The ``issues`` action that brings the store to Gitea's view, with the reason; None when it holds it."""
    is_open = issue.get("state", "open") != "closed"
    labels = _labels(issue)
    if known is None or known.labels is None:
        if is_open and not labels:
            return None  # nothing to learn: open with no labels is what an unknown issue is taken for
        return ("label_updated" if is_open else "closed"), "never observed"
    if known.is_open is not None and known.is_open != is_open:
        return ("reopened" if is_open else "closed"), "status changed"
    if known.labels != labels:
        return ("label_updated" if labels else "label_cleared"), "labels changed"
    return None


def plan(
    *,
    repository: Mapping[str, Any],
    issues: Sequence[Mapping[str, Any]],
    comments: Sequence[Mapping[str, Any]],
    known: Known,
    bot_login: str,
    pass_id: int,
    extra_issues: Mapping[int, Mapping[str, Any]] | None = None,
) -> Plan:
    """The synthetic deliveries for what Gitea shows and the service never saw.

    - An issue (not a pull request) whose labels or status differ from the stored snapshot becomes one ``issues``
      event with Gitea's current issue object (the handlers diff it against what they hold; an older webhook
      that arrives later is kept in history only, as any out-of-order observation).
    - A closed pull request whose close was never torn down (``known.torn_down``) becomes one
      ``pull_request``/``closed`` event, once per closing (``reconcile:pull:<n>:<closed_at>``).
    - A comment never recorded becomes ``issue_comment``/``created``; one recorded at an older ``updated_at``
      becomes ``edited``. Comments the bot wrote are skipped (they never act), and so is a comment on a pull
      request unless it is a command nobody claimed (its reply says commands act on issues).

    Delivery ids are deterministic (``reconcile:issue:<n>:<updated_at>:<view hash>``,
    ``reconcile:comment:<id>:<updated_at>``): a second pass over the same revision inserts nothing (the inbox
    refuses the id).

    Gitea's listings read by the edge (bot/reconcile.py), as Gitea 1.22-1.26 answer them:

    - ``GET /repos/{o}/{r}/issues?state=all&since=T``: issues and pull requests with ``updated_unix >= T``
      (routers/api/v1/repo/issue.go ``ListIssues`` → models/issues/issue_search.go ``Gte{"issue.updated_unix"}``),
      newest created first; a comment bumps its issue's ``updated_unix`` (models/issues/comment.go ``CreateComment``).
    - ``GET /repos/{o}/{r}/issues/comments?since=T``: plain comments with ``updated_unix >= T``
      (routers/api/v1/repo/issue_comment.go ``ListRepoIssueComments`` → models/issues/comment.go
      ``FindComments``), oldest created first; a comment names its issue only by ``issue_url`` (issues) or
      ``pull_request_url`` (pull requests), HTML URLs ending in the number.

    ``since`` has whole-second resolution (services/context/utils.go ``parseFormTime``: RFC 3339 → unix seconds).
    """
    skipped: dict[str, int] = {}
    by_number: dict[int, Mapping[str, Any]] = {int(i["number"]): i for i in issues}
    for number, item in (extra_issues or {}).items():
        by_number.setdefault(number, item)
    marker = {"pass": pass_id}
    listed = sorted({int(i["number"]) for i in issues})
    planned_issues = _plan_issues(listed, by_number, repository, known, marker, skipped)
    planned_comments, missing = _plan_comments(comments, by_number, repository, known, bot_login, marker, skipped)
    return Plan(tuple(planned_issues), tuple(planned_comments), tuple(sorted(missing)), skipped)


def _skip(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


def _plan_issues(
    listed: Sequence[int],
    by_number: Mapping[int, Mapping[str, Any]],
    repository: Mapping[str, Any],
    known: Known,
    marker: Mapping[str, Any],
    skipped: dict[str, int],
) -> list[Synthetic]:
    """The ``issues`` (and pull request ``closed``) deliveries of the listed issues, in number order."""
    planned: list[Synthetic] = []
    for number in listed:
        issue = by_number[number]
        if issue.get("pull_request") is not None:
            closed = _pull_closed(issue, repository, known, marker)
            if closed is None:
                _skip(skipped, "pull_request")
            else:
                planned.append(closed)
            continue
        decided = _issue_action(issue, known.issues.get(number))
        if decided is None:
            _skip(skipped, "issue_seen")
            continue
        planned.append(_issue_event(number, issue, decided, repository, marker))
    return planned


def _issue_event(
    number: int, issue: Mapping[str, Any], decided: tuple[str, str], repository: Mapping[str, Any],
    marker: Mapping[str, Any],
) -> Synthetic:
    action, reason = decided
    stamp = instant(str(issue.get("updated_at") or issue.get("created_at")))
    # The view's content is in the id too: two views of the same second (Gitea's resolution) differ by it.
    view = hashlib.sha256(
        json.dumps([issue.get("state"), sorted(_labels(issue))], separators=(",", ":")).encode()
    ).hexdigest()[:12]
    return Synthetic(
        delivery_id=f"{DELIVERY_PREFIX}issue:{number}:{stamp}:{view}",
        kind="issue",
        event="issues",
        action=action,
        sender_login="",
        payload={
            "action": action,
            "number": number,
            "issue": dict(issue),
            "repository": dict(repository),
            "sender": {"id": 0, "login": ""},
            MARKER_FIELD: {**marker, "kind": "issue", "reason": reason},
        },
        reason=reason,
    )


def _plan_comments(
    comments: Sequence[Mapping[str, Any]],
    by_number: Mapping[int, Mapping[str, Any]],
    repository: Mapping[str, Any],
    known: Known,
    bot_login: str,
    marker: Mapping[str, Any],
    skipped: dict[str, int],
) -> tuple[list[Synthetic], set[int]]:
    """The ``issue_comment`` deliveries of the listed comments, in their order, and the issues they name that
    neither listing held."""
    bot = bot_login.lower()
    planned: list[Synthetic] = []
    missing: set[int] = set()
    for comment in comments:
        author = str((comment.get("user") or {}).get("login") or "")
        if author.lower() == bot and bot:
            _skip(skipped, "bot_comment")
            continue
        comment_id = int(comment["id"])
        stamp = instant(str(comment.get("updated_at") or comment.get("created_at")))
        seen = known.comments.get(comment_id)
        if seen is not None and seen >= stamp:
            _skip(skipped, "comment_seen")
            continue
        target = comment_issue_number(comment)
        if target is None:
            _skip(skipped, "comment_without_issue")
            continue
        on_issue = by_number.get(target)
        if on_issue is None:
            missing.add(target)
            continue
        on_pull = on_issue.get("pull_request") is not None or bool(comment.get("pull_request_url"))
        if on_pull:
            first = str(comment.get("body") or "").lstrip().split(maxsplit=1)
            is_command = bool(first) and first[0].startswith("/")
            if not is_command or comment_id in known.claimed:
                _skip(skipped, "pull_request_comment")
                continue
        planned.append(_comment_event(comment, comment_id, stamp, author, seen, on_issue, on_pull, repository, marker))
    return planned, missing


def _comment_event(
    comment: Mapping[str, Any], comment_id: int, stamp: str, author: str, seen: str | None,
    on_issue: Mapping[str, Any], on_pull: bool, repository: Mapping[str, Any], marker: Mapping[str, Any],
) -> Synthetic:
    action = "created" if seen is None else "edited"
    return Synthetic(
        delivery_id=f"{DELIVERY_PREFIX}comment:{comment_id}:{stamp}",
        kind="comment",
        event="issue_comment",
        action=action,
        sender_login=author,
        payload={
            "action": action,
            "issue": dict(on_issue),
            "comment": dict(comment),
            "repository": dict(repository),
            "sender": dict(comment.get("user") or {"login": author}),
            "is_pull": on_pull,
            MARKER_FIELD: {**marker, "kind": "comment", "reason": "never observed" if seen is None
                           else "edited since observed"},
        },
        reason="never observed" if seen is None else "edited",
    )


def _pull_closed(
    issue: Mapping[str, Any], repository: Mapping[str, Any], known: Known, marker: Mapping[str, Any]
) -> Synthetic | None:
    """A closed pull request whose teardown never ran becomes ``pull_request``/``closed`` (the handler reads the
    PR back from Gitea; the issue listing's ``pull_request`` only says whether it merged)."""
    number = int(issue["number"])
    if issue.get("state") != "closed" or number in known.torn_down:
        return None
    meta = issue.get("pull_request") or {}
    merged = bool(meta.get("merged")) if isinstance(meta, Mapping) else False
    stamp = instant(str(issue.get("closed_at") or issue.get("updated_at") or issue.get("created_at")))
    return Synthetic(
        delivery_id=f"{DELIVERY_PREFIX}pull:{number}:{stamp}",
        kind="pull",
        event="pull_request",
        action="closed",
        sender_login="",
        payload={
            "action": "closed",
            "number": number,
            "pull_request": {"number": number, "state": "closed", "merged": merged,
                             "title": issue.get("title"), "body": issue.get("body")},
            "repository": dict(repository),
            "sender": {"id": 0, "login": ""},
            MARKER_FIELD: {**marker, "kind": "pull", "reason": "closed, never torn down"},
        },
        reason="closed, never torn down",
    )


def next_watermark(previous: str | None, server_now: str, newest_seen: str | None) -> str:
    """The watermark after a successful pass: Gitea's clock when the pass began reading (its ``Date``), never
    behind what was seen nor behind the previous watermark."""
    candidates = [server_now, *(t for t in (previous, newest_seen) if t is not None)]
    return max(candidates)
