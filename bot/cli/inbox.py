"""`foreman deliveries`, `replay` and `outbox`: the stored deliveries and the intended Gitea mutations."""

from __future__ import annotations

import argparse
import asyncio
import getpass

from bot.cli.common import EXIT_OK, emit, refused, with_db, with_store
from bot.cli.parsing import LIMIT_HELP, Commands, add_json, count, delivery_ref, row_id
from bot.config import Settings
from state.db import Database
from state.deliveries import STATUSES, DeliveryStore
from state.outbox import OUTBOX_STATUSES


def cmd_deliveries(settings: Settings, args: argparse.Namespace) -> int:
    if getattr(args, "reconcile", False):
        return asyncio.run(with_db(settings, lambda db: _reconcile_summary(settings, db, as_json=args.json)))

    async def work(store: DeliveryStore) -> int:
        rows = await store.list(status=args.status, limit=args.limit)
        docs = [row.summary() for row in rows]
        lines = [
            f"{d['id']:>6} {d['status']:<12} {d['event']}/{d['action'] or '-'} {d['delivery']}"
            f" attempts={d['attempts']}" + (" (catch-up)" if d["source"] == "reconcile" else "")
            + (f" error={d['last_error']}" if d["last_error"] else "")
            for d in docs
        ]
        emit(docs, as_json=args.json, text="\n".join(lines) if lines else "(no deliveries)")
        return EXIT_OK

    return asyncio.run(with_store(settings, work))


async def _reconcile_summary(settings: Settings, db: Database, *, as_json: bool) -> int:
    """`foreman deliveries --reconcile`: per served repository, the last catch-up pass, the last that succeeded,
    and the down window (one document for one repository; ``{"repositories": [...]}`` for several)."""
    from state.reconcile import ReconcileStore

    store = ReconcileStore(db)
    docs, texts = [], []
    for repo in settings.repository_keys():
        last, ok = await store.last_pass(repo), await store.last_pass(repo, succeeded=True)
        doc = {
            "repository": repo,
            "interval_s": settings.reconcile.interval_s,
            "last_pass": last.to_dict() if last else None,
            "last_success": ok.to_dict() if ok else None,
            "watermark": await store.watermark(repo),
        }
        docs.append(doc)
        if last is None:
            texts.append(f"no catch-up pass recorded for {repo} (the service runs one at start when gitea.token "
                         "is set)")
            continue
        found = ", ".join(f"{k} {v}" for k, v in sorted(last.found.items())) or "nothing"
        texts.append(
            f"{repo}: last catch-up pass {last.id} ({last.trigger}, {last.outcome}) finished {last.finished_at}: "
            f"read {last.read_issues} issues and {last.read_comments} comments since {last.since} in {last.calls} "
            f"API calls; found {found} that no webhook had brought"
            + (f"; error (could not read it): {last.error}" if last.error else "")
            + (f"\ndown window before it: from {last.down_from}, {last.down_seconds:.0f} s" if last.down_from
               and last.down_seconds is not None else "")
            + f"\nwatermark: {doc['watermark']}"
        )
    emit(docs[0] if len(docs) == 1 else {"repositories": docs}, as_json=as_json, text="\n\n".join(texts))
    return EXIT_OK


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: DeliveryStore) -> int:
        try:
            replayed = await store.replay(args.id, requested_by=getpass.getuser(), force=args.force)
        except (LookupError, ValueError) as exc:
            return refused(exc, listing="foreman deliveries --status failed")
        emit(replayed.summary(), as_json=args.json, text=replayed.describe())
        return EXIT_OK

    return asyncio.run(with_store(settings, work))


def cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    from state.outbox import OutboxStore

    async def work(db: Database) -> int:
        store = OutboxStore(db)
        if args.outbox_command == "retry":
            try:
                entry = await store.retry(args.id)
            except (LookupError, ValueError) as exc:
                return refused(exc, listing="foreman outbox --status parked")
            emit(entry.summary(), as_json=args.json, text=f"outbox entry {entry.id} ({entry.key}) queued again")
            return EXIT_OK
        entries = [e.summary() for e in await store.list(status=args.status, limit=args.limit)]
        lines = [
            f"{e['id']:>6} {e['status']:<19} #{e['issue']} {e['kind']:<12} {e['key']} attempts={e['attempts']}"
            + (f" error={e['last_error']}" if e["last_error"] else "")
            for e in entries
        ]
        emit(entries, as_json=args.json, text="\n".join(lines) if lines else "(no outbox entries)")
        return EXIT_OK

    return asyncio.run(with_db(settings, work))


def register(commands: Commands) -> None:
    """``foreman deliveries``, ``replay`` and ``outbox`` (``outbox retry``)."""
    deliveries = commands.add("deliveries", "list stored webhook deliveries")
    deliveries.add_argument("--status", choices=STATUSES, help="only deliveries with this status")
    deliveries.add_argument("--limit", type=count, default=50, metavar="N", help=LIMIT_HELP)
    deliveries.add_argument("--reconcile", action="store_true",
                            help="the last catch-up pass instead: what it read, found and missed")
    add_json(deliveries)
    replay = commands.add("replay", "queue a stored delivery again")
    replay.add_argument("id", type=delivery_ref, help="row id or Gitea delivery id")
    replay.add_argument("--force", action="store_true", help="also replay done or ignored deliveries")
    add_json(replay)
    outbox = commands.add("outbox", "list intended Gitea mutations, or retry a parked one")
    outbox.add_argument("--status", choices=OUTBOX_STATUSES, help="only entries with this status")
    outbox.add_argument("--limit", type=count, default=50, metavar="N", help=LIMIT_HELP)
    add_json(outbox)
    outbox_sub = outbox.add_subparsers(dest="outbox_command", metavar="SUBCOMMAND")
    outbox_retry = outbox_sub.add_parser("retry", help="send a parked or verification_failed entry again")
    outbox_retry.add_argument("id", type=row_id, help="the entry's id (foreman outbox shows it)")
    add_json(outbox_retry)
