"""The dashboard's view model: JSON-able documents read from the stores, shared by the pages, the API and the CLI."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bot.config import Settings
from bot.core.evidence import parse_evidence, scrub
from bot.core.vocabulary import label_for_state
from state.auto_allocations import AutoAllocationStore
from state.db import Database, to_db_time, utcnow
from state.deliveries import DeliveryStore
from state.grants import GrantIntegrityError, GrantStore
from state.issues import IssueStore
from state.journal import JournalStore, Transition
from state.leases import Lease, LeaseStore
from state.outbox import OutboxEntry, OutboxStore

if TYPE_CHECKING:
    from bot.verbs.allocate import AllocatorGitea
    from bot.verbs.runtime import VerbRuntime

#: Outbox statuses an operator must look at (pending work, and what stopped).
OUTBOX_OPEN = ("pending", "sending", "verification_failed", "parked")


# --- store reads ------------------------------------------------------------------------------------------------------
def _lease_doc(lease: Lease, now: datetime) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "issue_number": lease.issue_number,
        "owner": lease.owner,
        "role": lease.role,
        "action": lease.action,
        "status": lease.status,
        "live": lease.is_live(now),
        "acquired_at": to_db_time(lease.acquired_at),
        "expires_at": to_db_time(lease.expires_at),
        "heartbeat_at": to_db_time(lease.heartbeat_at),
        "ended_at": None if lease.ended_at is None else to_db_time(lease.ended_at),
        "end_reason": lease.end_reason,
        "fingerprint": lease.fingerprint,
        "exclusions": lease.request.get("exclude", []) if isinstance(lease.request, dict) else [],
    }


async def leases(db: Database, settings: Settings, *, now: datetime | None = None, limit: int = 50,
                 issue: int | None = None) -> dict[str, Any]:
    """Live leases (status live and not expired) and the most recent ones, newest first."""
    moment = now or utcnow()
    store = LeaseStore(db)
    recent = await store.recent(settings.repo_key, issue=issue, limit=limit)
    marked_live = [_lease_doc(lease, moment)
                   for lease in await store.recent(settings.repo_key, issue=issue, marked_live=True)]
    return {"live": [d for d in marked_live if d["live"]],
            "stale_live": [d for d in marked_live if not d["live"]],
            "recent": [_lease_doc(lease, moment) for lease in recent]}


async def lease_events(db: Database, lease_ids: Iterable[str]) -> list[dict[str, Any]]:
    return await LeaseStore(db).events_of(lease_ids)


def _transition_doc(transition: Transition) -> dict[str, Any]:
    return {**transition.summary(), "id": transition.id, "attempt": transition.attempt,
            "error": transition.error, "result": transition.result}


async def journal(db: Database, settings: Settings, *, key: str | None = None, issue: int | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
    """Bootstrap transitions, newest first, each with every phase it reached (oldest first) and its proof."""
    store = JournalStore(db)
    if key is not None:
        found = await store.get(key)
        transitions = [found] if found is not None else []
    else:
        transitions = await store.recent(settings.repo_key, issue=issue, limit=limit)
    phases = await store.phases_of(t.id for t in transitions)
    return [{**_transition_doc(t), "phases": [p.to_dict() for p in phases[t.id]]} for t in transitions]


def _outbox_doc(entry: OutboxEntry) -> dict[str, Any]:
    """An outbox entry with both versions of a failed verification: what was intended and what Gitea showed."""
    return {**entry.summary(), "intended": entry.payload}


async def outbox(db: Database, *, limit: int = 50, issue: int | None = None, repo: str | None = None
                 ) -> dict[str, Any]:
    """The outbox's counts and the entries that need attention (every repository's), or one issue's entries
    (of the repository ``repo``)."""
    store = OutboxStore(db)
    counts = await store.counts()
    if issue is not None:
        return {"counts": counts, "entries": [_outbox_doc(e) for e in await store.for_issue(issue, repo=repo)]}
    open_entries: list[dict[str, Any]] = []
    for status in OUTBOX_OPEN:
        open_entries.extend(_outbox_doc(e) for e in await store.list(status=status, limit=limit))
    recent = [_outbox_doc(e) for e in await store.list(limit=limit)]
    return {"counts": counts, "open": open_entries, "recent": recent}


async def deliveries(db: Database, settings: Settings, *, limit: int = 50, issue: int | None = None
                     ) -> dict[str, Any]:
    store = DeliveryStore(db)
    counts = await store.counts()
    if issue is None:
        return {"counts": counts, "recent": [d.summary() for d in await store.list(limit=limit)]}
    found = await store.for_issue(settings.repo_key, issue, limit=limit)
    return {"counts": counts, "recent": [d.summary() for d in found]}


async def grants(db: Database, *, repo: str, limit: int = 50, issue: int | None = None) -> list[dict[str, Any]]:
    """One repository's run grants (never their tokens: only a digest is stored, and it is not shown) with every
    decision."""
    store = GrantStore(db)
    out: list[dict[str, Any]] = []
    for record in await store.runs(limit=1000):
        if record.repo != repo or (issue is not None and record.issue_number != issue):
            continue
        if issue is None and len(out) >= limit:
            break
        run = scrub(record.summary())
        try:
            grant = await store.grant(record.run_id)
            calls = [scrub(c) for c in grant.to_dict().get("calls", [])] if grant is not None else []
            integrity = "intact"
        except GrantIntegrityError as exc:  # reported, never trusted
            calls, integrity = [], f"not intact: {exc}"
        out.append({"run": run, "calls": calls, "grant_integrity": integrity,
                    "decisions": [scrub(d.to_dict()) for d in await store.decisions(record.run_id)]})
    return out


async def ready_candidates(db: Database, settings: Settings) -> list[dict[str, Any]]:
    ready = label_for_state("ready")
    out: list[dict[str, Any]] = []
    for snapshot in await IssueStore(db).open_issues(settings.repo_key):
        if ready in snapshot.label_names:
            out.append({"issue_number": snapshot.number, "labels": sorted(snapshot.label_names),
                        "blockers": list(snapshot.open_blockers)})
    return out


async def current_decisions(db: Database, settings: Settings) -> list[dict[str, Any]]:
    """What the allocator would decide now for each roster author: a dry-run allocation by the operator through the
    door, over the stored issue state (no Gitea call, no bootstrap proof, nothing written), with every skipped issue
    and its stable reason."""
    from bot.catalog import open_door
    from bot.verbs.allocate import AllocationOutcome
    from bot.verbs.runtime import no_bootstrap, operator_caller

    out: list[dict[str, Any]] = []
    runtime = open_door(db, settings, bot_login=settings.gitea.bot_login, bootstrap_factory=no_bootstrap)
    caller = operator_caller("dashboard", "dashboard")
    for owner in settings.authors():
        # The door never raises: an unexpected failure is an `unavailable` envelope, and the page shows the rest.
        result = await runtime.call("allocate_next_work", caller, {"owner": owner, "dry_run": True})
        if isinstance(result.outcome, AllocationOutcome):
            doc = result.outcome.to_dict()
        else:  # refused at the door, before the allocator ran
            doc = {**result.doc, "decision": result.doc.get("error", "refused")}
        out.append({"owner": owner, **scrub(doc)})
    return out


async def recorded_decisions(db: Database, settings: Settings, *, limit: int = 20) -> list[dict[str, Any]]:
    """Decisions the allocator recorded: automatic runs (``auto_allocations``) and the
    evidence of every applied allocation (read back from the bot's comments in the outbox), newest first."""
    out: list[dict[str, Any]] = []
    for decision in await AutoAllocationStore(db).recent(settings.repo_key, limit=limit):
        doc = decision.doc
        out.append({"source": "auto", "at": decision.decided_at, "trigger": decision.trigger,
                    "delivery": decision.delivery_id, **scrub(doc if isinstance(doc, dict) else {"doc": doc})})
    for entry in await OutboxStore(db).evidence_comments(limit=limit * 4, repo=settings.repo_key):
        evidence = parse_evidence(entry.payload.get("body", ""))
        if evidence is None or evidence.get("action") != "allocate":
            continue
        lease = evidence.get("lease") or {}
        out.append({"source": "applied", "at": entry.created_at, "issue_number": entry.issue_number,
                    "owner": lease.get("owner"), "lease_id": lease.get("lease_id"),
                    "fingerprint": evidence.get("fingerprint"), "requested_by": evidence.get("requested_by"),
                    "exclusions": evidence.get("exclusions"), "skipped": evidence.get("skipped", []),
                    "evidence_status": entry.status})
    out.sort(key=lambda d: str(d.get("at") or ""), reverse=True)
    return out[:limit]


async def worktrees(db: Database, settings: Settings, issue: int) -> list[dict[str, Any]]:
    return [{**r.to_dict(), "id": r.id, "journal_id": r.journal_id, "repo": r.repo, "issue_number": r.issue_number}
            for r in await JournalStore(db).registrations(settings.repo_key, issue)]


async def queues(door: VerbRuntime[AllocatorGitea], *, now: datetime | None = None) -> dict[str, Any]:
    """The review and merge queues of the door's repository as ``work_queues`` reads them (``WorkQueues.to_dict``:
    reviews waiting, merges waiting in approval order, the leases in hand, the idle reviewers and mergers, who
    merges), each waiting pull request with when it entered its queue (``waiting_since``: its issue's last lease's
    end, as ``foreman invariants`` reads it; None when foreman never leased the issue) and for how long, and which
    queues run by themselves. Raises LookupError without a Gitea client, GiteaError when Gitea cannot answer."""
    from bot.verbs.queue_view import work_queues

    moment = now or utcnow()
    settings = door.settings
    found = await work_queues(door, moment)
    doc = found.to_dict()
    for entry in (*doc["reviews_waiting"], *doc["merges_waiting"]):
        since = found.since.get(entry["issue_number"])
        entry["waiting_since"] = None if since is None else to_db_time(since)
        entry["waiting_s"] = None if since is None else max(0, int((moment - since).total_seconds()))
    running = sorted(settings.allocator.queues) if settings.auto_allocation() else []
    return {"repository": door.repo, "generated_at": to_db_time(moment), **doc, "running": running,
            "wait_bound_s": settings.allocator.queue_wait_bound_s}


async def overview(db: Database, settings: Settings, *, now: datetime | None = None, limit: int = 50,
                   queues: dict[str, Any] | None = None, readiness: Mapping[str, Any] | None = None,
                   refused: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the front page shows: first the board (health from ``readiness``, ``/readyz``'s document; what
    needs a person, with the webhook door's ``refused`` deliveries; the flow, with the ``queues`` read from Gitea),
    then the detail sections."""
    from bot.dashboard import board

    moment = now or utcnow()
    decisions_now = await current_decisions(db, settings)
    lease_doc = await leases(db, settings, now=moment, limit=limit)
    outbox_doc = await outbox(db, limit=limit)
    deliveries_doc = await deliveries(db, settings, limit=limit)
    commands = await board.refused_commands(db, settings)
    refusals = {c["delivery"]: c for c in commands if c.get("delivery")}
    for row in deliveries_doc["recent"]:
        found = refusals.get(row["delivery"])
        if found is not None:
            row["refused"] = (f"{found.get('command') or 'command'} refused: {found.get('error')}:"
                              f" {found.get('message')}")
    flow = await board.flow(db, settings, now=moment, queues=queues, decisions_now=decisions_now)
    cards = [card for column in flow["columns"] for card in column["cards"]]
    failed = [d.summary() for d in await DeliveryStore(db).list(status="failed", limit=limit)]
    ignored = [d for d in deliveries_doc["recent"] if d.get("status") == "ignored"]
    return {
        "generated_at": to_db_time(moment),
        "repositories": [{"owner": settings.repository.owner, "name": settings.repository.name,
                          "key": settings.repo_key, "gitea_url": settings.gitea.url}],
        "health": board.health(readiness, settings.repo_key, moment),
        "attention": board.attention(cards=cards, outbox_doc=outbox_doc, failed_deliveries=failed,
                                     leases_doc=lease_doc, commands=commands, refused=refused, ignored=ignored),
        "flow": flow,
        "allocator": {
            "ready_candidates": await ready_candidates(db, settings),
            "now": decisions_now,
            "recorded": board.collapse(await recorded_decisions(db, settings, limit=200))[:20],
        },
        "queues": queues,
        "leases": lease_doc,
        "bootstrap": await journal(db, settings, limit=limit),
        "outbox": outbox_doc,
        "deliveries": deliveries_doc,
        "grants": await grants(db, repo=settings.repo_key, limit=limit),
    }


async def issue_view(db: Database, settings: Settings, number: int, *, now: datetime | None = None
                     ) -> dict[str, Any]:
    """One issue's whole story: state, deliveries, decisions, leases, comments the bot wrote, worktree, grants,
    and all of it merged into one timeline."""
    moment = now or utcnow()
    repo = settings.repo_key
    issues = IssueStore(db)
    snapshot = await issues.snapshot(repo, number)
    lease_doc = await leases(db, settings, now=moment, limit=1000, issue=number)
    events = await lease_events(db, (d["lease_id"] for d in lease_doc["recent"]))
    comments = [
        {"comment_id": r.comment_id, "action": r.action, "author": r.author, "created_at": r.created_at,
         "recorded_at": r.recorded_at, "trusted": r.trusted, "trust_reason": r.trust_reason,
         "state": r.state.state if r.state is not None else None, "errors": list(r.errors)}
        for r in await issues.comment_records(repo, number)
    ]
    parts = {
        "deliveries": (await deliveries(db, settings, limit=1000, issue=number))["recent"],
        "issue_events": scrub(await issues.issue_events(repo, number)),
        "comments": comments,
        "leases": lease_doc["recent"],
        "lease_events": events,
        "bootstrap": await journal(db, settings, issue=number, limit=1000),
        "bot_writes": (await outbox(db, issue=number, repo=repo))["entries"],
        "worktrees": await worktrees(db, settings, number),
        "grants": await grants(db, repo=repo, issue=number),
        "decisions": [d for d in await recorded_decisions(db, settings, limit=1000)
                      if d.get("issue_number") == number or number in _numbers_in(d)],
    }
    return {
        "generated_at": to_db_time(moment),
        "repository": repo,
        "issue_number": number,
        "known": snapshot is not None or any(parts.values()),
        "snapshot": None if snapshot is None else {
            "open": snapshot.is_open, "labels": sorted(snapshot.label_names),
            "state": snapshot.state.state if snapshot.state is not None else None,
            "who_is_next": snapshot.state.who_is_next if snapshot.state is not None else None,
            "next_action": snapshot.state.next_action if snapshot.state is not None else None,
            "blockers": list(snapshot.open_blockers), "snapshot_as_of": snapshot.snapshot_as_of,
        },
        **parts,
        "timeline": timeline(parts),
    }


# --- pure projections -------------------------------------------------------------------------------------------------


def _numbers_in(decision: Mapping[str, Any]) -> set[int]:
    found: set[int] = set()
    for key in ("leased", "resumed", "blocked", "waiting"):
        value = decision.get(key)
        if isinstance(value, list):
            found.update(v for v in value if isinstance(v, int))
    return found


def _moment(text: object) -> str:
    """A sortable UTC text for any stored time (db times, isoformat with an offset, Gitea's Z times)."""
    if not isinstance(text, str) or not text:
        return ""
    try:
        return to_db_time(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return text


def timeline(parts: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Every record of one issue as (at, kind, summary), oldest first."""
    items: list[dict[str, Any]] = []

    def add(at: object, kind: str, summary: str) -> None:
        items.append({"at": _moment(at), "kind": kind, "summary": summary})

    for d in parts.get("deliveries", []):
        reason = f" ({d['ignored_reason']})" if d.get("ignored_reason") else ""
        add(d.get("received_at"), "delivery",
            f"{d.get('event')}/{d.get('action') or '-'} from {d.get('sender') or '?'}: {d.get('status')}{reason}")
    for e in parts.get("issue_events", []):
        add(e.get("recorded_at"), "issue_event", f"{e.get('action')} by {e.get('sender') or '?'}")
    for c in parts.get("comments", []):
        trust = "trusted" if c.get("trusted") else "untrusted"
        add(c.get("recorded_at") or c.get("created_at"), "comment",
            f"comment {c.get('comment_id')} {c.get('action')} by {c.get('author')} ({trust}: {c.get('trust_reason')})"
            + (f", state {c['state']}" if c.get("state") else ""))
    for d in parts.get("decisions", []):
        add(d.get("at"), "decision", f"allocator ({d.get('source')}): "
            + (f"leased to {d.get('owner')}" if d.get("source") == "applied" else str(d.get("trigger")))
            + f", {len(d.get('skipped') or [])} skipped")
    for ev in parts.get("lease_events", []):
        add(ev.get("at"), "lease", f"lease {ev.get('lease_id')} {ev.get('kind')} by {ev.get('actor')}")
    for t in parts.get("bootstrap", []):
        for phase in t.get("phases", []):
            add(phase.get("recorded_at"), "bootstrap", f"{t.get('idempotency_key')}: {phase.get('phase')}")
    for o in parts.get("bot_writes", []):
        add(o.get("created_at"), "outbox", f"{o.get('kind')} {o.get('key')} queued")
        if o.get("sent_at"):
            add(o.get("sent_at"), "outbox", f"{o.get('kind')} {o.get('key')} {o.get('status')}")
    for w in parts.get("worktrees", []):
        add(w.get("registered_at"), "worktree", f"worktree {w.get('worktree_path')} on {w.get('branch')} registered")
        if w.get("ended_at"):
            add(w.get("ended_at"), "worktree", f"worktree {w.get('worktree_path')} ended ({w.get('end_reason')})")
    for g in parts.get("grants", []):
        run = g.get("run", {})
        add(run.get("created_at"), "grant", f"run {run.get('run_id')} sealed ({run.get('policy')})")
        for dec in g.get("decisions", []):
            add(dec.get("at"), "admission", f"run {run.get('run_id')}: {dec.get('kind')} {dec.get('tool') or '-'}"
                f" ({dec.get('reason')})")
    items.sort(key=lambda i: i["at"])
    return items
