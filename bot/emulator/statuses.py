"""Commit statuses of emulated repositories (models/git/commit_status.go) and how Gitea combines them."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from bot.emulator.model import EmuRepo, EmuUser
from bot.emulator.protection import glob_regex

if TYPE_CHECKING:
    from bot.emulator.state import EmulatorState

#: The states ``CommitStatusOptions.ToConds`` filters on (``?state=``); others list everything.
FILTER_STATES: Final = ("pending", "success", "error", "failure", "warning")
#: 1.22 modules/structs/commit_status.go ``commitStatusPriorities``: lower is worse; unknown states never count.
_PRIORITY_1_22: Final = {"error": 0, "failure": 1, "warning": 2, "pending": 3, "success": 4}


@dataclass(eq=False)
class EmuCommitStatus:
    """A ``commit_status`` row: ``id`` the global row id (the webhook's), ``index`` the per-commit number the API
    shows as ``id`` (``GetNextCommitStatusIndex``)."""

    id: int
    index: int
    repo: EmuRepo
    sha: str
    state: str
    target_url: str
    description: str
    context: str
    creator: EmuUser
    created: int
    updated: int


_STATUSES: weakref.WeakKeyDictionary[EmuRepo, list[EmuCommitStatus]] = weakref.WeakKeyDictionary()


def repo_statuses(repo: EmuRepo) -> list[EmuCommitStatus]:
    """Every status of the repository, in insertion order."""
    return _STATUSES.setdefault(repo, [])


def statuses_of(repo: EmuRepo, sha: str) -> list[EmuCommitStatus]:
    """The statuses of one commit, oldest first."""
    return [s for s in repo_statuses(repo) if s.sha == sha]


def latest_per_context(repo: EmuRepo, sha: str) -> list[EmuCommitStatus]:
    """``GetLatestCommitStatus``: per context the status with the highest index, in index order (the rows come
    back from ``Find`` by primary key)."""
    latest: dict[str, EmuCommitStatus] = {}
    for status in statuses_of(repo, sha):
        latest[status.context] = status
    return sorted(latest.values(), key=lambda s: s.index)


def combine(emu: EmulatorState, states: list[str]) -> str:
    """``CalcCommitStatus(...).State``. 1.26 (modules/commitstatus ``CommitStatusStates.Combine``): any error,
    failure or warning is ``failure``; all success/skipped is ``success``; otherwise ``pending``. 1.22: the worst
    known state by ``commitStatusPriorities`` (success when all are success); with none known, the first one's;
    ``""`` for no statuses (an empty ``CommitStatus``)."""
    if emu.at_least("1.23"):
        if any(s in ("error", "failure", "warning") for s in states):
            return "failure"
        ok = sum(1 for s in states if s in ("success", "skipped"))
        return "success" if states and ok == len(states) else "pending"
    chosen: str | None = None
    best = "success"
    for state in states:
        if state in _PRIORITY_1_22 and _PRIORITY_1_22[state] <= _PRIORITY_1_22[best]:
            best = chosen = state
    if chosen is None:
        return states[0] if states else ""
    return chosen


def required_contexts_state(emu: EmulatorState, statuses: list[EmuCommitStatus], required: list[str]) -> str:
    """services/pull/commit_status.go ``MergeRequiredContextsCommitStatus`` for the latest statuses of the head.

    1.26: no statuses is pending; no required contexts combines all; else every pattern must match some context
    (matches combined; a missing one makes it pending unless the rest fail). 1.22: each pattern takes the first
    matching status; the first pattern without a match makes it pending and stops; with no match at all and
    nothing worse, all statuses combined."""
    if emu.at_least("1.23"):
        if not statuses:
            return "pending"
        if not required:
            return combine(emu, [s.state for s in statuses])
        matched: list[EmuCommitStatus] = []
        all_matched = True
        for pattern in dict.fromkeys(required):
            regex = glob_regex(pattern, separator=None)
            hits = [s for s in statuses if regex.fullmatch(s.context)]
            matched += hits
            all_matched = all_matched and bool(hits)
        if not matched:
            return "pending"
        state = combine(emu, [s.state for s in matched])
        if all_matched or state == "failure":
            return state
        return "pending"
    matched_count = 0
    returned = "success"
    for pattern in dict.fromkeys(required):
        regex = glob_regex(pattern, separator=None)
        target = next((s.state for s in statuses if regex.fullmatch(s.context)), "")
        if target:
            matched_count += 1
        else:
            if no_better_than("pending", returned):
                returned = "pending"
            break
        if no_better_than(target, returned):
            returned = target
    if matched_count == 0 and returned == "success":
        return combine(emu, [s.state for s in statuses])
    return returned


def no_better_than(a: str, b: str) -> bool:
    """1.22 ``CommitStatusState.NoBetterThan``: false when either state is unknown."""
    if a not in _PRIORITY_1_22 or b not in _PRIORITY_1_22:
        return False
    return _PRIORITY_1_22[a] <= _PRIORITY_1_22[b]


def status_json(emu: EmulatorState, status: EmuCommitStatus) -> dict[str, Any]:
    """services/convert/status.go ``ToCommitStatus``: ``id`` is the per-commit index; ``status`` the state;
    ``updated_at`` is the creation time as well; ``creator`` as an anonymous viewer sees it."""
    from bot.emulator.convert import unix_time, user_json

    return {
        "id": status.index,
        "status": status.state,
        "target_url": status.target_url,
        "description": status.description,
        "url": f"{emu.app_url}api/v1/repos/{status.repo.full_name}/statuses/{status.sha}",
        "context": status.context,
        "creator": user_json(emu, status.creator, None),
        "created_at": unix_time(status.created, emu.tz),
        "updated_at": unix_time(status.created, emu.tz),
    }
