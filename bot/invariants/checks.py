"""Checking the facts against every invariant: pure, one function per concern, in a stable order."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from bot.invariants.facts import INVARIANTS, Facts, LeaseFact, RegistrationFact, Violation, WaitingPullFact

# --- check ------------------------------------------------------------------------------------------------------------


def check(facts: Facts) -> list[Violation]:
    """Every violation of every invariant in ``INVARIANTS``, in a stable order."""
    found: list[Violation] = []
    for part in (_deliveries, _outbox, _leases, _in_progress, _journal, _worktrees, _lifecycle, _queues):
        found.extend(part(facts))
    return found


def _split(key: str) -> tuple[str, str]:
    """``<subject>:<suffix>`` (the suffix after the last colon)."""
    prefix, _, suffix = key.rpartition(":")
    return prefix, suffix


def _bot_markers(facts: Facts) -> Counter[str]:
    bot = facts.bot_login.lower()
    return Counter(c.marker for c in facts.gitea.comments if c.marker and c.author.lower() == bot)


def _deliveries(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    for d in facts.db.deliveries:
        if d.status in ("queued", "processing"):
            out.append(Violation("deliveries.settled", d.delivery_id, f"still {d.status}"))
        elif d.status == "failed":
            out.append(Violation("deliveries.not_failed", d.delivery_id, "parked as failed"))
    if facts.acknowledged is not None:
        ids = {d.delivery_id for d in facts.db.deliveries}
        bodies = {d.body_sha256 for d in facts.db.deliveries}
        for delivery_id, body in facts.acknowledged:
            if delivery_id not in ids and body not in bodies:
                out.append(Violation("deliveries.none_lost", delivery_id, "acknowledged to Gitea but not stored"))
    return out


def _outbox(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    markers = _bot_markers(facts)
    by_marker: dict[str, list[int]] = {}
    bot = facts.bot_login.lower()
    for c in facts.gitea.comments:
        if c.marker and c.author.lower() == bot:
            by_marker.setdefault(c.marker, []).append(c.comment_id)
    keys = {e.key for e in facts.db.outbox}
    for e in facts.db.outbox:
        if e.status in ("pending", "sending"):
            out.append(Violation("outbox.settled", e.key, f"still {e.status}"))
        elif e.status in ("parked", "verification_failed"):
            out.append(Violation("outbox.not_stuck", e.key, f"ended {e.status}"))
        if e.kind == "comment" and e.status == "done":
            count = markers.get(e.key, 0)
            if count != 1:
                out.append(Violation("outbox.comment_once", e.key, f"its marker is on {count} bot comments in Gitea"))
            elif e.comment_id is not None and by_marker[e.key] != [e.comment_id]:
                out.append(Violation("outbox.comment_once", e.key, f"recorded comment {e.comment_id}, Gitea has"
                                     f" the marker on {by_marker[e.key]}"))
    out.extend(_filed_by_repository(facts))
    for marker, count in sorted(markers.items()):
        if marker not in keys:
            out.append(Violation("outbox.no_stray_comment", marker, f"on {count} bot comment(s) with no outbox entry"))
    return out


def _filed_by_repository(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    run_repos = dict(facts.db.run_repos)
    for e in facts.db.outbox:
        if e.repo == "":
            out.append(Violation("outbox.filed_by_repository", e.key, "filed under no repository (repo '')"))
        prefix, suffix = _split(e.key)
        run_id = prefix.removeprefix("run:")
        if e.repo is not None and suffix == "summary" and prefix.startswith("run:") and run_id in run_repos \
                and run_repos[run_id] != e.repo:
            out.append(Violation("outbox.run_evidence_repository", e.key,
                                 f"filed under {e.repo!r}, its run's grant is of {run_repos[run_id]!r}"))
    return out


def _once(markers: Counter[str], key: str) -> str | None:
    count = markers.get(key, 0)
    return None if count == 1 else f"{key} is on {count} bot comments in Gitea"


#: How the end reason of a lease foreman released for a failed or impossible bootstrap begins (bot.verbs.bootstrap,
#: bot.verbs.allocate): such a release also takes the owner off the issue's assignees.
_FAILED_ENDS = ("bootstrap failed", "unworkable")
#: The end reasons of an authoring lease the opening of its issue's pull request, or the PR's update from its base,
#: ended (bot/verbs/pulls.py, bot/verbs/update.py): either hands the issue to review with a ``pr:...:evidence``.
HANDOVER_REASONS = ("pull_request_opened", "pull_request_updated")


def _leases(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    markers = _bot_markers(facts)
    entries = {e.key: e for e in db.outbox}
    lease_ids = {lease.lease_id for lease in db.leases}
    live = Counter(lease.issue_number for lease in db.leases if lease.status == "live")
    # The leases come oldest first: a failed lease followed by a later lease of the same owner on the same issue
    # (live, or ended as any lease may) leaves the assignment to that later lease.
    latest_of_owner = {(lease.issue_number, lease.owner.lower()): lease.lease_id for lease in db.leases}
    for number, count in sorted(live.items()):
        if count > 1:
            out.append(Violation("leases.one_live_per_issue", f"#{number}", f"{count} live leases"))
    completed = {t.lease_id for t in db.transitions if t.outcome == "completed"}
    # An open transition of the lease itself: `foreman serve` resumes it at start-up (journal.terminal reports it).
    bootstrapping = {t.lease_id for t in db.transitions if t.outcome == "open"}
    failures: dict[str, list[str]] = {}  # lease -> the failure comment keys of its compensated transitions
    for t in db.transitions:
        if t.outcome == "compensated":
            failures.setdefault(t.lease_id, []).append(f"{t.key}:failure")
    for teardown in db.teardowns:
        for lease_id in teardown.ended_leases:
            failures.setdefault(lease_id, []).append(f"{teardown.key}:evidence")
    for lease_id, pr_key in db.handovers:
        failures.setdefault(lease_id, []).append(pr_key)
    for lease in db.leases:
        subject = f"{lease.lease_id} (#{lease.issue_number}, {lease.owner}, {lease.status})"
        key = f"{lease.lease_id}:evidence"
        entry = entries.get(key)
        if entry is None:
            out.append(Violation("leases.evidence", subject, "no evidence comment in the outbox"))
        elif entry.status != "done":
            out.append(Violation("leases.evidence", subject, f"its evidence comment is {entry.status}"))
        elif (problem := _once(markers, key)) is not None:
            out.append(Violation("leases.evidence", subject, problem))
        if lease.status == "released":
            ends = [f"{lease.lease_id}:release", f"{lease.lease_id}:unworkable", f"{lease.lease_id}:review",
                    *failures.get(lease.lease_id, [])]
            if not any(markers.get(k, 0) == 1 and entries.get(k) is not None for k in ends):
                out.append(Violation("leases.end_evidence", subject, f"none of {ends} is in Gitea exactly once"))
        assigned = facts.gitea.assignees.get(lease.issue_number, frozenset())
        if lease.status == "live" and lease.action == "implement":
            if lease.owner.lower() not in assigned:
                out.append(Violation("leases.assigned", subject, f"Gitea's assignees are {sorted(assigned)}"))
            if facts.require_bootstrap and lease.lease_id not in completed | bootstrapping:
                out.append(Violation("leases.bootstrapped", subject, "no completed bootstrap transition, and no open"
                                     " one of this lease for start-up recovery to finish"))
        elif (lease.status == "released" and (lease.end_reason or "").startswith(_FAILED_ENDS)
              and lease.owner.lower() in assigned
              and latest_of_owner[(lease.issue_number, lease.owner.lower())] == lease.lease_id):
            out.append(Violation("leases.unassigned_after_failure", subject, f"released ({lease.end_reason}) but"
                                 f" still assigned in Gitea: {sorted(assigned)}"))
        if (lease.exclude is not None and lease.decided_exclude is not None
                and sorted(lease.exclude) != sorted(lease.decided_exclude)):
            out.append(Violation("leases.exclusions_recorded", subject, f"the lease records {sorted(lease.exclude)},"
                                 f" its decision excluded {sorted(lease.decided_exclude)}"))
    named = {(k, "outbox") for k in entries} | {(k, "Gitea") for k in markers}
    for key, where in sorted(named):
        if key.startswith("lease-"):
            lease_id = key.split(":", 1)[0]
            if lease_id not in lease_ids:
                out.append(Violation("leases.no_evidence_without_lease", key, f"in the {where}; no lease {lease_id}"))
    return out


def _journal(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    markers = _bot_markers(facts)
    by_key = {t.key: t for t in db.transitions}
    registered = {r.transition_key for r in db.registrations}
    for t in db.transitions:
        subject = f"{t.key} (#{t.issue_number}, {t.lease_id})"
        if t.outcome == "open":
            out.append(Violation("journal.terminal", subject, f"left open in phase {t.phase}"))
            continue
        suffix = "evidence" if t.outcome == "completed" else "failure"
        problem = _once(markers, f"{t.key}:{suffix}")
        if problem is not None:
            out.append(Violation("journal.evidence", subject, problem))
        if t.outcome == "completed" and t.key not in registered:
            out.append(Violation("journal.registered", subject, "completed without a worktree registration"))
        if t.outcome == "completed" and t.assignment_read_back is False:
            out.append(Violation("journal.assignment_read_back", subject, "its proof does not show Gitea listing"
                                 f" {t.owner} as assignee, read back"))
    named = {e.key for e in db.outbox} | set(markers)
    for key in sorted(named):
        prefix, suffix = _split(key)
        if suffix not in ("evidence", "failure") or prefix.startswith(_NOT_BOOTSTRAP):
            continue
        found = by_key.get(prefix)
        wanted = "completed" if suffix == "evidence" else "compensated"
        if found is None:
            out.append(Violation("journal.no_evidence_without_transition", key, "no transition with this key"))
        elif found.outcome != wanted:
            out.append(Violation("journal.no_evidence_without_transition", key,
                                 f"the transition is {found.outcome}"))
    return out


def _worktrees(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    live_regs = [r for r in db.registrations if r.live]
    per_issue = Counter(r.issue_number for r in live_regs)
    for number, count in sorted(per_issue.items()):
        if count > 1:
            out.append(Violation("worktrees.one_per_issue", f"#{number}", f"{count} live registrations"))
    checkout = facts.checkout
    worktrees = {w.path: w for w in checkout.worktrees} if checkout is not None else {}
    directories = set(checkout.directories) if checkout is not None else set()
    outcome = {t.key: t.outcome for t in db.transitions}
    regs_by_path: dict[str, list[RegistrationFact]] = {}
    for r in live_regs:
        regs_by_path.setdefault(r.worktree_path, []).append(r)
    # Worktrees kept aside for an earlier owner (another author took the issue over) until the teardown's judgement.
    kept = {r.worktree_path for r in db.registrations if r.kept}
    if checkout is not None:
        root = checkout.branches_root + os.sep
        for directory in sorted(directories):
            if directory not in worktrees:
                out.append(Violation("worktrees.no_orphan_dir", directory, "not a worktree registered in git"))
        for path, w in sorted(worktrees.items()):
            if not path.startswith(root):
                out.append(Violation("worktrees.inside_branches", path, "a git worktree outside branches/"))
                continue
            regs = regs_by_path.get(path, [])
            if not regs and path in kept:
                if w.branch is not None:
                    out.append(Violation("worktrees.journaled", path, f"a kept worktree holds {w.branch}: it must"
                                         " be detached"))
                continue
            if not regs:
                out.append(Violation("worktrees.journaled", path, "registered in git, no live registration row"))
            for r in regs:
                if outcome.get(r.transition_key) != "completed":
                    out.append(Violation("worktrees.journaled", path, f"its transition {r.transition_key} is"
                                         f" {outcome.get(r.transition_key, 'missing')}"))
                if w.branch != r.branch:
                    out.append(Violation("worktrees.journaled", path, f"git has it on {w.branch}, the registration"
                                         f" says {r.branch}"))
        completed_branches = {t.branch for t in db.transitions if t.outcome == "completed"}
        for branch in sorted(checkout.issue_branches):
            if branch not in completed_branches:
                out.append(Violation("branches.journaled", branch, "no completed transition has this branch"))
    for r in live_regs:
        subject = f"{r.worktree_path} ({r.transition_key})"
        entry = worktrees.get(r.worktree_path)
        if entry is None:
            out.append(Violation("worktrees.on_disk", subject, "git has no worktree there"))
        elif entry.prunable or r.worktree_path not in directories:
            out.append(Violation("worktrees.on_disk", subject, "git's worktree there has no directory"))
    return out


#: Evidence keys of other verbs than the bootstrap (their own invariants check them).
_NOT_BOOTSTRAP = ("lease-", "command:", "label-sync:", "teardown:", "publish:", "pr:")


def _lifecycle(facts: Facts) -> list[Violation]:
    """After the merge: the issue's leases ended, the journal's worktrees gone (or reported kept)."""
    out: list[Violation] = []
    merged = facts.gitea.merged
    for lease in facts.db.leases:
        if lease.status == "live" and lease.issue_number in merged:
            out.append(Violation("lifecycle.merged_no_live_lease", f"{lease.lease_id} (#{lease.issue_number})",
                                 f"live lease of {lease.owner} on a merged issue"))
    kept = {real_path(path) for t in facts.db.teardowns for path in t.kept}
    created = {t.key for t in facts.db.transitions if t.outcome == "completed"}
    checkout = facts.checkout
    on_disk = set(checkout.directories) | {w.path for w in checkout.worktrees} if checkout is not None else set()
    seen: set[str] = set()
    for r in facts.db.registrations:
        if r.issue_number not in merged or r.transition_key not in created or r.worktree_path in seen:
            continue
        seen.add(r.worktree_path)
        if r.worktree_path in on_disk and r.worktree_path not in kept:
            out.append(Violation("lifecycle.merged_no_worktree", f"{r.worktree_path} (#{r.issue_number})",
                                 "the bootstrap's worktree is still on disk and no teardown reported it kept"))
    return out


def _in_progress(facts: Facts) -> list[Violation]:
    """An issue in `status:in-progress` is someone's work: a live lease holds it, or its last one ended within the
    grace period (stranded work goes back to `status:ready`: bot/verbs/stranded.py)."""
    now = facts.now
    if now is None:
        return []
    grace = timedelta(seconds=facts.lease_grace_s)
    by_issue: dict[int, list[LeaseFact]] = {}
    for lease in facts.db.leases:
        by_issue.setdefault(lease.issue_number, []).append(lease)
    out: list[Violation] = []
    for number in sorted(facts.gitea.in_progress):
        leases = by_issue.get(number, [])
        if any(lease.live_at(now) for lease in leases):
            continue
        if not leases:
            out.append(Violation("leases.in_progress_without_lease", f"#{number}",
                                 "status:in-progress, and foreman never leased it"))
            continue
        ended = [(end, lease) for lease in leases if (end := lease.end()) is not None]
        if not ended:
            continue  # no time recorded (hand-built facts): not judged
        end, last = max(ended, key=lambda pair: pair[0])
        if now - end > grace:
            how = f"{last.status} ({last.end_reason})" if last.end_reason else last.status
            out.append(Violation("leases.in_progress_without_lease", f"#{number}",
                                 f"status:in-progress with no live lease: its last lease {last.lease_id} of "
                                 f"{last.owner} is {how} since {end.isoformat()}, {_seconds(now - end)} ago (grace "
                                 f"{facts.lease_grace_s:g} s)"))
    return out


def _queues(facts: Facts) -> list[Violation]:
    """A queue that runs by itself hands out what waits while someone may take it: a pull request left waiting
    beyond the bound with an idle reviewer (merger) who may take it means the queue stalled."""
    queues, now = facts.queues, facts.now
    if queues is None or now is None:
        return []
    out: list[Violation] = []
    if "review" in queues.running:
        for pull in queues.reviews:
            out.extend(_waiting(pull, now, queues.wait_bound_s, "queues.review_waits", "review", "reviewer",
                                queues.idle_reviewers))
    if "merge" in queues.running:
        for pull in queues.merges:
            if not pull.mergeable:
                continue  # Gitea cannot merge it (a conflict): its author's turn, not the queue's
            if queues.merge_by == "foreman":
                out.extend(_waiting(pull, now, queues.wait_bound_s, "queues.merge_waits", "merge", "merger",
                                    None))
            else:
                out.extend(_waiting(pull, now, queues.wait_bound_s, "queues.merge_waits", "merge", "merger",
                                    queues.idle_mergers))
    return out


def _waiting(pull: WaitingPullFact, now: datetime, bound_s: float, invariant: str, what: str, role: str,
             idle: Sequence[str] | None) -> list[Violation]:
    """``idle``: the roster's idle reviewers (mergers); None: foreman takes it itself (``[merge] by = "foreman"``)."""
    if pull.since is None or now - pull.since <= timedelta(seconds=bound_s):
        return []
    if idle is None:
        who = "foreman merges it itself ([merge] by = \"foreman\")"
    else:
        free = [login for login in idle if login.lower() not in pull.barred]
        if not free:
            return []
        who = f"idle {role}(s) who may take it: {', '.join(free)}"
    return [Violation(invariant, f"#{pull.issue_number} (PR #{pull.pull_number})",
                      f"waiting for {what} since {pull.since.isoformat()}, {_seconds(now - pull.since)} ago (bound "
                      f"{bound_s:g} s); {who}")]


def _seconds(delta: timedelta) -> str:
    return f"{int(delta.total_seconds())} s"


def real_path(path: str) -> str:
    return os.path.realpath(path)


def report(violations: Sequence[Violation]) -> dict[str, Any]:
    """A JSON-ready summary: ok, the count per invariant, and every violation."""
    return {
        "ok": not violations,
        "checked": sorted(INVARIANTS),
        "counts": dict(sorted(Counter(v.invariant for v in violations).items())),
        "violations": [v.to_dict() for v in violations],
    }
