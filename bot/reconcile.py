"""Catch-up: what changed in Gitea while no webhook reached the service is read back and fed through the inbox."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from bot.core import reconcile as core
from bot.core.intake import Delivery
from bot.core.issue_state import repo_key
from bot.metrics import Metrics
from bot.tasks import cancel_and_wait
from state.db import Database, to_db_time, utcnow
from state.deliveries import DeliveryStore
from state.issues import IssueStore
from state.reconcile import ReconcilePass, ReconcileStore
from state.teardowns import TeardownStore

log = logging.getLogger("foreman.reconcile")

PAGE_SIZE = 50
#: Heartbeat period while running (the down window at the next start is measured from the last beat).
HEARTBEAT_S = 15.0
#: How long a pass waits for its issue deliveries to settle before feeding the comments.
ISSUE_SETTLE_S = 30.0


class _Item(Protocol):
    @property
    def raw(self) -> Mapping[str, Any]: ...


class ReconcileGitea(Protocol):
    """The reads catch-up makes (bot.gitea.GiteaClient provides them)."""

    async def server_time(self) -> datetime | None: ...

    def iter_issues(self, *, state: Any = ..., labels: Sequence[str] = ..., type_: Any = ..., limit: int = ...,
                    since: str | None = ...) -> AsyncIterator[Any]: ...

    def iter_repo_comments(self, *, since: str | None = ..., limit: int = ...) -> AsyncIterator[Any]: ...

    async def get_issue(self, number: int) -> Any: ...


@dataclass
class ReconcileStatus:
    """What /readyz and /metrics show (this process's view; the passes are also in the database)."""

    started: bool = False
    running: bool = False
    last_pass: ReconcilePass | None = None
    last_success_at: float | None = None
    last_error: str | None = None
    errors_total: int = 0
    found_total: dict[str, int] = field(default_factory=dict)
    down_from: str | None = None
    down_seconds: float | None = None

    def to_dict(self, interval_s: float) -> dict[str, Any]:
        last = self.last_pass
        return {
            "ok": self.last_error is None,
            "interval_s": interval_s,
            "running": self.running,
            "last_success_at": datetime.fromtimestamp(self.last_success_at, UTC).isoformat()
            if self.last_success_at
            else None,
            "last_pass": last.to_dict() if last is not None else None,
            "watermark": last.watermark if last is not None and last.outcome in ("ok", "baseline") else self._mark,
            "last_error": self.last_error,
            "errors_total": self.errors_total,
            "found_total": sum(self.found_total.values()),
            "found": dict(self.found_total),
            "down_window": {"from": self.down_from, "seconds": self.down_seconds},
        }

    _mark: str | None = None


class Reconciler:
    """Runs the passes for the configured repository; one at a time (docs/operating.md "Catch-up").

    Gitea delivers each webhook once and never retries. A pass (at start, then every ``interval_s``) reads Gitea's
    clock, the issues and pull requests and the repository's comments updated since the watermark minus
    ``overlap_s`` (paged), and what the service holds; bot.core.reconcile plans synthetic deliveries that go into
    the inbox like webhooks, so the served-repository check, handler isolation, retries and the once-per-effect
    guards apply unchanged. Issue events are fed (and settled) before comment events, so a comment is handled
    against the labels it was written under. A read that fails ends the pass with the watermark where it was.
    After each pass ``after_pass`` runs (one auto-allocation, so an expired lease frees its author).
    """

    def __init__(
        self,
        *,
        db: Database,
        store: DeliveryStore,
        gitea: ReconcileGitea,
        owner: str,
        name: str,
        interval_s: float,
        overlap_s: float,
        metrics: Metrics,
        bot_login: Callable[[], str],
        wakeup: Callable[[], None],
        after_pass: Callable[[], Any] | None = None,
        settle_s: float = ISSUE_SETTLE_S,
    ) -> None:
        self.settle_s = settle_s
        self.db = db
        self.store = store
        self.gitea = gitea
        self.repo = repo_key(f"{owner}/{name}")  # the key every store files the repository under
        self.owner, self.name = owner, name
        self.interval_s = interval_s
        self.overlap_s = overlap_s
        self.metrics = metrics
        self.bot_login = bot_login
        self.wakeup = wakeup
        self.after_pass = after_pass
        self.passes = ReconcileStore(db)
        self.status = ReconcileStatus()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    # --- lifecycle ----------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Log the down window, then run the start-up pass and the timer in the background."""
        last_alive = await self.passes.last_alive(self.repo)
        window = core.down_window(last_alive, utcnow())
        self.status.down_from = to_db_time(window.since) if window.since else None
        self.status.down_seconds = window.seconds
        self.status._mark = await self.passes.watermark(self.repo)
        if window.since is not None:
            self.metrics.reconcile_down_seconds.set(window.seconds or 0.0)
        log.warning("catch-up: %s", window.describe()) if window.since else log.info("catch-up: %s",
                                                                                    window.describe())
        await self.passes.beat(self.repo)
        self.status.started = True
        self._tasks = [
            asyncio.create_task(self._timer(), name="reconcile-timer"),
            asyncio.create_task(self._heartbeat(), name="reconcile-heartbeat"),
        ]

    async def stop(self) -> None:
        self._stopping.set()
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    async def _heartbeat(self) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.passes.beat(self.repo)
            except Exception:
                log.warning("catch-up heartbeat failed", exc_info=True)

    async def _timer(self) -> None:
        trigger = "start"
        while not self._stopping.is_set():
            try:
                await self.run_pass(trigger=trigger)
            except asyncio.CancelledError:
                raise
            except Exception:  # run_pass records its own failures; this is the net behind it
                log.exception("catch-up pass failed")
            if self.interval_s <= 0:
                return  # the timer is off; the start-up pass ran
            trigger = "interval"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self.interval_s)

    # --- one pass -----------------------------------------------------------------------------------------------------
    async def run_pass(self, *, trigger: str) -> ReconcilePass | None:
        async with self._lock:
            self.status.running = True
            try:
                return await self._pass(trigger)
            finally:
                self.status.running = False

    async def _pass(self, trigger: str) -> ReconcilePass | None:
        started = time.perf_counter()
        watermark = await self.passes.watermark(self.repo)
        since = core.since_for(watermark, self.overlap_s) if watermark is not None else None
        pass_id = await self.passes.start_pass(
            self.repo, trigger=trigger, since=since, down_from=self.status.down_from,
            down_seconds=self.status.down_seconds,
        )
        calls, read_issues, read_comments = 0, 0, 0
        found: dict[str, int] = {}
        try:
            calls += 1
            server_now = await self.gitea.server_time() or utcnow()
            now_mark = to_db_time(server_now)
            if watermark is None:
                # First start on this database: nothing before now is replayed (old commands stay old).
                await self._finish(pass_id, "baseline", now_mark, calls, 0, 0, {}, None)
                log.info("catch-up: first pass on this database; watermark set to Gitea's clock %s", now_mark)
                # No auto-allocation here: nothing was caught up, and the webhooks trigger it as before.
                return await self._done(pass_id)
            issues: list[Mapping[str, Any]] = []
            async for issue in self.gitea.iter_issues(state="all", type_=None, limit=PAGE_SIZE, since=since):
                issues.append(issue.raw)
            read_issues = len(issues)
            calls += max(1, -(-read_issues // PAGE_SIZE))
            comments: list[Mapping[str, Any]] = []
            async for comment in self.gitea.iter_repo_comments(since=since, limit=PAGE_SIZE):
                comments.append(comment.raw)
            read_comments = len(comments)
            calls += max(1, -(-read_comments // PAGE_SIZE))
            known = await self._known(issues, comments)
            repository = {"full_name": self.repo, "name": self.name, "owner": {"login": self.owner}}
            plan = core.plan(repository=repository, issues=issues, comments=comments, known=known,
                             bot_login=self.bot_login(), pass_id=pass_id)
            if plan.missing_issues:
                extra: dict[int, Mapping[str, Any]] = {}
                for number in plan.missing_issues:
                    calls += 1
                    extra[number] = (await self.gitea.get_issue(number)).raw
                plan = core.plan(repository=repository, issues=issues, comments=comments, known=known,
                                 bot_login=self.bot_login(), pass_id=pass_id, extra_issues=extra)
            fed = await self._feed(plan.issues, pass_id)
            found["issue"] = len(fed)
            if fed and plan.comments:
                await self._settled(fed)
            found["comment"] = len(await self._feed(plan.comments, pass_id))
            mark = core.next_watermark(watermark, now_mark, None)
            await self._finish(pass_id, "ok", mark, calls, read_issues, read_comments, found, None)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._finish(pass_id, "error", None, calls, read_issues, read_comments, found, "cancelled")
            raise
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"[:1000]
            self.status.last_error = message
            self.status.errors_total += 1
            self.metrics.reconcile_errors.inc()
            self.metrics.reconcile_repository_errors.labels(self.repo).inc()
            log.error("catch-up pass %d could not read Gitea (%s); the watermark stays, the next pass in %.0fs "
                      "reads the same window", pass_id, message, self.interval_s)
            await self._finish(pass_id, "error", None, calls, read_issues, read_comments, found, message)
            return await self._done(pass_id, failed=True)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
            self.metrics.reconcile_calls.inc(calls)
        total = sum(found.values())
        (log.warning if total else log.info)(
            "catch-up pass %d: read %d issues and %d comments since %s in %d API calls; %d issue and %d comment "
            "event(s) no webhook had brought", pass_id, read_issues, read_comments, since, calls,
            found.get("issue", 0), found.get("comment", 0),
        )
        done = await self._done(pass_id)
        await self._after_pass()
        return done

    async def _after_pass(self) -> None:
        """Once per successful pass (the service: one auto-allocation, trigger ``catch_up``)."""
        if self.after_pass is None:
            return
        try:
            await self.after_pass()
        except Exception:
            log.exception("auto-allocation after catch-up failed (the next trigger runs it)")

    async def _finish(self, pass_id: int, outcome: str, mark: str | None, calls: int, read_issues: int,
                      read_comments: int, found: Mapping[str, int], error: str | None) -> None:
        await self.passes.finish_pass(pass_id, outcome=outcome, watermark=mark, calls=calls, read_issues=read_issues,
                                      read_comments=read_comments, found=found, error=error)

    async def _done(self, pass_id: int, *, failed: bool = False) -> ReconcilePass | None:
        last = await self.passes.last_pass(self.repo)
        self.status.last_pass = last
        if not failed and last is not None:
            self.status.last_error = None
            self.status.last_success_at = time.time()
            self.status._mark = last.watermark
            self.metrics.reconcile_last_success.set(self.status.last_success_at)
            self.metrics.reconcile_repository_last_success.labels(self.repo).set(self.status.last_success_at)
            for kind, count in last.found.items():
                self.status.found_total[kind] = self.status.found_total.get(kind, 0) + count
                self.metrics.reconcile_found.labels(kind).inc(count)
                self.metrics.reconcile_repository_found.labels(self.repo, kind).inc(count)
        with contextlib.suppress(Exception):
            await self.passes.beat(self.repo)
        return last

    async def _known(self, issues: Sequence[Mapping[str, Any]], comments: Sequence[Mapping[str, Any]]) -> core.Known:
        store = IssueStore(self.db)
        known_issues: dict[int, core.KnownIssue] = {}
        for position, issue in enumerate(issues):
            if issue.get("pull_request") is not None:
                continue
            number = int(issue["number"])
            snapshot = await store.snapshot(self.repo, number)
            if snapshot is not None:
                labels = None if snapshot.labels is None else frozenset(snapshot.label_names)
                known_issues[number] = core.KnownIssue(labels, snapshot.is_open)
            if position % 100 == 99:
                await asyncio.sleep(0)
        ids = [int(c["id"]) for c in comments]
        return core.Known(
            issues=known_issues,
            comments=await self.passes.comment_revisions(self.repo, ids),
            claimed=frozenset(await self.passes.claimed_comments(self.repo, ids)),
            torn_down=await TeardownStore(self.db).torn_down_pulls(self.repo),
        )

    async def _feed(self, planned: Sequence[core.Synthetic], pass_id: int) -> list[str]:
        """Insert the synthetic deliveries (one transaction per 200); the ids that were new to the inbox."""
        queued: list[str] = []
        for start in range(0, len(planned), 200):
            batch = []
            for item in planned[start : start + 200]:
                body = json.dumps(item.payload, sort_keys=True, separators=(",", ":")).encode()
                headers = {
                    "X-Gitea-Event": item.event,
                    "X-Gitea-Event-Type": _event_type(item),
                    "X-Gitea-Delivery": item.delivery_id,
                    core.MARKER_HEADER: str(pass_id),
                }
                batch.append((
                    Delivery(
                        delivery_id=item.delivery_id,
                        event=item.event,
                        event_type=_event_type(item),
                        action=item.action,
                        sender_login=item.sender_login or None,
                        body=body,
                        body_sha256=hashlib.sha256(body).hexdigest(),
                        headers=headers,
                        payload=item.payload,
                    ),
                    False,
                ))
            results = await self.store.insert_batch(batch)
            new = [item for item, result in zip(planned[start : start + 200], results, strict=True)
                   if result.outcome == "queued"]
            for item in new:
                log.info("catch-up: %s %s/%s queued (%s)", item.delivery_id, item.event, item.action, item.reason)
            queued += [item.delivery_id for item in new]
            if new:
                self.wakeup()
            await asyncio.sleep(0)
        return queued

    async def _settled(self, delivery_ids: Sequence[str]) -> None:
        """Wait (bounded) until the given deliveries left the queue, so comments see their issue's labels."""
        deadline = time.monotonic() + self.settle_s
        pending = list(delivery_ids)
        while pending and time.monotonic() < deadline and not self._stopping.is_set():
            still = []
            for delivery_id in pending:
                row = await self.store.get(delivery_id)
                if row is not None and row.status in ("queued", "processing") and row.attempts <= 1:
                    still.append(delivery_id)
            pending = still
            if pending:
                await asyncio.sleep(0.05)


def _event_type(item: core.Synthetic) -> str:
    if item.kind == "comment":
        return "issue_comment"
    if item.kind == "pull":
        return "pull_request"
    return "issue_label" if item.action in ("label_updated", "label_cleared") else "issues"
