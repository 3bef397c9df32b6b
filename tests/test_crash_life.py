"""A real `foreman serve` SIGKILLed at seeded points during whole lives, restarted, the agents' calls re-driven.

Four issues live concurrently for three authors: a maintainer labels each `status:ready` (auto-allocation and the
bootstrap run in the service), its author locks, writes, publishes and opens the pull request, the review queue
hands the review to the reviewer, who approves, the merge queue hands the PR to the merger, who merges, and the
`pull_request` closed webhook tears the issue down in the service. The
fourth issue waits until a pull request's opening frees its author (the hand-over's queued auto-allocation, or a
later trigger, gives that author the next issue). The agents' calls go
through the one door from this process over the service's database, as `foreman mcp` does beside `foreman serve`.
The service is SIGKILLed at seeded points (after a publish, a PR's opening, the review queue's lease, a verdict, a
merge, and inside a teardown; a second test kills it inside the queue's own merge, ``[merge] by = "foreman"``),
left down for a moment (the webhooks Gitea sends meanwhile are lost, then replayed as the operator guide says),
started again, and the agent re-drives its last call with the same idempotency key. Then every invariant of
``bot.invariants`` holds, and: one PR per issue, one merge each, one teardown record per issue, no worktree left,
each issue's status label matching its final Canonical Issue State (`status:done`).

A kill between Gitea's create_pull and the PR's record cannot land here (the agents' door runs in this process):
tests/test_crash_open_pr.py kills the service there, through the `/open-pr` command.

Seeded: the kill plan comes from ``FOREMAN_CRASH_SEED=<n>`` (``DEFAULT_SEED`` without it); the seed is printed and
named in every failure.
Process timing stays real, so two runs of one seed may kill at different instants (never different points).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot import invariants
from bot.config import load_settings
from bot.config_writer import write_config
from bot.core.canonical import parse_comment
from bot.core.teardown import closing_issue
from bot.mcp_server import open_runtime
from bot.verbs.runtime import VerbResult, VerbRuntime, caller_for
from state.journal import JournalStore
from state.leases import LeaseStore
from state.teardowns import TeardownStore
from tests.gitea_fixtures import BOT, OWNER, REPO, LiveEmulator, live_emulator, seed_foreman
from tests.serve_support import ServeProcess
from tests.support import HANG_S, SECRET, SLOW_HANG_S, serve_config
from tests.test_crash_burst import Burst, scratch  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.process, pytest.mark.slow]

AUTHORS = ("author-1", "author-2", "author-3")
CONTROLLER, REVIEWER, MERGER = "controller-bot", "reviewer-1", "merger-1"
REVIEWER_2 = "reviewer-2"
ROSTER = {CONTROLLER: ["controller"], **{a: ["author"] for a in AUTHORS}, REVIEWER: ["reviewer"],
          REVIEWER_2: ["reviewer"], MERGER: ["merger"]}
#: `main` is protected as a real team's would be: two approvals, and the CI's status must pass (issue 32).
PROTECTION: dict[str, Any] = {"required_approvals": 2, "enable_status_check": True,
                              "status_check_contexts": ["ci/build"]}
TOKENS = {login: f"tok-{login}-life" for login in ROSTER}
ISSUES = 4
#: The lives the kills are spread over (the first three; the fourth is the one that waits for a freed author).
KILLED_LIVES = 3
#: The points a kill may follow: the agent's call of that step answered (the service is sending its effects),
#: or, for the teardown, the service seen handling the PR's closed webhook after the merge.
POINTS = ("publish", "open_pr", "review_lease", "review", "merge", "teardown")
FULL_NAME = f"{OWNER}/{REPO}"
#: The seed of a plain run (it spreads the five kills over all three lives); any other through FOREMAN_CRASH_SEED.
DEFAULT_SEED = 9
#: Bounds that catch a hang, never a timing assertion: one step's wait, and all four lives. Each kill's restart is
#: a new Python process (imports, recovery, catch-up); on a loaded 2-core machine one took 15 s, and the fourth
#: issue waits through two of them before it is even leased.
STEP_S = HANG_S
LIVES_S = SLOW_HANG_S


@dataclass(frozen=True)
class Kill:
    issue: int  # 0-based index of the life
    point: str
    delay: float  # seconds after the point, before the SIGKILL
    down: float  # seconds the service stays down


def plan_kills(rng: random.Random) -> list[Kill]:
    """One kill at every point, each in a seeded life, after a seeded delay, for a seeded downtime."""
    return [Kill(rng.randrange(KILLED_LIVES), point, rng.uniform(0.0, 0.15), rng.uniform(0.1, 0.4)) for point in POINTS]


def _config(proc: ServeProcess, base_url: str, root: Path) -> dict[str, Any]:
    retries = {"concurrency": 4, "max_attempts": 20}
    return serve_config(proc.port, proc.db, base_url, root, {
        "worker": retries,
        "outbox": {**retries, "poll_interval_s": 0.1, "claim_ttl_s": 1.5, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
        "bootstrap": {"on_allocate": "run", "lock_wait_s": 10.0},
        "roster": ROSTER,
        "gitea": {"identity_tokens": TOKENS},
        # The catch-up finds what a kill kept from the service (a closed PR whose webhook was never stored).
        "reconcile": {"interval_s": 2.0},
    })


@dataclass
class Lives:
    """The driver: the emulator, the service process, the agents' door, the kill plan and what happened."""

    seed: int
    live: LiveEmulator
    proc: ServeProcess
    burst: Burst  # the crash burst's replay of lost deliveries and its settling
    runtime: VerbRuntime
    kills: list[Kill]
    done: list[str] = field(default_factory=list)  # the kills made, as "point#issue"
    redriven: dict[str, int] = field(default_factory=dict)
    pulls: dict[int, int] = field(default_factory=dict)  # issue -> its PR, once opened
    teardown_kills: list[str] = field(default_factory=list)  # what the teardown kill saw before it landed
    service_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def call(self, login: str, verb: str, **arguments: Any) -> VerbResult:
        return await self.runtime.call(verb, caller_for(self.runtime.settings, login, "mcp"), arguments)

    async def until_ok(self, login: str, verb: str, what: str, **arguments: Any) -> dict[str, Any]:
        """Call until the door answers ok: a refusal that waits on the service (a label not synced yet, a lease
        the service has not made) is called again, as an agent following ``exact_next_action`` would."""
        deadline = time.monotonic() + STEP_S
        while True:
            result = await self.call(login, verb, **arguments)
            if result.ok:
                return result.doc
            assert time.monotonic() < deadline, f"seed {self.seed}: {what}: {verb} kept refusing: {result.doc}"
            await asyncio.sleep(0.1)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], timeout: float = STEP_S,
                    number: int | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            if time.monotonic() >= deadline:
                raise AssertionError(f"seed {self.seed}: never {what}{await self._seen(number)}")
            await asyncio.sleep(0.1)

    async def _seen(self, number: int | None) -> str:
        """What a hang's message shows: the issue's leases and labels, and the service's last log lines."""
        if number is None:
            return ""
        history = await LeaseStore(self.runtime.db).history(FULL_NAME.lower(), number)
        labels = self.live.emulator.label_names(OWNER, REPO, number)
        tail = self.proc.stderr.read_text(errors="replace")[-4000:] if self.proc.stderr.exists() else ""
        live = [(x.issue_number, x.action, x.owner, x.status) for x in await LeaseStore(self.runtime.db).open_leases(
            FULL_NAME.lower())]
        return (f"\nleases: {[(x.action, x.owner, x.status, x.end_reason) for x in history]}\nlabels: {labels}"
                f"\nopen leases: {live}"
                f"\nservice stderr:\n{tail}")

    async def point(self, index: int, number: int, point: str) -> bool:
        """Kill the service if the plan says so at this point of this life; True when it did."""
        planned = [k for k in self.kills if (k.issue, k.point) == (index, point)]
        if not planned:
            return False
        kill = planned[0]
        async with self.service_lock:
            await asyncio.sleep(kill.delay)
            if point == "teardown":
                await self.until(f"busy with #{number}'s teardown", lambda: self._tearing_down(number),
                                 timeout=STEP_S)
            await self.proc.kill()
            self.done.append(f"{point}#{index}")
            await asyncio.sleep(kill.down)
            await self.proc.serve()
            await self.burst.replay_lost()
        return True

    async def _tearing_down(self, number: int) -> bool:
        """The service stored this issue's PR-closed delivery (it is queued or being handled) or recorded its
        teardown: the kill lands inside, or right after, this issue's teardown (what it saw is kept)."""
        pr = self.pulls[number]
        with sqlite3.connect(f"file:{self.proc.db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT status, body FROM deliveries WHERE event = 'pull_request'"
                                " AND action = 'closed'").fetchall()
        statuses = sorted(status for status, body in rows
                          if (json.loads(bytes(body)).get("pull_request") or {}).get("number") == pr)
        torn = await self.torn_down(number)
        if not torn and not any(status in ("queued", "processing") for status in statuses):
            return False
        self.teardown_kills.append(f"#{number}: closed delivery {statuses or 'not stored'}, teardown "
                                   f"{'recorded' if torn else 'not recorded'}")
        return True

    async def facts(self, root: Path) -> invariants.Facts:
        """What ``foreman invariants`` checks: the service's database, Gitea, the checkout, the acknowledged hooks."""
        return await invariants.gather(
            database=self.proc.db, client=self.live.client(), bot_login=BOT,
            checkout=root / "checkouts" / OWNER / REPO,
            acknowledged=[(d.delivery_id, hashlib.sha256(d.body).hexdigest())
                          for d in self.burst.hook_deliveries() if d.ok],
            require_bootstrap=True,
        )

    async def leased(self, number: int, owner: str, action: str) -> bool:
        """``owner`` holds the issue's live lease for ``action``: a queue handed it out."""
        lease = await LeaseStore(self.runtime.db).live_for_issue(FULL_NAME.lower(), number)
        return lease is not None and (lease.owner, lease.action) == (owner, action)

    async def reviewing(self, number: int, approvers: list[str]) -> bool:
        """A reviewer who has not approved the issue yet holds its review lease."""
        lease = await LeaseStore(self.runtime.db).live_for_issue(FULL_NAME.lower(), number)
        return lease is not None and lease.action == "review" and lease.owner not in approvers

    async def reviewer_of(self, number: int) -> str:
        lease = await LeaseStore(self.runtime.db).live_for_issue(FULL_NAME.lower(), number)
        return lease.owner if lease is not None else REVIEWER

    async def torn_down(self, number: int) -> bool:
        return bool(await TeardownStore(self.runtime.db).for_issue(FULL_NAME.lower(), number))

    async def redrive(self, label: str, first: dict[str, Any], login: str, verb: str, **arguments: Any) -> None:
        """After a kill at this point: the agent calls again with the same key, and gets the same answer."""
        again = await self.until_ok(login, verb, f"re-driving {label}", **arguments)
        self.redriven[label] = self.redriven.get(label, 0) + 1
        compared = [key for key in ("pull_request", "commit", "merge_commit_sha", "head_sha", "pull_number", "verdict")
                    if key in first]
        assert compared, f"seed {self.seed}: {label}: nothing to compare in {first}"
        for key in compared:
            assert again.get(key) == first[key], f"seed {self.seed}: {label} answered {again} after {first}"

    async def life(self, index: int, number: int) -> None:
        """One issue from `status:ready` to its teardown, as the four identities would drive it."""
        await self.burst.api("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        db = self.runtime.db

        async def bootstrapped() -> bool:
            lease = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
            registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
            return lease is not None and registration is not None and registration.lease_id == lease.lease_id

        deadline = time.monotonic() + STEP_S
        while True:  # an agent told "not leased to you" finds its work again (the lease may have moved on a restart)
            # A hang detector as long as all the lives': with every author busy, #N is leased only when another
            # issue's whole life (PR, review, merge, teardown) frees its author, minutes at load 15.
            await self.until(f"bootstrapped #{number}", bootstrapped, timeout=LIVES_S)
            lease = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
            registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
            if lease is None or registration is None:
                continue
            author = lease.owner
            locked = await self.call(author, "lock_issue", issue_number=number)
            if locked.ok:
                break
            assert time.monotonic() < deadline, f"seed {self.seed}: locking #{number} kept refusing: {locked.doc}"
            await asyncio.sleep(0.1)
        Path(registration.worktree_path, f"life-{number}.txt").write_text(f"the life of #{number}\n", encoding="utf-8")
        publish: dict[str, Any] = {"issue_number": number, "message": f"Live #{number}",
                                   "idempotency_key": f"publish-{number}"}
        published = await self.until_ok(author, "publish_worktree", f"publishing #{number}", **publish)
        if await self.point(index, number, "publish"):
            await self.redrive("publish", published, author, "publish_worktree", **publish)
        opening: dict[str, Any] = {"issue_number": number, "idempotency_key": f"open-{number}"}
        opened = await self.until_ok(author, "open_pull_request", f"opening #{number}'s PR", **opening)
        self.pulls[number] = int(opened["pull_request"])
        if await self.point(index, number, "open_pr"):
            await self.redrive("open_pr", opened, author, "open_pull_request", **opening)
        # The CI reports on the PR's head (its status webhook, or catch-up, runs the queues).
        emu = self.live.emulator
        head = emu.pull_of(emu.issue(OWNER, REPO, self.pulls[number])).head_sha()
        emu.set_commit_status(OWNER, REPO, head, context="ci/build", state="success", notify=True)
        verdict: dict[str, Any] = {"issue_number": number, "verdict": "approve"}
        # Nobody claims: the review queue hands the review to a reviewer (killed right after, at review_lease), then
        # the second approval the protection requires to the other one.
        approvers: list[str] = []
        for round_ in range(2):
            await self.until(f"#{number}'s review {round_ + 1} leased by the queue",
                             lambda: self.reviewing(number, approvers), number=number)
            if round_ == 0:
                await self.point(index, number, "review_lease")
            deadline = time.monotonic() + STEP_S
            while True:  # the queue hands the review again if its lease ended under the reviewer (after a restart)
                await self.until(f"#{number}'s review leased", lambda: self.reviewing(number, approvers),
                                 number=number)
                reviewer = await self.reviewer_of(number)
                review = await self.call(reviewer, "submit_review", **verdict)
                if review.ok:
                    approved = review.doc
                    break
                assert time.monotonic() < deadline, f"seed {self.seed}: approving #{number} kept refusing: {review.doc}"
                await asyncio.sleep(0.1)
            approvers.append(reviewer)
            if round_ == 0 and await self.point(index, number, "review"):
                await self.redrive("review", approved, reviewer, "submit_review", **verdict)
        assert sorted(approvers) == sorted((REVIEWER, REVIEWER_2)), (self.seed, number, approvers)
        await self.until(f"#{number}'s merge leased by the queue", lambda: self.leased(number, MERGER, "merge"),
                         number=number)
        merged = await self.until_ok(MERGER, "merge_pull_request", f"merging #{number}", issue_number=number)
        if await self.point(index, number, "merge"):
            await self.redrive("merge", merged, MERGER, "merge_pull_request", issue_number=number)
        await self.point(index, number, "teardown")
        await self.until(f"torn down #{number}", lambda: self.torn_down(number))


@asynccontextmanager
async def agents(config: Path) -> AsyncIterator[VerbRuntime]:
    """The agents' door over the service's database and Gitea (no outbox sender here: the service sends)."""
    async with open_runtime(load_settings(config)) as runtime:
        yield runtime


async def test_sigkill_during_whole_lives_ends_every_issue_once_and_consistent(scratch: Path) -> None:  # noqa: F811
    seed = int(os.environ.get("FOREMAN_CRASH_SEED") or DEFAULT_SEED)
    print(f"crash-life seed: {seed} (rerun with FOREMAN_CRASH_SEED={seed})")
    started = time.monotonic()
    async with live_emulator() as live:
        emu = live.emulator
        seed_foreman(emu, TOKENS, writers=ROSTER)
        emu.protect_branch(OWNER, REPO, "main", **PROTECTION)
        numbers = [emu.create_issue(OWNER, REPO, title=f"Whole life {i + 1}", author="alice").number
                   for i in range(ISSUES)]
        proc = ServeProcess(scratch)
        write_config(proc.config, _config(proc, live.base_url, scratch))
        hook_url = f"{proc.url}/webhook"
        emu.add_hook(OWNER, REPO, url=hook_url, secret=SECRET,
                     events=["issues", "issue_comment", "pull_request", "status"])
        kills = plan_kills(random.Random(seed))
        try:
            await proc.serve()
            async with agents(proc.config) as runtime:
                burst = Burst(seed, live, proc, hook_url)
                lives = Lives(seed, live, proc, burst, runtime, kills)
                await asyncio.wait_for(asyncio.gather(*(lives.life(i, n) for i, n in enumerate(numbers))), LIVES_S)
                await burst.replay_lost()
                await burst.settle()
                facts = await lives.facts(scratch)
                violations = invariants.check(facts)
                teardowns = {n: await TeardownStore(runtime.db).for_issue(FULL_NAME.lower(), n) for n in numbers}
                histories = {n: await LeaseStore(runtime.db).history(FULL_NAME.lower(), n) for n in numbers}
            assert await proc.terminate() == 0
        finally:
            await proc.stop()
        pulls = await live.client().list_pulls(state="all")
        summary = {"seed": seed, "seconds": round(time.monotonic() - started, 1), "kills": lives.done,
                   "redriven": lives.redriven, "pulls": len(pulls), "outbox": len(facts.db.outbox),
                   "teardown_kill": lives.teardown_kills}
        print("crash-life summary:", json.dumps(summary))
        tail = proc.stderr.read_text(errors="replace")[-3000:]
        assert not violations, (f"seed {seed}: {len(violations)} violation(s):\n"
                                + "\n".join(map(str, violations[:40])) + f"\n{summary}\nservice stderr:\n{tail}")
        assert sorted(closing_issue(body=p.body, title=p.title, head_ref=p.head_ref) or 0 for p in pulls) == numbers, (
            seed, [(p.number, p.title) for p in pulls])
        assert all(p.merged for p in pulls), seed
        merges = [r for r in emu.requests if r.method == "POST" and (r.route or "").endswith("/merge")]
        assert len(merges) == ISSUES, (seed, [(r.route, r.login) for r in merges])
        assert {n: [t.reason for t in found] for n, found in teardowns.items()} == {n: ["merged"] for n in numbers}
        branches = scratch / "checkouts" / OWNER / REPO / "branches"
        assert not branches.exists() or list(branches.iterdir()) == [], (seed, list(branches.iterdir()))
        assert len(lives.done) == len(kills), summary
        assert set(lives.redriven) == set(POINTS[:-1]) - {"review_lease"}, summary  # (no call to re-drive there)
        assert len(lives.teardown_kills) == 1, summary
        # The held label syncs hold across kills: each issue's status label is its final state's (done).
        for n in numbers:
            issue = emu.issue(OWNER, REPO, n)
            states = [s for c in issue.comments if (s := parse_comment(c.body).current) is not None]
            status = sorted(label for label in emu.label_names(OWNER, REPO, n) if label.startswith("status:"))
            assert states and states[-1].state == "done" and status == ["status:done"], (seed, n, status, states[-1:])
        ends = {n: [(x.action, x.owner, x.end_reason) for x in h] for n, h in histories.items()}
        # The last issue waited for an author another issue freed (that lease ended before this one began): a pull
        # request's opening, or a bootstrap a kill interrupted and whose resumption found the base moved on (a
        # stale pin is compensated, never rebased; the issue is leased again).
        waiting = next(lease for lease in histories[numbers[-1]] if lease.action == "implement")
        freed = [lease for n in numbers[:-1] for lease in histories[n]
                 if lease.owner == waiting.owner and _freeing(lease.end_reason)
                 and lease.ended_at is not None and lease.ended_at <= waiting.acquired_at]
        assert freed, (seed, waiting, ends)
        # No lease ended for any other reason: the start-up recovery once bootstrapped a live review lease (no
        # worktree), ended it `unworkable: invalid_state` and added `status:blocked` beside `status:review`.
        assert not [end for found in ends.values() for end in found
                    if end[2] not in ("pull_request_opened", "reviewed", "merged") and not _stale_pin(end[2])], (
            seed, ends)
        assert all([x for x in found if x[0] == "merge"] == [("merge", MERGER, "merged")] for found in ends.values()), (
            seed, ends)


def _stale_pin(reason: str | None) -> bool:
    """A bootstrap resumed after a kill found the default branch moved from its pin (another issue merged)."""
    return bool(reason and reason.startswith("bootstrap failed: ") and " moved from the pinned " in reason)


def _freeing(reason: str | None) -> bool:
    return reason == "pull_request_opened" or _stale_pin(reason)


async def test_sigkill_inside_a_queue_merge_merges_once_and_tears_down(scratch: Path) -> None:  # noqa: F811
    """``[merge] by = "foreman"``: the service itself merges the approved PR. Gitea performs the merge but holds its
    answer (an after-store delay), and the service is SIGKILLed while it waits: inside the queue's merge. Started
    again (the lost webhooks replayed), the issue is merged once, torn down once (`merged`), and the invariants
    hold; no merger and no controller on the roster."""
    roster = {"author-1": ["author"], REVIEWER: ["reviewer"]}
    tokens = {login: f"tok-{login}-life" for login in roster}
    async with live_emulator() as live:
        emu = live.emulator
        seed_foreman(emu, tokens, writers=roster)
        number = emu.create_issue(OWNER, REPO, title="Merged by the queue", author="alice").number
        proc = ServeProcess(scratch)
        config = _config(proc, live.base_url, scratch)
        config.update(roster=roster, gitea={**config["gitea"], "identity_tokens": tokens}, merge={"by": "foreman"})
        write_config(proc.config, config)
        hook_url = f"{proc.url}/webhook"
        emu.add_hook(OWNER, REPO, url=hook_url, secret=SECRET, events=["issues", "issue_comment", "pull_request"])
        merge_route = "/repos/{owner}/{repo}/pulls/{index}/merge"
        try:
            await proc.serve()
            async with agents(proc.config) as runtime:
                burst = Burst(0, live, proc, hook_url)
                lives = Lives(0, live, proc, burst, runtime, [])
                await burst.api("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
                db = runtime.db
                await lives.until("bootstrapped", lambda: lives.leased(number, "author-1", "implement"))
                await lives.until_ok("author-1", "lock_issue", "locking", issue_number=number)
                registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
                assert registration is not None
                Path(registration.worktree_path, "queued.txt").write_text("merged by the queue\n", encoding="utf-8")
                await lives.until_ok("author-1", "publish_worktree", "publishing", issue_number=number,
                                     message="Merged by the queue")
                await lives.until_ok("author-1", "open_pull_request", "opening", issue_number=number)
                await lives.until("review leased", lambda: lives.leased(number, REVIEWER, "review"))
                emu.faults.delay("POST", merge_route, 5.0, times=1, after_store=True)
                await lives.until_ok(REVIEWER, "submit_review", "approving", issue_number=number, verdict="approve")

                async def merging() -> bool:
                    return any(r.method == "POST" and (r.route or "").endswith("/merge") for r in emu.requests)

                await lives.until("the queue's merge reached Gitea", merging)
                await proc.kill()  # Gitea merged; its answer is held: the service dies inside the merge
                with sqlite3.connect(f"file:{proc.db}?mode=ro", uri=True) as conn:
                    recorded = conn.execute("SELECT idempotency_key FROM outbox"
                                            " WHERE idempotency_key LIKE 'merge:%'").fetchall()
                assert recorded == [], recorded  # the kill landed before the merge's evidence was recorded
                await proc.serve()
                await burst.replay_lost()
                await lives.until("torn down", lambda: lives.torn_down(number))
                await burst.settle()
                violations = invariants.check(await lives.facts(scratch))
                teardowns = await TeardownStore(db).for_issue(FULL_NAME.lower(), number)
                history = await LeaseStore(db).history(FULL_NAME.lower(), number)
            assert await proc.terminate() == 0
        finally:
            await proc.stop()
        assert not violations, "\n".join(map(str, violations[:40]))
        merges = [r for r in emu.requests if r.method == "POST" and (r.route or "").endswith("/merge")]
        assert len(merges) == 1 and merges[0].login == BOT, [(r.route, r.login) for r in merges]
        [pull] = await live.client().list_pulls(state="all")
        assert pull.merged
        assert [t.reason for t in teardowns] == ["merged"]
        assert [(x.action, x.owner, x.status) for x in history] == [
            ("implement", "author-1", "released"), ("review", REVIEWER, "released")], history
