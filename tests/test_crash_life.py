"""A real `foreman serve` SIGKILLed at seeded points during whole lives, restarted, the agents' calls re-driven.

Three issues live concurrently: a maintainer labels each `status:ready` (auto-allocation and the bootstrap run in
the service), its author locks, writes, publishes and opens the pull request, the reviewer claims and approves,
the merger merges, and the `pull_request` closed webhook tears the issue down in the service. The agents' calls go
through the one door from this process over the service's database, as `foreman mcp` does beside `foreman serve`.
The service is SIGKILLed at seeded points (after a publish, a PR's opening, a verdict, a merge, and inside a
teardown), left down for a moment (the webhooks Gitea sends meanwhile are lost, then replayed as the operator guide
says), started again, and the agent re-drives its last call with the same idempotency key. Then every invariant of
``bot.invariants`` holds, and: one PR per issue, one merge each, one teardown record per issue, no worktree left.

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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot import invariants
from bot.config import load_settings
from bot.config_writer import write_config
from bot.core.teardown import closing_issue
from bot.mcp_server import open_runtime
from bot.verbs.runtime import VerbResult, VerbRuntime, caller_for
from state.journal import JournalStore
from state.leases import LeaseStore
from state.teardowns import TeardownStore
from tests.gitea_fixtures import BOT, OWNER, REPO, LiveEmulator, live_emulator, seed_foreman
from tests.support import SECRET, serve_config
from tests.test_crash_burst import Burst, scratch  # noqa: F401 (the fixture)
from tests.test_process import ServeProcess

AUTHORS = ("author-1", "author-2", "author-3")
CONTROLLER, REVIEWER, MERGER = "controller-bot", "reviewer-1", "merger-1"
ROSTER = {CONTROLLER: ["controller"], **{a: ["author"] for a in AUTHORS}, REVIEWER: ["reviewer"],
          MERGER: ["merger"]}
TOKENS = {login: f"tok-{login}-life" for login in ROSTER}
ISSUES = 3
#: The points a kill may follow: the agent's call of that step answered (the service is sending its effects),
#: or, for the teardown, the service seen handling the PR's closed webhook after the merge.
POINTS = ("publish", "open_pr", "review", "merge", "teardown")
FULL_NAME = f"{OWNER}/{REPO}"
#: The seed of a plain run (it spreads the five kills over all three lives); any other through FOREMAN_CRASH_SEED.
DEFAULT_SEED = 9


@dataclass(frozen=True)
class Kill:
    issue: int  # 0-based index of the life
    point: str
    delay: float  # seconds after the point, before the SIGKILL
    down: float  # seconds the service stays down


def plan_kills(rng: random.Random) -> list[Kill]:
    """One kill at every point, each in a seeded life, after a seeded delay, for a seeded downtime."""
    return [Kill(rng.randrange(ISSUES), point, rng.uniform(0.0, 0.15), rng.uniform(0.1, 0.4)) for point in POINTS]


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
    service_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def call(self, login: str, verb: str, **arguments: Any) -> VerbResult:
        return await self.runtime.call(verb, caller_for(self.runtime.settings, login, "mcp"), arguments)

    async def until_ok(self, login: str, verb: str, what: str, **arguments: Any) -> dict[str, Any]:
        """Call until the door answers ok: a refusal that waits on the service (a label not synced yet, a lease
        the service has not made) is called again, as an agent following ``exact_next_action`` would."""
        deadline = time.monotonic() + 30.0
        while True:
            result = await self.call(login, verb, **arguments)
            if result.ok:
                return result.doc
            assert time.monotonic() < deadline, f"seed {self.seed}: {what}: {verb} kept refusing: {result.doc}"
            await asyncio.sleep(0.1)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], timeout: float = 40.0) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            assert time.monotonic() < deadline, f"seed {self.seed}: never {what}"
            await asyncio.sleep(0.1)

    async def point(self, index: int, point: str) -> bool:
        """Kill the service if the plan says so at this point of this life; True when it did."""
        planned = [k for k in self.kills if (k.issue, k.point) == (index, point)]
        if not planned:
            return False
        kill = planned[0]
        async with self.service_lock:
            await asyncio.sleep(kill.delay)
            if point == "teardown":
                await self.until("busy with the teardown", lambda: self._busy(index), timeout=10.0)
            await self.proc.kill()
            self.done.append(f"{point}#{index}")
            await asyncio.sleep(kill.down)
            await self.proc.start("serve", "--config", str(self.proc.config))
            await self.burst.replay_lost()
        return True

    async def _busy(self, index: int) -> bool:
        """The service is handling a delivery or sending an outbox entry (a teardown's effects, after a merge)."""
        return any(self.burst.queues()[:2]) or await self.torn_down(index)

    async def torn_down(self, number: int) -> bool:
        return bool(await TeardownStore(self.runtime.db).for_issue(FULL_NAME.lower(), number))

    async def redrive(self, label: str, first: dict[str, Any], login: str, verb: str, **arguments: Any) -> None:
        """After a kill at this point: the agent calls again with the same key, and gets the same answer."""
        again = await self.until_ok(login, verb, f"re-driving {label}", **arguments)
        self.redriven[label] = self.redriven.get(label, 0) + 1
        for key in ("pull_request", "commit", "merge_commit_sha", "head_sha"):
            if key in first:
                assert again.get(key) == first[key], f"seed {self.seed}: {label} answered {again} after {first}"

    async def life(self, index: int, number: int) -> None:
        """One issue from `status:ready` to its teardown, as the four identities would drive it."""
        await self.burst.api("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        db = self.runtime.db

        async def bootstrapped() -> bool:
            lease = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
            registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
            return lease is not None and registration is not None and registration.lease_id == lease.lease_id

        await self.until(f"bootstrapped #{number}", bootstrapped)
        lease = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
        registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
        assert lease is not None and registration is not None
        author = lease.owner
        await self.until_ok(author, "lock_issue", f"locking #{number}", issue_number=number)
        Path(registration.worktree_path, f"life-{number}.txt").write_text(f"the life of #{number}\n", encoding="utf-8")
        publish: dict[str, Any] = {"issue_number": number, "message": f"Live #{number}",
                                   "idempotency_key": f"publish-{number}"}
        published = await self.until_ok(author, "publish_worktree", f"publishing #{number}", **publish)
        if await self.point(index, "publish"):
            await self.redrive("publish", published, author, "publish_worktree", **publish)
        opening: dict[str, Any] = {"issue_number": number, "idempotency_key": f"open-{number}"}
        opened = await self.until_ok(author, "open_pull_request", f"opening #{number}'s PR", **opening)
        if await self.point(index, "open_pr"):
            await self.redrive("open_pr", opened, author, "open_pull_request", **opening)
        await self.until_ok(REVIEWER, "claim_review", f"claiming #{number}'s review", issue_number=number)
        verdict: dict[str, Any] = {"issue_number": number, "verdict": "approve"}
        approved = await self.until_ok(REVIEWER, "submit_review", f"approving #{number}", **verdict)
        if await self.point(index, "review"):
            await self.redrive("review", approved, REVIEWER, "submit_review", **verdict)
        merged = await self.until_ok(MERGER, "merge_pull_request", f"merging #{number}", issue_number=number)
        if await self.point(index, "merge"):
            await self.redrive("merge", merged, MERGER, "merge_pull_request", issue_number=number)
        await self.point(index, "teardown")
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
        seed_foreman(emu, TOKENS)
        for login in ROSTER:
            emu.set_permission(OWNER, REPO, login, "write")
        numbers = [emu.create_issue(OWNER, REPO, title=f"Whole life {i + 1}", author="alice").number
                   for i in range(ISSUES)]
        proc = ServeProcess(scratch, module="bot", config=scratch / "foreman.toml")
        write_config(proc.config, _config(proc, live.base_url, scratch))
        hook_url = f"{proc.url}/webhook"
        emu.add_hook(OWNER, REPO, url=hook_url, secret=SECRET, events=["issues", "issue_comment", "pull_request"])
        kills = plan_kills(random.Random(seed))
        try:
            await proc.start("serve", "--config", str(proc.config))
            async with agents(proc.config) as runtime:
                burst = Burst(seed, live, proc, hook_url)
                lives = Lives(seed, live, proc, burst, runtime, kills)
                await asyncio.wait_for(asyncio.gather(*(lives.life(i, n) for i, n in enumerate(numbers))), 50)
                await burst.replay_lost()
                await burst.settle()
                facts = await invariants.gather(
                    database=proc.db, client=live.client(), bot_login=BOT,
                    checkout=scratch / "checkouts" / OWNER / REPO,
                    acknowledged=[(d.delivery_id, hashlib.sha256(d.body).hexdigest())
                                  for d in burst.hook_deliveries() if d.ok],
                    require_bootstrap=True,
                )
                violations = invariants.check(facts)
                teardowns = {n: await TeardownStore(runtime.db).for_issue(FULL_NAME.lower(), n) for n in numbers}
            assert await proc.terminate() == 0
        finally:
            if proc.proc is not None and proc.proc.returncode is None:
                await proc.kill()
        pulls = await live.client().list_pulls(state="all")
        summary = {"seed": seed, "seconds": round(time.monotonic() - started, 1), "kills": lives.done,
                   "redriven": lives.redriven, "pulls": len(pulls), "outbox": len(facts.db.outbox)}
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
        assert len(lives.done) == len(kills) and set(lives.redriven) == set(POINTS[:-1]), summary
