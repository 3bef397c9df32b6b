"""The allocator's candidates from Gitea: the open `status:ready` issues, each with the issues its body names on
"Depends:" lines and whether those are still open."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from bot.core.vocabulary import label_for_state
from bot.gitea import GiteaNotFound, Issue, IssueState, IssueType
from bot.tasks import bounded_in_order
from bot.verbs.duplicates import READS_AT_ONCE

# An issue body line such as "Depends: #12, #14" (the seed documents use "Parent / Depends / Blocks").
_DEPENDS_RE = re.compile(r"^\s*(?:[-*]\s*)?\**depends(?: on)?\**\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_ISSUE_REF_RE = re.compile(r"(?<![\w/])#(\d{1,18})\b")


def depends_on(body: str) -> list[int]:
    """Issue numbers named on "Depends:" lines of an issue body."""
    found: list[int] = []
    for line in _DEPENDS_RE.findall(body or ""):
        found.extend(int(n) for n in _ISSUE_REF_RE.findall(line) if int(n) > 0)
    return sorted(set(found))


class CandidatesGitea(Protocol):
    """The Gitea reads the allocator makes itself: the ready issues, and the state of each dependency."""

    async def list_issues(
        self, *, state: IssueState = ..., labels: Sequence[str] = ..., type_: IssueType | None = ..., limit: int = ...
    ) -> list[Issue]: ...

    async def get_issue(self, number: int) -> Issue: ...


async def ready_candidates(gitea: CandidatesGitea) -> tuple[list[dict[str, Any]], frozenset[int]]:
    """Open `status:ready` issues (not PRs) from Gitea, with their dependencies' open state."""
    ready = label_for_state("ready")
    issues = await gitea.list_issues(state="open", labels=[ready], type_="issues")
    records: list[dict[str, Any]] = []
    deps: set[int] = set()
    for issue in issues:
        if issue.is_pull or ready not in issue.label_names:
            continue  # Gitea drops unknown label filters silently: check the label ourselves
        record: dict[str, Any] = {
            "issue_number": issue.number,
            "title": issue.title,
            "labels": sorted(issue.label_names),
            "depends_on": depends_on(issue.body or ""),
        }
        if issue.created_at is not None:
            record["created_at"] = issue.created_at.isoformat()
        deps.update(record["depends_on"])
        records.append(record)
    known = {r["issue_number"] for r in records}

    async def still_open(number: int) -> bool:
        try:
            return (await gitea.get_issue(number)).state == "open"
        except GiteaNotFound:
            return False  # a missing issue holds nothing

    unknown = sorted(deps - known)
    found = await bounded_in_order(still_open, unknown, at_once=READS_AT_ONCE)
    return records, frozenset(known | {number for number, is_open in zip(unknown, found, strict=True) if is_open})
