"""The outbox sender: posts each intended mutation exactly once, reads it back, and records the proof."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from bot.config_sections import OutboxConfig
from bot.core import backoff
from bot.core.evidence import find_marker
from bot.gitea import Comment, GiteaError, GiteaNotFound, GiteaUnavailable, Issue, Label, refusal_text
from bot.metrics import Metrics
from bot.tasks import cancel_and_wait
from state.db import utcnow
from state.outbox import OutboxEntry, OutboxStore

log = logging.getLogger("foreman.outbox")

#: Called with the entry and its result after the entry was verified and recorded ``done``.
CompletionHook = Callable[[OutboxEntry, dict[str, Any]], Awaitable[None]]
#: Called with the entry as stored after it ended ``verification_failed`` or ``parked`` (until an operator retries).
FailureHook = Callable[[OutboxEntry], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class OutboxHooks:
    """Who learns what the sender settled: passed in by the composition root (the sender knows no feature)."""

    on_complete: CompletionHook | None = None
    on_failure: FailureHook | None = None


class OutboxGitea(Protocol):
    """The Gitea calls the sender makes, writes and their read-backs (bot.gitea.GiteaClient provides them)."""

    owner: str

    async def list_issue_comments(self, number: int) -> list[Comment]: ...

    async def create_comment(self, number: int, body: str) -> Comment: ...

    async def get_comment(self, comment_id: int) -> Comment: ...

    async def edit_comment(self, comment_id: int, body: str) -> Comment: ...

    async def get_issue(self, number: int) -> Issue: ...

    async def list_issue_labels(self, number: int) -> list[Label]: ...

    async def add_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> list[Label]: ...

    async def remove_label(self, number: int, label_id: int) -> None: ...

    async def list_repo_labels(self) -> list[Label]: ...

    async def list_org_labels(self, org: str) -> list[Label]: ...

    async def set_assignees(self, number: int, logins: Sequence[str]) -> Issue: ...


class VerificationMismatch(Exception):
    """What Gitea holds after the write differs from what was intended."""

    def __init__(self, message: str, *, observed: Any, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.observed = observed
        self.result = result


@dataclass(frozen=True, slots=True)
class _Sent:
    result: dict[str, Any]


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _labels_result(issue: Issue) -> dict[str, Any]:
    """What a labels entry leaves behind: the issue's label set as read back (names, and ids with names),
    as of the issue's ``updated_at``, so that a consumer can store it as the issue's label snapshot."""
    labels = sorted(issue.labels, key=lambda label: (label.name, label.id))
    return {
        "labels": sorted({label.name for label in labels}),
        "issue_labels": [{"id": label.id, "name": label.name} for label in labels],
        "issue_updated_at": _iso(issue.updated_at),
        "issue_open": issue.state != "closed",
    }


def _comment_result(comment: Comment) -> dict[str, Any]:
    """The read-back comment's author and times (Gitea's), for consumers that record the comment."""
    return {
        "author": comment.user.login,
        "created_at": _iso(comment.created_at),
        "updated_at": _iso(comment.updated_at),
    }


class OutboxSender:
    """Sends due outbox heads: issues in parallel, one issue's entries strictly in order.

    Each issue with a due head gets one chain: its head is sent, and as soon as it is ``done`` (and its hook ran)
    the issue's next entry follows in the same chain, without waiting for other issues or the next pass. A new
    entry wakes the sender (``wakeup``); it also polls every ``poll_interval_s``.

    ``on_complete`` runs after an entry was verified and recorded ``done``; ``on_failure`` after an entry
    was recorded ``verification_failed`` or ``parked``. A hook that raises is logged; it never changes what
    was recorded (the entry stays done). Hooks run in the sender's task, once per settled entry; a hook a crash
    kept from running after its settle runs on the next pass (``recover_hooks``), so hooks must be idempotent.
    """

    def __init__(
        self,
        store: OutboxStore,
        gitea: OutboxGitea,
        config: OutboxConfig,
        metrics: Metrics,
        *,
        on_complete: CompletionHook | None = None,
        on_failure: FailureHook | None = None,
        clients: Callable[[str], OutboxGitea | None] | None = None,
    ) -> None:
        self.store = store
        self.gitea = gitea
        #: The client of an entry's repository (many repositories in one process); None: not served here.
        #: Without it every entry goes through ``gitea``.
        self.clients = clients
        self.config = config
        self.metrics = metrics
        self.on_complete = on_complete
        self.on_failure = on_failure
        self.sender_id = f"outbox-{uuid.uuid4().hex[:12]}"
        self.wakeup = asyncio.Event()
        #: Chains running right now (an entry claimed, sending, settling or running a hook, or the next looked up).
        self.in_flight = 0
        self._handling: set[int] = set()
        #: The issues (repository, number) a chain of this sender is sending: one chain per issue at a time.
        self._issues: set[tuple[str, int]] = set()
        self._chains: dict[asyncio.Task[int], tuple[str, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._depth_at = -1.0e9
        #: Label ids by name, per repository key, as the last listing found them (``_label_ids``).
        self._label_id_cache: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        self._stopping = False  # a stopped sender may be started again
        self._task = asyncio.create_task(self._loop(), name=self.sender_id)

    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._task, *self._chains)

    async def _loop(self) -> None:
        while not self._stopping:
            # Cleared before looking: an entry committed while this pass reads is never missed (its wake-up stays).
            self.wakeup.clear()
            try:
                await self._dispatch()
            except Exception:
                log.exception("outbox pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=self.config.poll_interval_s)

    async def _dispatch(self) -> int:
        """Start a chain for every due head whose issue has none running, up to ``concurrency`` chains."""
        room = self.config.concurrency - len(self._chains)
        if room <= 0:
            return 0  # every chain is busy: the first to end wakes the sender
        recovered = await self.recover_hooks()
        started = 0
        for head in await self.store.due_heads(claim_ttl_s=self.config.claim_ttl_s, limit=room + len(self._issues)):
            issue = (head.repo, head.issue_number)
            if issue in self._issues or started >= room:
                continue
            self._issues.add(issue)
            task = asyncio.create_task(self._chain(head), name=f"{self.sender_id}-{head.issue_number}")
            self._chains[task] = issue
            task.add_done_callback(self._chain_done)
            started += 1
        await self._depth()
        return started + recovered

    def _chain_done(self, task: asyncio.Task[int]) -> None:
        self._issues.discard(self._chains.pop(task))  # also for a chain cancelled before it ever ran
        if task.cancelled():
            return
        failure = task.exception()
        if failure is not None:
            # As a failed pass: looked at again at the next poll, never at once (a failure that repeats, such as
            # a database that cannot be read, must not spin).
            log.error("outbox chain failed", exc_info=failure)
            return
        self.wakeup.set()  # a slot is free: look again

    async def _depth(self) -> None:
        """The outbox depth gauge, at most once a second (it counts every row; /metrics refreshes it too)."""
        moment = time.monotonic()
        if moment - self._depth_at < 1.0:
            return
        self._depth_at = moment
        for status, count in (await self.store.counts()).items():
            self.metrics.outbox_depth.labels(status).set(count)

    async def run_once(self) -> int:
        """One pass: every due head (one per issue) is sent concurrently, each issue's following entries after it
        in order. Returns how many entries were handled."""
        recovered = await self.recover_hooks()
        heads = await self.store.due_heads(claim_ttl_s=self.config.claim_ttl_s, limit=self.config.concurrency)
        heads = [head for head in heads if (head.repo, head.issue_number) not in self._issues]
        mine = {(head.repo, head.issue_number) for head in heads}
        self._issues |= mine
        try:
            handled = await asyncio.gather(*(self._chain(head) for head in heads))
        finally:
            self._issues -= mine
        self._depth_at = -1.0e9
        await self._depth()
        return sum(handled) + recovered

    async def _chain(self, head: OutboxEntry) -> int:
        """Send ``head``, then each next entry of its issue while the one before ended ``done``. The caller
        holds the issue in ``_issues`` until the chain ended (no second chain of it starts meanwhile). Returns how
        many entries were handled."""
        handled = 0
        self.in_flight += 1
        try:
            entry: OutboxEntry | None = head
            while entry is not None:
                self._handling.add(entry.id)
                try:
                    done = await self._handle_claimed(entry)
                finally:
                    self._handling.discard(entry.id)
                handled += 1
                if not done or self._stopping:
                    break
                entry = await self.store.next_head(entry.repo, entry.issue_number)
        finally:
            self.in_flight -= 1
        return handled

    async def _handle_claimed(self, head: OutboxEntry) -> bool:
        """Claim, send, verify and settle one entry; True when it ended ``done`` here (its issue's next may go)."""
        entry = await self.store.claim(head, self.sender_id)
        if entry is None:
            return False
        started = time.perf_counter()
        try:
            sent = await self.send(entry)
        except VerificationMismatch as exc:
            self.metrics.outbox_verification_failures.labels(entry.kind).inc()
            log.error("outbox %s (%s #%d) verification failed: %s", entry.key, entry.kind, entry.issue_number, exc)
            if await self.store.verification_failed(entry, error=str(exc), observed=exc.observed, result=exc.result):
                await self._failed(entry)
        except GiteaUnavailable as exc:
            await self._retry_or_park(entry, f"{type(exc).__name__}: {exc}")
        except GiteaError as exc:
            # A 4xx will not change by retrying: park it (it holds back only its own issue).
            # GiteaIssueGone and GiteaUnassignable (Gitea's 500s that retrying cannot change) land here too.
            log.error("outbox %s parked: %s", entry.key, exc)
            if await self.store.park(entry, error=refusal_text(exc)):
                await self._failed(entry)
        else:
            if not await self.store.complete(entry, sent.result):
                return False  # another sender took the entry over (stale claim) and settles it
            self.metrics.outbox_send_seconds.labels(entry.kind).observe(time.perf_counter() - started)
            await self._completed(entry, sent.result)
            return True
        return False

    async def _completed(self, entry: OutboxEntry, result: dict[str, Any]) -> None:
        error: str | None = None
        if self.on_complete is not None:
            try:
                await self.on_complete(entry, result)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.exception("outbox %s: the completion hook failed (the entry stays done)", entry.key)
        await self.store.mark_hooked(entry.id, error=error)

    async def _failed(self, entry: OutboxEntry) -> None:
        error: str | None = None
        if self.on_failure is not None:
            try:
                settled = await self.store.get(entry.id)
                if settled is not None:
                    await self.on_failure(settled)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.exception("outbox %s: the failure hook failed", entry.key)
        await self.store.mark_hooked(entry.id, error=error)

    async def recover_hooks(self) -> int:
        """Run the hooks of entries settled by a process that died before running them (hooks are idempotent)."""
        recovered = 0
        for entry in await self.store.unhooked():
            if entry.id in self._handling:
                continue  # settled a moment ago by this sender; its own call runs the hook
            log.warning("outbox %s: running the hook a previous process did not run", entry.key)
            if entry.status == "done":
                await self._completed(entry, entry.result or {})
            else:
                await self._failed(entry)
            recovered += 1
        return recovered

    async def _retry_or_park(self, entry: OutboxEntry, error: str) -> None:
        if entry.attempts >= self.config.max_attempts:
            log.error("outbox %s parked after %d attempts: %s", entry.key, entry.attempts, error)
            if await self.store.park(entry, error=error):
                await self._failed(entry)
            return
        self.metrics.outbox_retries.labels(entry.kind).inc()
        config = self.config
        delay = backoff.delay(entry.attempts, base=config.backoff_base_s, cap=config.backoff_max_s, jitter="full")
        await self.store.retry_later(entry, error=error, next_attempt_at=utcnow() + timedelta(seconds=delay))

    # --- per kind: write, then read back and compare ------------------------------------------------------------------
    def client_of(self, entry: OutboxEntry) -> OutboxGitea:
        """The Gitea client of the entry's repository; GiteaError (the entry is parked) when this process does not
        serve it."""
        if self.clients is None:
            return self.gitea
        client = self.clients(entry.repo)
        if client is None:
            raise GiteaError(f"repository {entry.repo!r} is not served by this process (not in [[repositories]]): "
                             "serve it again and `foreman outbox retry` the entry, or leave it parked")
        return client

    async def send(self, entry: OutboxEntry) -> _Sent:
        gitea = self.client_of(entry)
        if entry.kind == "comment":
            return await self._comment(gitea, entry)
        if entry.kind == "edit_comment":
            comment_id = int(entry.payload["comment_id"])
            await gitea.edit_comment(comment_id, entry.payload["body"])
            return await self._verify_comment(gitea, entry, comment_id, {"comment_id": comment_id, "adopted": False})
        if entry.kind == "labels":
            try:
                return await self._labels(gitea, entry)
            except BaseException:
                self._label_id_cache.pop(entry.repo, None)  # the next entry reads the ids again
                raise
        return await self._assignees(gitea, entry)

    async def _comment(self, gitea: OutboxGitea, entry: OutboxEntry) -> _Sent:
        """Adopt a comment that already carries this key's marker (an earlier attempt whose answer was lost,
        or a crash before the commit); otherwise post it. Either way, verify it by reading it back."""
        # Only an earlier attempt can have posted this key's comment: the first send of an entry (its first claim,
        # nothing recorded against it) posts without listing the issue's comments.
        first_send = entry.attempts == 1 and entry.last_error is None and entry.result is None
        comments = [] if first_send else await gitea.list_issue_comments(entry.issue_number)
        mine = [c for c in comments if find_marker(c.body) == entry.key]
        if mine:
            comment_id, adopted = mine[0].id, True
            if len(mine) > 1:
                log.warning("outbox %s: %d comments carry this marker; adopting the oldest", entry.key, len(mine))
        else:
            comment_id, adopted = (await gitea.create_comment(entry.issue_number, entry.payload["body"])).id, False
        result = {"comment_id": comment_id, "adopted": adopted, "duplicates": [c.id for c in mine[1:]]}
        return await self._verify_comment(gitea, entry, comment_id, result)

    async def _verify_comment(
        self, gitea: OutboxGitea, entry: OutboxEntry, comment_id: int, result: dict[str, Any]
    ) -> _Sent:
        intended = entry.payload["body"]
        for attempt in range(1, self.config.verify_attempts + 1):
            comment = await gitea.get_comment(comment_id)
            observed = comment.body
            if observed == intended:
                return _Sent({**result, **_comment_result(comment), "verified": True, "verify_attempts": attempt})
            if attempt < self.config.verify_attempts:
                log.warning("outbox %s: comment %d differs from the intent; writing it again", entry.key, comment_id)
                await gitea.edit_comment(comment_id, intended)
        raise VerificationMismatch(
            f"comment {comment_id} does not hold the intended body after {self.config.verify_attempts} checks",
            observed={"intended": intended, "observed": observed},
            result=result,
        )

    async def _labels(self, gitea: OutboxGitea, entry: OutboxEntry) -> _Sent:
        """Add, then remove by id (deltas: labels someone else set meanwhile stay), then read the issue back.

        Removal waits until every added label is on the issue: Gitea ignores an unknown label name, and
        removing the old label anyway would leave the issue with neither (a status label swap, for one).
        """
        number = entry.issue_number
        add = set(entry.payload.get("add", []))
        remove = set(entry.payload.get("remove", []))
        result: dict[str, Any] = {"labels": []}
        for attempt in range(self.config.verify_attempts):
            current = {label.name: label.id for label in await gitea.list_issue_labels(number)}
            missing = sorted(add - set(current))
            if missing:
                # Ids known from an earlier entry serve the first try; a try that does not verify reads them again.
                ids = await self._label_ids(gitea, entry.repo, missing, fresh=attempt > 0)
                refs: list[int] | list[str] = [ids[name] for name in missing if name in ids]
                # Unresolvable names are sent as names (Gitea ignores them; verification names the gap).
                if len(refs) < len(missing):
                    refs = missing
                current = {label.name: label.id for label in await gitea.add_labels(number, refs)}
            if add <= set(current):
                for name in sorted(remove & set(current)):
                    await gitea.remove_label(number, current[name])
            result = _labels_result(await gitea.get_issue(number))
            names = set(result["labels"])
            if add <= names and not (remove & names):
                return _Sent({**result, "verified": True})
        raise VerificationMismatch(
            "the issue's labels do not match the intended change (an unknown label name is ignored by Gitea)",
            observed={"intended_add": sorted(add), "intended_remove": sorted(remove), "observed": result["labels"]},
            result=result,
        )

    async def _label_ids(self, gitea: OutboxGitea, repo: str, names: list[str], *, fresh: bool) -> dict[str, int]:
        """Label ids by name: the repository's labels, then (for names still missing) the owner org's.

        Adding by id works for org labels in every version; by name, Gitea 1.22 resolves repository labels
        only (routers/api/v1/repo/issue_label.go prepareForReplaceOrAdd), so a sync by name would never
        verify where the ``status:*`` labels are org labels.

        The ids found are kept per repository (a label's id does not change while it exists) and serve the next
        entries without a listing, unless ``fresh``: the caller's change did not verify (a label deleted and
        made again has a new id) or the send failed (``_labels`` forgets the repository's ids then)."""
        known = self._label_id_cache.setdefault(repo, {})
        if not fresh and all(name in known for name in names):
            return {name: known[name] for name in names}
        found = await self._read_label_ids(gitea, names)
        known.clear()
        known.update(found)
        return {name: found[name] for name in names if name in found}

    async def _read_label_ids(self, gitea: OutboxGitea, names: list[str]) -> dict[str, int]:
        """Every label of the repository (kept for the next entries), and those of ``names`` only the owner org has."""
        found = {label.name: label.id for label in await gitea.list_repo_labels()}
        if set(names) - set(found):
            try:
                org_labels = await gitea.list_org_labels(gitea.owner)
            except GiteaNotFound:
                org_labels = []  # a user-owned repository
            for label in org_labels:
                if label.name in names:
                    found.setdefault(label.name, label.id)
        return found

    async def _assignees(self, gitea: OutboxGitea, entry: OutboxEntry) -> _Sent:
        wanted = {login.lower() for login in entry.payload["assignees"]}
        observed: set[str] = set()
        for _ in range(self.config.verify_attempts):
            # Add first, then remove: a login Gitea cannot assign never costs the others (set_assignees).
            await gitea.set_assignees(entry.issue_number, sorted(entry.payload["assignees"]))
            issue = await gitea.get_issue(entry.issue_number)
            observed = {user.login.lower() for user in issue.assignees}
            if observed == wanted:
                return _Sent({"assignees": sorted(observed), "verified": True})
        raise VerificationMismatch(
            "the issue's assignees do not match the intended set",
            observed={"intended": sorted(wanted), "observed": sorted(observed)},
            result={"assignees": sorted(observed)},
        )
