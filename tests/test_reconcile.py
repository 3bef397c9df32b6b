"""Catch-up: the pure plan, the emulator's ``since`` as Gitea's, the command claims, and one counted pass."""

from __future__ import annotations

import asyncio
import email.utils
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core import reconcile as core
from bot.core.evidence import marker
from bot.metrics import Metrics
from bot.reconcile import PAGE_SIZE, Reconciler
from state.db import Database
from state.deliveries import DeliveryStore
from state.outbox import OutboxIntent, OutboxStore
from state.reconcile import CommandClaims, ReconcileStore
from tests.conftest import DbOpener
from tests.gitea_fixtures import BOT, OWNER, REPO, LiveEmulator, live_emulator
from tests.support import Started, eventually
from tests.world import open_world

REPOSITORY = {"full_name": f"{OWNER}/{REPO}"}


def _issue(number: int, labels: tuple[str, ...] = (), *, state: str = "open", pull: bool = False) -> dict[str, Any]:
    return {
        "number": number,
        "state": state,
        "labels": [{"id": i + 1, "name": name} for i, name in enumerate(labels)],
        "updated_at": "2026-05-28T10:00:05+02:00",
        "pull_request": {"merged": False} if pull else None,
    }


def _comment(cid: int, number: int, body: str, *, login: str = "alice", pull: bool = False,
             updated: str = "2026-05-28T08:00:06Z") -> dict[str, Any]:
    url = f"http://gitea/{OWNER}/{REPO}/{'pulls' if pull else 'issues'}/{number}"
    return {
        "id": cid,
        "body": body,
        "user": {"login": login},
        "issue_url": "" if pull else url,
        "pull_request_url": url if pull else "",
        "created_at": "2026-05-28T08:00:06Z",
        "updated_at": updated,
    }


def _plan(issues: list[dict[str, Any]], comments: list[dict[str, Any]], known: core.Known | None = None) -> core.Plan:
    return core.plan(repository=REPOSITORY, issues=issues, comments=comments, known=known or core.Known(),
                     bot_login=BOT, pass_id=7)


def test_the_plan_feeds_only_what_the_service_never_saw() -> None:
    issues = [_issue(1, ("status:ready",)), _issue(2), _issue(3, ("bug",)), _issue(4, pull=True), _issue(5)]
    comments = [
        _comment(10, 1, "/allocate"),
        _comment(11, 2, "plain words"),
        _comment(12, 2, "mine", login=BOT.upper()),  # the bot's own: never acts (Gitea logins ignore case)
        _comment(13, 4, "looks good", pull=True),  # a PR comment that is no command: nothing to run
        _comment(14, 4, "/lock", pull=True),  # a PR command: its reply says commands act on issues
        _comment(15, 3, "seen already"),
        _comment(16, 3, "edited since", updated="2026-05-28T08:09:00Z"),
        _comment(17, 9, "on an issue not listed"),
    ]
    known = core.Known(
        issues={3: core.KnownIssue(frozenset({"bug"}), True), 5: core.KnownIssue(frozenset(), False)},
        comments={15: core.instant("2026-05-28T08:00:06Z"), 16: core.instant("2026-05-28T08:00:06Z")},
    )
    plan = _plan(issues, comments, known)
    assert [(s.payload["number"], s.action, s.reason) for s in plan.issues] == [
        (1, "label_updated", "never observed"),  # unknown, with a label: learnt
        (5, "reopened", "status changed"),  # stored closed, open in Gitea
    ]  # 2: unknown but open without labels (nothing to learn); 3: the same labels; 4: a pull request
    assert [(s.payload["comment"]["id"], s.action) for s in plan.comments] == [
        (10, "created"), (11, "created"), (14, "created"), (16, "edited"),
    ]
    assert plan.missing_issues == (9,)
    assert plan.skipped == {"pull_request": 1, "issue_seen": 2, "bot_comment": 1, "pull_request_comment": 1,
                            "comment_seen": 1}
    first = plan.comments[0]
    assert first.delivery_id == f"reconcile:comment:10:{core.instant('2026-05-28T08:00:06Z')}"
    assert first.payload["issue"]["number"] == 1 and first.payload["repository"] == REPOSITORY
    assert first.payload[core.MARKER_FIELD] == {"pass": 7, "kind": "comment", "reason": "never observed"}
    assert first.sender_login == "alice" and plan.comments[2].payload["is_pull"] is True
    # Deterministic: the same revisions plan the same ids (the inbox then refuses them as duplicates).
    assert [s.delivery_id for s in _plan(issues, comments, known).issues] == [s.delivery_id for s in plan.issues]
    # A claimed PR command is not fed again; another view of the same second gets another id.
    again = _plan(issues, comments, core.Known(known.issues, known.comments, frozenset({14})))
    assert 14 not in [s.payload["comment"]["id"] for s in again.comments]
    other = _plan([_issue(1, ("status:ready", "bug"))], [])
    assert other.issues[0].delivery_id != plan.issues[0].delivery_id
    assert other.issues[0].delivery_id.startswith("reconcile:issue:1:2026-05-28T08:00:05.000000Z:")


def test_a_comment_on_an_issue_read_apart_is_planned_with_it() -> None:
    plan = core.plan(repository=REPOSITORY, issues=[], comments=[_comment(17, 9, "/heartbeat")], known=core.Known(),
                     bot_login=BOT, pass_id=1, extra_issues={9: _issue(9)})
    assert plan.missing_issues == () and not plan.issues  # read only for the comment's sake
    assert [s.payload["issue"]["number"] for s in plan.comments] == [9]


def test_since_watermark_and_down_window_arithmetic() -> None:
    mark = core.instant("2026-05-28T10:00:05.900+02:00")
    assert mark == "2026-05-28T08:00:05.900000Z"
    assert core.since_for(mark, 60) == "2026-05-28T07:59:05Z"  # whole seconds, as Gitea compares them
    assert core.next_watermark(mark, core.instant("2026-05-28T07:00:00Z"), None) == mark  # a clock gone back
    assert core.next_watermark(None, mark, None) == mark
    later = core.parse_instant(mark)
    window = core.down_window(later.replace(hour=7), later)
    assert window.seconds == 3600.0 and "down from 2026-05-28T07:00:05Z" in window.describe()
    assert core.down_window(None, later).seconds is None
    assert core.comment_issue_number({"issue_url": "", "pull_request_url": "http://g/o/r/pulls/12"}) == 12
    assert core.comment_issue_number({"issue_url": "http://g/o/r/issues/3#x"}) is None


# --- the emulator's since, as Gitea's ---------------------------------------------------------------------------------


async def test_repo_comments_since_is_inclusive_whole_seconds_oldest_first_and_paged() -> None:
    clock = [1_780_000_000.0]
    async with live_emulator(clock=lambda: clock[0]) as live:
        emu = live.emulator
        emu.create_issue(OWNER, REPO, title="one", author="alice")
        made = []
        for n in range(5):
            clock[0] += 10
            made.append(emu.create_comment(OWNER, REPO, 1, author="alice", body=f"c{n}"))
        clock[0] += 10
        emu._op_edit_comment(made[0], emu.user("alice"), "c0 edited", notify=False)
        since = made[2].created  # exactly the third comment's second: included (Gte)

        async def listing(**query: str) -> tuple[int, Any, dict[str, str]]:
            async with live.session.get(live.api(f"/repos/{OWNER}/{REPO}/issues/comments"), params=query,
                                        headers=live.auth()) as resp:
                return resp.status, await resp.json(), dict(resp.headers)

        stamp = _rfc3339(since)
        status, body, headers = await listing(since=stamp)
        assert status == 200
        assert [c["body"] for c in body] == ["c0 edited", "c2", "c3", "c4"]  # by created, the edited one first
        assert headers["X-Total-Count"] == "4"
        assert headers["Date"] == email.utils.formatdate(clock[0], usegmt=True)  # the emulator's clock dates it
        status, page, headers = await listing(since=stamp, limit="3", page="2")
        assert [c["body"] for c in page] == ["c4"] and 'rel="prev"' in headers["Link"]
        status, _, _ = await listing(since="yesterday")
        assert status == 422
        client = live.client()
        assert [c.body async for c in client.iter_repo_comments(since=stamp, limit=2)] == [
            "c0 edited", "c2", "c3", "c4"
        ]


def _rfc3339(unix: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- command claims ---------------------------------------------------------------------------------------------------


async def test_a_command_is_claimed_once_per_comment_and_kept_by_its_own_retries(
    open_db: DbOpener, tmp_path: Path
) -> None:
    db = await open_db(tmp_path / "f.db")
    try:
        claims = CommandClaims(db)
        assert await claims.claim("Acme/Widgets", 5, "/lock", "webhook-1") is None
        assert await claims.claim("acme/widgets", 5, "/lock", "webhook-1") is None  # its own retry keeps it
        held = await claims.claim("acme/widgets", 5, "/lock", "reconcile:comment:5:x")
        assert held is not None and (held.delivery_id, held.command, held.finished_at) == ("webhook-1", "/lock", None)
        assert await claims.claim("acme/widgets", 6, "/heartbeat", "reconcile:comment:6:x") is None
        assert await ReconcileStore(db).claimed_comments("ACME/widgets", [5, 6, 7]) == {5, 6}
    finally:
        await db.close()


async def test_a_finished_command_is_never_run_again_not_even_by_the_delivery_that_ran_it(
    open_db: DbOpener, tmp_path: Path
) -> None:
    """Issue 29 item 5: once the command finished (its reply queued in the same commit), its own delivery's
    forced replay finds the claim like any other delivery does."""
    db = await open_db(tmp_path / "f.db")
    try:
        claims = CommandClaims(db)
        assert await claims.claim("acme/widgets", 5, "/lock", "webhook-1") is None
        reply = OutboxIntent("command:5:reply", 1, "comment", {"body": f"done\n{marker('command:5:reply')}"},
                             "webhook-1", repo="acme/widgets")
        await claims.finish("acme/widgets", 5, "webhook-1", reply)
        for delivery in ("webhook-1", "gitea-replay-2"):
            held = await claims.claim("acme/widgets", 5, "/lock", delivery)
            assert held is not None and held.delivery_id == "webhook-1" and held.finished_at is not None
        [entry] = await OutboxStore(db).list()
        assert (entry.key, entry.delivery_id) == ("command:5:reply", "webhook-1")
    finally:
        await db.close()


# --- one pass, calls counted; the service wires it --------------------------------------------------------------------


@pytest.fixture
async def world(open_db: DbOpener, tmp_path: Path) -> AsyncIterator[tuple[LiveEmulator, Database]]:
    async with live_emulator() as live:
        db = await open_db(tmp_path / "foreman.db")
        try:
            yield live, db
        finally:
            await db.close()


def _reconciler(live: LiveEmulator, db: Database, **options: Any) -> Reconciler:
    return Reconciler(db=db, store=DeliveryStore(db), gitea=live.client(), owner=OWNER, name=REPO,
                      interval_s=options.get("interval_s", 0.0), overlap_s=5.0, metrics=Metrics(),
                      bot_login=lambda: BOT, wakeup=lambda: None, settle_s=0.2)  # no worker drains here


async def test_a_pass_costs_one_call_plus_one_per_page_and_feeds_each_revision_once(
    world: tuple[LiveEmulator, Database],
) -> None:
    live, db = world
    emu = live.emulator
    reconciler = _reconciler(live, db)
    baseline = await reconciler.run_pass(trigger="start")
    assert baseline is not None and baseline.outcome == "baseline" and baseline.calls == 1
    for title in ("one", "two"):
        emu.create_issue(OWNER, REPO, title=title, author="alice")
    for n in range(120):  # 120 comments: three pages of 50
        emu.create_comment(OWNER, REPO, 1 + n % 2, author="alice", body=f"note {n}")
    emu.add_labels(OWNER, REPO, 1, ["bug"], actor=BOT)
    before = len(emu.requests)
    done = await reconciler.run_pass(trigger="interval")
    assert done is not None and done.outcome == "ok", done
    made = len(emu.requests) - before
    pages = max(1, math.ceil(done.read_issues / PAGE_SIZE)) + max(1, math.ceil(done.read_comments / PAGE_SIZE))
    assert made == done.calls == 1 + pages, (made, done)
    assert done.read_comments == 120 and done.found["comment"] == 120 and done.found["issue"] >= 1, done
    rows = await DeliveryStore(db).list(limit=500)
    assert all(r.delivery_id.startswith("reconcile:") and r.status == "queued" for r in rows)
    assert sum(1 for r in rows if r.event == "issue_comment") == 120
    # The next pass reads the overlap again and inserts nothing new (the ids are refused as duplicates).
    again = await reconciler.run_pass(trigger="interval")
    assert again is not None and again.outcome == "ok" and sum(again.found.values()) == 0, again
    assert len(await DeliveryStore(db).list(limit=500)) == len(rows)


async def test_interval_zero_runs_the_start_pass_only_and_a_failed_read_keeps_the_watermark(
    world: tuple[LiveEmulator, Database],
) -> None:
    live, db = world
    first = _reconciler(live, db)
    await first.run_pass(trigger="start")
    mark = await ReconcileStore(db).watermark(f"{OWNER}/{REPO}")
    live.emulator.faults.fail("GET", "/repos/{owner}/{repo}/issues", status=503, times=None)
    reconciler = _reconciler(live, db, interval_s=0.0)
    await reconciler.start()
    await eventually(lambda: reconciler.status.last_error, "the start-up pass to fail")
    await asyncio.sleep(0.2)
    await reconciler.stop()
    passes = await ReconcileStore(db).last_pass(f"{OWNER}/{REPO}")
    assert passes is not None and passes.outcome == "error" and "503" in (passes.error or ""), passes
    assert await ReconcileStore(db).watermark(f"{OWNER}/{REPO}") == mark
    async with db.reader.execute("SELECT COUNT(*) FROM reconcile_passes WHERE trigger = 'interval'") as cur:
        row = await cur.fetchone()
    assert row is not None and row[0] == 0  # the timer is off: only the start-up pass ran
    assert reconciler.status.errors_total == 1


async def test_the_service_runs_catch_up_at_start_and_one_auto_allocation_after_each_pass(
    tmp_path: Path, start: Started
) -> None:
    """An expired lease frees its author at the next pass: each pass ends with one auto-allocation (``catch_up``)."""
    async with open_world(tmp_path, start, roster={"controller-bot": ["controller"], "author-1": ["author"]}) as w:
        reconciler = w.service.reconciler
        assert reconciler is not None
        await eventually(lambda: reconciler.status.last_success_at, "the start-up pass")
        number = await w.open_issue("alice", "Caught up while nobody labelled it")
        w.live.emulator.add_labels(OWNER, REPO, number, ["status:ready"], actor="alice")  # no webhook for it
        done = await reconciler.run_pass(trigger="interval")
        assert done is not None and done.outcome == "ok" and done.found.get("issue") == 1, done
        async with w.service.db.reader.execute("SELECT trigger FROM auto_allocations ORDER BY id") as cur:
            triggers = [row[0] for row in await cur.fetchall()]
        assert triggers.count("catch_up") == 1, triggers  # this pass (the first start only set the watermark)
        body = (await w.client.get("/readyz")).status
        assert body == 200
        check = (await (await w.client.get("/readyz")).json())["checks"]["reconcile"]
        assert check["last_pass"]["trigger"] == "interval" and check["found"]["issue"] >= 1, check
