"""The dashboard's first screen: is foreman healthy, what needs a person now, and the flow of the open issues as a
board (issue 34, item 1). Reads the stores; health is ``/readyz``'s own document, handed in by the service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from bot.config import Settings
from bot.core.evidence import parse_evidence
from bot.core.vocabulary import STATES
from state.db import Database, to_db_time
from state.deliveries import DeliveryStore
from state.issues import IssueStore
from state.leases import Lease, LeaseStore
from state.outbox import OutboxStore

#: The board's columns, in the order a piece of work moves (``blocked`` and ``other`` are open issues off the flow).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("ready", "Ready"), ("in-progress", "In progress"), ("review", "Review"), ("merge", "Merge"),
    ("blocked", "Blocked"), ("other", "Open, no status"), ("done", "Done today"),
)
#: Catch-up is stale (red) when its last success is older than this many intervals.
CATCH_UP_STALE_INTERVALS = 3
#: The event loop held for longer than this (the worst since start) is shown as a warning.
LAG_WARN_S = 1.0
_STATUS_LABELS = {row.label: row.state for row in STATES}


def _age_s(then: datetime | None, now: datetime) -> int | None:
    return None if then is None else max(0, int((now - then).total_seconds()))


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


# --- health -----------------------------------------------------------------------------------------------------------
def health(readiness: Mapping[str, Any] | None, repo: str, now: datetime) -> dict[str, Any]:
    """The health strip from ``/readyz``'s document (``Service.readiness``): each check with ``ok`` (True, False or
    None for unknown) and a line saying why; ``ok`` overall is False with ``reasons`` when any check is red."""
    if readiness is None:
        return {"ok": None, "reasons": ["health is read from the running service (foreman serve)"], "checks": []}
    checks = readiness.get("checks") or {}
    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool | None, detail: str) -> None:
        out.append({"name": name, "ok": ok, "detail": detail})

    gitea = checks.get("gitea") or {}
    add("Gitea", bool(gitea.get("ok")),
        f"reachable as {gitea.get('login')}" if gitea.get("ok") else _unreachable(str(gitea.get("detail"))))
    database = checks.get("database") or {}
    add("database", bool(database.get("ok")), "writable" if database.get("ok") else
        f"not writable: {database.get('reason')} ({database.get('detail')})")
    worker = checks.get("worker") or {}
    loops = f"{worker.get('loops_alive')} of {worker.get('loops')} worker loops alive"
    writer = "the writer is alive" if worker.get("writer_alive") else "the writer is dead"
    retrying = worker.get("settles_retrying") or 0
    add("loops", bool(worker.get("ok")), f"{loops}, {writer}"
        + (f", {retrying} settles retrying (oldest {worker.get('oldest_settle_retry_s')} s)" if retrying else ""))
    reconcile = ((checks.get("repositories") or {}).get(repo) or {}).get("reconcile") or checks.get("reconcile") or {}
    add("catch-up", *_catch_up(reconcile, now))
    transport = ((checks.get("repositories") or {}).get(repo) or {}).get("git_transport") or checks.get(
        "git_transport")
    if transport:
        add("git", transport.get("ok"), _transport(transport))
    outbox = checks.get("outbox") or {}
    stuck = {k: outbox.get(k, 0) for k in ("parked", "verification_failed", "failed") if outbox.get(k)}
    add("outbox", not stuck, f"sender {outbox.get('sender')}, {outbox.get('pending', 0)} pending"
        + ("".join(f", {n} {k.replace('_', ' ')}" for k, n in stuck.items())))
    lag = (checks.get("event_loop") or {}).get("lag_max_s")
    add("lag", None if lag is None else lag <= LAG_WARN_S,
        "unknown" if lag is None else f"the event loop was held at most {lag:.2f} s since start")
    reasons = [f"{c['name']}: {c['detail']}" for c in out if c["ok"] is False and c["name"] != "lag"]
    return {"ok": bool(readiness.get("ready")) and not reasons, "reasons": reasons, "checks": out}


def _unreachable(detail: str) -> str:
    return detail if detail.startswith(("unreachable", "no gitea.token", "not probed")) else f"unreachable: {detail}"


def _transport(check: Mapping[str, Any]) -> str:
    """The git transport check's line: git over HTTP with the bot's credentials, as last checked."""
    if check.get("ok") is None:
        return str(check.get("detail") or "not checked yet")
    age = f" {check.get('age_s')} s ago (every {check.get('interval_s')} s)"
    if check.get("ok"):
        return f"ls-remote answered{age}"
    return f"ls-remote failed{age}: {check.get('reason') or check.get('detail')}"


def _catch_up(check: Mapping[str, Any], now: datetime) -> tuple[bool | None, str]:
    if check.get("ok") is None and not check.get("last_success_at"):
        return None, str(check.get("detail") or "not run yet")
    interval = float(check.get("interval_s") or 0)
    last = _parse_time(check.get("last_success_at"))
    age = _age_s(last, now)
    if check.get("last_error"):
        return False, f"the last pass failed: {check.get('last_error')}" + (
            "" if age is None else f" (last success {age} s ago)")
    if age is None:
        return None, "running its first pass" if check.get("running") else "no pass finished yet"
    if interval and age > CATCH_UP_STALE_INTERVALS * interval:
        return False, f"stale: the last success was {age} s ago (every {interval:g} s)"
    return True, f"last success {age} s ago (every {interval:g} s)"


# --- the flow ---------------------------------------------------------------------------------------------------------
def _state_of(labels: Sequence[str], canonical: str | None) -> str | None:
    """The issue's state: its ``status:*`` label (what Gitea shows), else its Canonical Issue State."""
    found = [_STATUS_LABELS[name] for name in labels if name in _STATUS_LABELS]
    return found[0] if found else canonical


def _column(state: str | None, lease: Lease | None, stage: str | None) -> str:
    if stage in ("review", "merge"):
        return stage
    if lease is not None and lease.action in ("review", "merge"):
        return lease.action
    if state == "ready" and lease is not None:
        return "in-progress"
    if state in ("ready", "in-progress", "blocked", "review"):
        return state
    if state == "pr-open":
        return "review"
    return "in-progress" if lease is not None else "other"


def _card(number: int, title: str | None, labels: Sequence[str], snapshot_state: Any, lease: Lease | None,
          queued: Mapping[str, Any] | None, skipped: str | None, now: datetime) -> dict[str, Any]:
    canonical = snapshot_state.state if snapshot_state is not None else None
    state = _state_of(labels, canonical)
    stage = queued.get("stage") if queued else None
    column = _column(state, lease, stage)
    who = snapshot_state.who_is_next if snapshot_state is not None else None
    action = snapshot_state.next_action if snapshot_state is not None else None
    waits: str | None
    if column in ("review", "merge") and queued:
        waits = f"{stage}: {queued.get('missing')}" if queued.get("missing") not in (None, "nothing") else (
            f"an idle {'reviewer' if stage == 'review' else 'merger'}")
    elif column == "blocked":
        waits = f"{who or 'someone'}: {snapshot_state.blockers if snapshot_state is not None else '?'}"
    elif lease is not None:
        waits = action if action and who != "human" else f"{lease.owner} ({lease.action})"
    elif column == "ready":
        waits = skipped or "an idle author"
    else:
        waits = f"{who}: {action}" if who and action else None
    return {
        "issue_number": number, "title": title or (queued or {}).get("title"), "state": state, "column": column,
        "labels": list(labels),
        "holder": None if lease is None else lease.owner, "action": None if lease is None else lease.action,
        "held_since": None if lease is None else to_db_time(lease.acquired_at),
        "held_s": None if lease is None else _age_s(lease.acquired_at, now),
        "heartbeat_at": None if lease is None else to_db_time(lease.heartbeat_at),
        "heartbeat_s": None if lease is None else _age_s(lease.heartbeat_at, now),
        "expires_at": None if lease is None else to_db_time(lease.expires_at),
        "who_is_next": who, "next_action": action, "waits_for": waits,
        "pull_number": (queued or {}).get("pull_number"),
    }


async def flow(db: Database, settings: Settings, *, now: datetime, queues: Mapping[str, Any] | None,
               decisions_now: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every open issue (and those closed today) as a card in its column."""
    repo = settings.repo_key
    issues = IssueStore(db)
    titles = await DeliveryStore(db).issue_titles(repo)
    live = {lease.issue_number: lease for lease in await LeaseStore(db).open_leases(repo) if lease.is_live(now)}
    queued = {int(q["issue_number"]): q for q in (*(queues or {}).get("reviews_waiting", []),
                                                 *(queues or {}).get("merges_waiting", []))}
    skipped: dict[int, str] = {}
    for decision in decisions_now:
        for skip in decision.get("skipped") or []:
            if isinstance(skip.get("issue_number"), int):
                skipped.setdefault(skip["issue_number"], f"skipped: {skip.get('reason')}")
    cards = [
        _card(s.number, titles.get(s.number), s.label_names, s.state, live.get(s.number), queued.get(s.number),
              skipped.get(s.number), now)
        for s in await issues.open_issues(repo)
    ]
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for s in await issues.closed_since(repo, to_db_time(midnight)):
        card = _card(s.number, titles.get(s.number), s.label_names, s.state, None, None, None, now)
        cards.append({**card, "column": "done", "waits_for": None})
    columns = [{"key": key, "title": title, "cards": [c for c in cards if c["column"] == key]}
               for key, title in COLUMNS]
    return {"columns": columns, "open": sum(1 for c in cards if c["column"] != "done")}


# --- what needs a person ----------------------------------------------------------------------------------------------
async def refused_commands(db: Database, settings: Settings, *, limit: int = 20) -> list[dict[str, Any]]:
    """Comment commands the gateway refused, newest first: who, which command, on which issue, and why (from the
    refusal the reply carries)."""
    out: list[dict[str, Any]] = []
    deliveries = DeliveryStore(db)
    for entry in await OutboxStore(db).command_replies(repo=settings.repo_key, limit=limit * 3):
        evidence = parse_evidence(str(entry.payload.get("body") or ""))
        refusal = (evidence or {}).get("refusal")
        if not isinstance(refusal, dict):
            continue
        found = await deliveries.get(entry.delivery_id) if entry.delivery_id else None
        first = str(entry.payload.get("body") or "").split("`", 2)
        out.append({"at": entry.created_at, "issue_number": entry.issue_number,
                    "command": first[1] if len(first) > 2 else None,
                    "sender": found.sender_login if found is not None else None, "delivery": entry.delivery_id,
                    "error": refusal.get("error"), "message": refusal.get("message"),
                    "reply_status": entry.status})
        if len(out) >= limit:
            break
    return out


def _stranded(leases_doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{**d, "why": "marked live past its expiry (the teardown gives it back after its grace)"}
            for d in leases_doc.get("stale_live", [])]


def attention(*, cards: Sequence[Mapping[str, Any]], outbox_doc: Mapping[str, Any], failed_deliveries: Sequence[
              Mapping[str, Any]], leases_doc: Mapping[str, Any], commands: Sequence[Mapping[str, Any]],
              refused: Mapping[str, Any] | None, ignored: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a person must look at now; ``count`` is how many of them ask for action."""
    blocked = [c for c in cards if c.get("column") == "blocked"]
    stuck = [e for e in outbox_doc.get("open", []) if e.get("status") in ("parked", "verification_failed", "failed")]
    stranded = _stranded(leases_doc)
    return {
        "count": len(blocked) + len(stuck) + len(failed_deliveries) + len(stranded),
        "blocked": blocked, "outbox": stuck, "failed_deliveries": list(failed_deliveries), "stranded": stranded,
        "refused_commands": list(commands), "refused_deliveries": refused,
        "refused_count": sum(c.get("count", 0) for c in (refused or {}).get("counts", [])),
        "ignored_deliveries": list(ignored),
    }


def collapse(decisions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Recorded decisions (newest first) with identical neighbours folded into one: ``count`` and the span
    ``first_at`` .. ``at`` (the newest)."""
    out: list[dict[str, Any]] = []
    for doc in decisions:
        sign = _signature(doc)
        if out and out[-1]["_sign"] == sign:
            out[-1]["count"] += 1
            out[-1]["first_at"] = doc.get("at")
            continue
        out.append({**doc, "count": 1, "first_at": doc.get("at"), "_sign": sign})
    for doc in out:
        del doc["_sign"]
    return out


def _signature(doc: Mapping[str, Any]) -> str:
    skipped = tuple((s.get("issue_number"), s.get("reason")) for s in doc.get("skipped") or [])
    keys = ("source", "trigger", "leased", "waiting", "blocked", "resumed", "issue_number", "owner", "lease_id")
    return repr((tuple(repr(doc.get(k)) for k in keys), skipped))

