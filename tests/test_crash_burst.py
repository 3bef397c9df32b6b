"""A real `foreman serve` of two repositories SIGKILLed and stopped during a burst of ~200 deliveries, restarted,
then checked by bot.invariants for each repository."""

# Checked by code: no lease without evidence, no evidence without a lease, no orphan worktree, no duplicate comment,
# no delivery lost or stuck.
#
# The burst is what Gitea would send while people and agents work: maintainers labelling issues `status:ready`
# (auto-allocation for author-1, bootstrap on allocation), a controller's `/allocate --owner X` comments, lease
# owners' `/release`, `/heartbeat` and `/bootstrap`, Canonical Issue State blocks from a writer (making issues
# ready again) and from a reader (untrusted), and plain chatter. The emulator signs and sends every webhook; those
# sent while the service is down are lost, as with Gitea, and replayed afterwards as the operator guide says.
# Two repositories of one organization (acme/widgets and acme/gadgets, each with issues #1-#16) are served by the
# one process over one org hook; every operation picks one of them. One of the stops is an outage: the service is
# stopped while maintainers label issues of both repositories ready, and started again after.
#
# Seeded: ``FOREMAN_CRASH_SEED=<n>`` replays a run's choices (operations, kill points); the seed is printed and
# named in every failure. Process timing stays real, so two runs of one seed may kill at different instants.

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot import invariants
from bot.config_writer import write_config
from bot.core.canonical import render
from bot.emulator import Emulator
from bot.emulator.webhooks import SentWebhook
from tests.conftest import READ_ERRORS, read_rows
from tests.gitea_fixtures import (
    BOT,
    OWNER,
    REPO,
    TOKENS,
    LiveEmulator,
    live_emulator,
    scratch_dir,
    seed_foreman,
    seed_sibling_repository,
)
from tests.serve_support import ServeProcess
from tests.support import HANG_S, SECRET, SLOW_HANG_S, canonical_state, serve_config

pytestmark = [pytest.mark.process, pytest.mark.slow]

AUTHORS = ("author-1", "author-2", "author-3", "author-4")
USER_TOKENS = {
    **TOKENS,
    "controller-bot": "tok-controller-0007",
    **{login: f"tok-{login}-00{10 + i}" for i, login in enumerate(AUTHORS)},
}
ISSUES = 16
OPERATIONS = 200
READY = "status:ready"
SIBLING = "gadgets"
REPOSITORIES = (REPO, SIBLING)


def _config(proc: ServeProcess, base_url: str, root: Path, database_url: str | None = None) -> dict[str, Any]:
    retries = {"concurrency": 4, "max_attempts": 10}
    database: dict[str, Any] = {} if database_url is None else {"database": {"url": database_url}}
    document = serve_config(proc.port, proc.db, base_url, root, database, {
        "worker": retries,
        "outbox": {**retries, "poll_interval_s": 0.1, "claim_ttl_s": 1.5, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
        "allocator": {"auto_allocate_owner": "author-1"},
        "bootstrap": {"on_allocate": "run", "lock_wait_s": 10.0},
        "roster": {"controller-bot": ["controller"], **{a: ["author"] for a in AUTHORS}},
    })
    checkouts = document.pop("repository")["checkout_root"]
    document["repositories"] = [{"owner": OWNER, "name": name, "checkout_root": checkouts} for name in REPOSITORIES]
    if database_url is not None:
        del document["database"]["path"]  # PostgreSQL: [database] url alone
    return document


def _state_block(state: str, who: str, author: str) -> str:
    block = render(canonical_state(
        state, who, next_action=f"{who}: pick this up", next_prompt="", what_happened=f"{author} moved the issue to "
        f"{state}", why="the crash-burst test says so", validation="none", last_updated_by=author))
    return f"Moving on.\n\n{block}"


@dataclass(frozen=True)
class Kill:
    at_op: int  # not before the driver has done this many operations
    #: "anytime", or the first moment seen inside a "bootstrap", an "outbox" send or a "handler" (SIGKILL); or
    #: "outage": SIGTERM, then issues of both repositories are labelled ready while the service is down
    moment: str
    delay: float  # seconds to wait first
    down: float  # seconds the service stays down


def burst_seed(what: str) -> int:
    """The run's seed: ``FOREMAN_CRASH_SEED``, else a random one (printed either way)."""
    seed = int(os.environ.get("FOREMAN_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"{what} seed: {seed} (rerun with FOREMAN_CRASH_SEED={seed})")
    return seed


def seed_burst(emu: Emulator, what: str) -> None:
    """The organization acme with its two repositories, each with issues #1-#16, and the burst's users."""
    seed_foreman(emu, {login: USER_TOKENS[login] for login in ("controller-bot", *AUTHORS)})
    seed_sibling_repository(emu, SIBLING)
    for name in REPOSITORIES:
        for n in range(1, ISSUES + 1):
            emu.create_issue(OWNER, name, title=f"{what} work item {n} of {name}", author="alice")
    emu.make_org(OWNER)


def plan_kills(rng: random.Random) -> list[Kill]:
    """3-5 stops: spread over the burst, each with its moment, delay and downtime; one of them an outage; the last
    one near the end of the burst and inside a bootstrap, where fewer later deliveries could hide what it left
    behind."""
    at_ops = sorted(rng.sample(range(15, OPERATIONS - 20, 8), rng.randint(2, 4)))
    outage = rng.randrange(len(at_ops))
    moments = ["anytime", "bootstrap", "outbox", "handler"]
    kills = [Kill(at, "outage" if i == outage else rng.choice(moments), rng.uniform(0.0, 0.3), rng.uniform(0.1, 0.8))
             for i, at in enumerate(at_ops)]
    return [*kills, Kill(OPERATIONS - rng.randint(0, 10), "bootstrap", rng.uniform(0.0, 0.2), rng.uniform(0.1, 0.8))]


@dataclass
class Burst:
    """The driver's view: the seeded RNG, the emulator, the service, and what happened."""

    seed: int
    live: LiveEmulator
    proc: ServeProcess
    hook_url: str
    #: Where the service keeps its state: the PostgreSQL URL, or (None) the process's SQLite file.
    database_url: str | None = None
    rng: random.Random = field(init=False)
    #: The outages' own choices (the driver's RNG runs concurrently: sharing it would make a seed's runs differ).
    outage_rng: random.Random = field(init=False)
    done_ops: int = 0
    kills: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.outage_rng = random.Random(self.seed ^ 0x0DD)

    @property
    def database(self) -> Path | str:
        return self.proc.db if self.database_url is None else self.database_url

    async def run(
        self, kills: list[Kill], root: Path
    ) -> tuple[int, dict[str, invariants.Facts], list[invariants.Violation]]:
        """The burst and its kills, then the lost deliveries replayed and everything settled: how many deliveries
        were replayed, what each repository ended with (``facts``), and every invariant it breaks."""
        await asyncio.gather(self.drive(), self.crash(kills))
        replayed = await self.replay_lost()
        await self.settle()
        each = await self.facts(root)
        return replayed, each, [v for name in REPOSITORIES for v in invariants.check(each[name])]

    async def facts(self, root: Path) -> dict[str, invariants.Facts]:
        """What ``bot.invariants`` checks in each repository: the database, Gitea, the checkout under ``root``, and
        every delivery Gitea saw acknowledged."""
        acknowledged = [(d.delivery_id, hashlib.sha256(d.body).hexdigest()) for d in self.hook_deliveries() if d.ok]
        return {name: await invariants.gather(
            database=self.database, client=self.live.client(repo=name), bot_login=BOT,
            checkout=root / "checkouts" / OWNER / name, acknowledged=acknowledged, require_bootstrap=True,
            repo=f"{OWNER}/{name}",
        ) for name in REPOSITORIES}

    def live_leases(self, name: str) -> list[tuple[int, str]]:
        """(issue, owner) of the live leases of repository ``name``, read from the database (the driver acts like
        an informed user)."""
        if isinstance(self.database, Path) and not self.database.exists():
            return []
        try:
            rows = read_rows(self.database, "SELECT issue_number, owner FROM leases"  # noqa: S608 (test constants)
                             f" WHERE status = 'live' AND repo = '{OWNER}/{name}'")
        except READ_ERRORS:
            return []
        return [(int(n), str(o)) for n, o in rows]

    async def api(self, login: str, method: str, path: str, body: object, *, name: str = REPO) -> None:
        session = self.live.session
        url = self.live.api(f"/repos/{OWNER}/{name}{path}")
        headers = {"Authorization": f"token {USER_TOKENS[login]}"}
        async with session.request(method, url, json=body, headers=headers) as resp:
            assert resp.status < 300, f"seed {self.seed}: {method} {path} as {login}: {resp.status} {await resp.text()}"

    async def operation(self) -> None:
        """One user action in one of the two repositories through the emulator's API (one webhook delivery)."""
        rng = self.rng
        name = rng.choice(REPOSITORIES)
        number = rng.randint(1, ISSUES)
        leases = self.live_leases(name)

        async def api(login: str, method: str, path: str, body: object) -> None:
            await self.api(login, method, path, body, name=name)

        async def comment(login: str, number: int, body: str) -> None:
            await api(login, "POST", f"/issues/{number}/comments", {"body": body})

        kind = rng.choices(
            ["label", "ready_state", "allocate", "release", "heartbeat", "bootstrap", "untrusted", "chatter"],
            weights=[22, 12, 24, 16, 5, 5, 6, 10],
        )[0]
        self.ops[kind] = self.ops.get(kind, 0) + 1
        if kind == "label":
            await api("alice", "POST", f"/issues/{number}/labels", {"labels": [READY]})
        elif kind == "ready_state":
            leased = {n for n, _ in leases}
            free = [n for n in range(1, ISSUES + 1) if n not in leased] or [number]
            await comment("alice", rng.choice(free), _state_block("ready", "controller", "alice"))
        elif kind == "allocate":
            await comment("controller-bot", number, f"/allocate --owner {rng.choice(AUTHORS)}")
        elif kind in ("release", "heartbeat", "bootstrap"):
            if leases and rng.random() < 0.85:
                number, owner = rng.choice(sorted(leases))
            else:
                owner = rng.choice(AUTHORS)  # most likely not the owner: a not_authorized reply
            command = {"release": "/release done for now", "heartbeat": "/heartbeat", "bootstrap": "/bootstrap"}
            await comment(owner, number, command[kind])
        elif kind == "untrusted":
            await comment("bob", number, _state_block("done", "human", "bob"))
        else:
            await comment(rng.choice(["bob", "alice"]), number, f"note {rng.randrange(10**6)}")

    async def drive(self) -> None:
        for _ in range(OPERATIONS):
            await self.operation()
            self.done_ops += 1
            await asyncio.sleep(self.rng.uniform(0.005, 0.05))

    def busy(self, moment: str) -> bool:
        """Is the service in the middle of ``moment`` right now (read from its database)?"""
        query = {
            "bootstrap": "SELECT COUNT(*) FROM bootstrap_journal WHERE outcome = 'open'",
            "outbox": "SELECT COUNT(*) FROM outbox WHERE status = 'sending'",
            "handler": "SELECT COUNT(*) FROM deliveries WHERE status = 'processing'",
        }[moment]
        try:
            return bool(read_rows(self.database, query)[0][0])
        except READ_ERRORS:
            return False

    async def crash(self, kills: list[Kill]) -> None:
        """SIGKILL the service once the driver has done ``at_op`` operations: after a random delay ("anytime"),
        or as soon as it is seen in the middle of a bootstrap, an outbox send or a handler (within 2 s); leave
        it down for a moment (deliveries sent meanwhile are lost, as with Gitea), then start it again."""
        for kill in kills:
            while self.done_ops < kill.at_op:
                await asyncio.sleep(0.01)
            await asyncio.sleep(kill.delay)
            if kill.moment not in ("anytime", "outage"):
                deadline = time.monotonic() + 2.0
                while not self.busy(kill.moment) and time.monotonic() < deadline:
                    await asyncio.sleep(0.003)
            stopped = self.stopped_by(kill)
            if kill.moment == "outage":
                for proc in stopped:
                    assert await proc.terminate() == 0, f"seed {self.seed}: the service did not stop cleanly"
                self.kills.append(f"outage@{self.done_ops}")
                for name in REPOSITORIES:  # labelled while nobody listens: these webhooks are lost
                    for number in sorted(self.outage_rng.sample(range(1, ISSUES + 1), 2)):
                        await self.api("alice", "POST", f"/issues/{number}/labels", {"labels": [READY]}, name=name)
            else:
                for proc in stopped:
                    await proc.kill()
                self.kills.append(f"{kill.moment}@{self.done_ops}{self.named(stopped)}")
            await asyncio.sleep(kill.down)
            for proc in stopped:
                await proc.serve()

    def stopped_by(self, kill: Kill) -> list[ServeProcess]:
        """The processes a stop takes down: the one service."""
        return [self.proc]

    def named(self, stopped: list[ServeProcess]) -> str:
        """What the kill log adds about which processes were stopped (nothing when there is one service)."""
        return ""

    def hook_deliveries(self) -> list[SentWebhook]:
        return [d for d in self.live.emulator.deliveries if d.url == self.hook_url]

    async def replay_lost(self) -> int:
        """Gitea's operator: replay every delivery that never got a 2xx (itself or through a replay)."""
        replayed = 0
        for _ in range(5):
            await self.live.emulator.drain_webhooks()
            deliveries = self.hook_deliveries()
            acked = {d.replay_of or d.delivery_id for d in deliveries if d.ok}
            lost = [d for d in deliveries if d.replay_of is None and d.delivery_id not in acked]
            if not lost:
                return replayed
            for delivery in lost:
                self.live.emulator.replay_delivery(delivery.delivery_id)
                replayed += 1
        raise AssertionError(f"seed {self.seed}: deliveries still unacknowledged after 5 rounds of replay")

    def queues(self) -> tuple[int, ...]:
        [(open_deliveries, open_outbox, total)] = read_rows(
            self.database,
            "SELECT (SELECT COUNT(*) FROM deliveries WHERE status IN ('queued', 'processing')),"
            " (SELECT COUNT(*) FROM outbox WHERE status IN ('pending', 'sending')"
            " OR (status IN ('done', 'verification_failed', 'parked') AND hooked_at IS NULL)),"
            " (SELECT COUNT(*) FROM deliveries) + (SELECT COUNT(*) FROM outbox)",
        )
        return int(open_deliveries), int(open_outbox), int(total)

    async def settle(self, stuck_s: float = HANG_S, ceiling_s: float = SLOW_HANG_S) -> None:
        """Until nothing is queued, processing, pending, sending or waiting for its hook, three polls in a row.
        Hang detectors, never a timing: the test fails once the queues have not moved for ``stuck_s`` (a loaded
        machine drains them slowly: at load 12 a PostgreSQL run still had 78 deliveries queued after 120 s; a stuck
        service never does), or after ``ceiling_s`` in all."""
        started = moved = time.monotonic()
        quiet = 0
        last: tuple[int, ...] = ()
        while quiet < 3:
            now_s = time.monotonic()
            assert now_s - moved < stuck_s and now_s - started < ceiling_s, (
                f"seed {self.seed}: never settled: {self.queues()} (open deliveries, open outbox entries, rows),"
                f" unchanged for {now_s - moved:.0f} s, {now_s - started:.0f} s in all")
            await self.live.emulator.drain_webhooks()
            now = self.queues()
            if now != last:
                moved = time.monotonic()
            quiet = quiet + 1 if now[:2] == (0, 0) and now == last else 0
            last = now
            await asyncio.sleep(0.2)


@pytest.fixture
async def scratch() -> AsyncIterator[Path]:
    root = scratch_dir("foreman-crash-")
    try:
        yield root
    finally:
        if os.environ.get("FOREMAN_CRASH_KEEP"):
            print(f"crash-burst files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def test_sigkill_during_a_burst_of_deliveries_leaves_every_issue_consistent(
    scratch: Path, database_url: str | None
) -> None:
    """SIGKILL at 2-4 random points of a ~200-delivery burst over two repositories, restart, replay what was lost;
    then every invariant of ``bot.invariants`` holds in each repository, checked over the database (SQLite, then
    PostgreSQL), Gitea and the checkout."""
    seed = burst_seed("crash-burst")
    started = time.monotonic()
    async with live_emulator() as live:
        emu = live.emulator
        seed_burst(emu, "Crash burst")
        proc = ServeProcess(scratch)
        write_config(proc.config, _config(proc, live.base_url, scratch, database_url))
        hook_url = f"{proc.url}/webhook"
        emu.add_org_hook(OWNER, url=hook_url, secret=SECRET, events=["issues"])
        burst = Burst(seed, live, proc, hook_url, database_url)
        kills = plan_kills(random.Random(seed ^ 0x5EED))
        try:
            await proc.serve()
            replayed, each, violations = await burst.run(kills, scratch)
            served = ", ".join(f"'{OWNER}/{name}'" for name in REPOSITORIES)
            unfiled = read_rows(  # every door filed its entries
                burst.database, f"SELECT idempotency_key FROM outbox WHERE repo NOT IN ({served})"  # noqa: S608
            )
            assert await proc.terminate() == 0
        finally:
            await proc.stop()
        def figures(facts: invariants.Facts) -> dict[str, Any]:
            return {
                "leases": len(facts.db.leases),
                "live_leases": sum(1 for lease in facts.db.leases if lease.status == "live"),
                "transitions": dict(sorted(Counter(t.outcome for t in facts.db.transitions).items())),
                "outbox": len(facts.db.outbox),
                "worktrees": len(facts.checkout.worktrees) if facts.checkout else 0,
            }

        summary: dict[str, Any] = {
            "seed": seed,
            "seconds": round(time.monotonic() - started, 1),
            "operations": burst.ops,
            "kills": burst.kills,
            "hook_deliveries": len(burst.hook_deliveries()),
            "replayed": replayed,
            **{name: figures(facts) for name, facts in each.items()},
        }
        print("crash-burst summary:", json.dumps(summary))
        stderr = proc.stderr.read_text(errors="replace")
        stderr_tail = stderr[-3000:]
        # The worktree bootstrap's own lines (warnings, compensations) whatever the tail shows: a transition left open
        # is explained there, and the scratch folder holding the whole log is gone once the test ends.
        bootstrap_lines = [line for line in stderr.splitlines()
                           if "bootstrap" in line and ("WARNING" in line or "ERROR" in line or "compensat" in line)]
        assert not violations, (
            f"seed {seed}: {len(violations)} violation(s):\n" + "\n".join(map(str, violations[:40]))
            + f"\nsummary: {json.dumps(summary)}\nbootstrap warnings:\n" + "\n".join(bootstrap_lines[-40:])
            + f"\nservice stderr (tail):\n{stderr_tail}"
        )
        assert not unfiled, f"seed {seed}: outbox entries under no served repository: {unfiled[:10]}"
        assert len(burst.kills) == len(kills) >= 3 and any(k.startswith("outage@") for k in burst.kills), summary
        assert all(summary[name]["leases"] >= 2 and each[name].db.transitions for name in REPOSITORIES), summary


# --- what the burst found, pinned down --------------------------------------------------------------------------------


async def test_the_service_start_finishes_or_compensates_the_bootstraps_a_killed_process_left_open() -> None:
    """Found by the burst: a process killed mid-bootstrap left the transition open, and once its lease was
    released nothing ever compensated it (only a next lease of the issue would). `recover_open_transitions`,
    run when the service starts, resumes a live lease's transition for its owner and compensates an ended
    lease's: both end terminal, and only the live one keeps a worktree."""
    from bot.loops.recovery import recover_open_transitions
    from bot.verbs.bootstrap.faults import FAULT_EXIT_CODE, FAULT_PHASE_ENV
    from tests.test_bootstrap_support import open_bootstrap_world

    async with open_bootstrap_world() as w:
        live_issue, ended_issue = w.issue(), w.issue()
        await w.lease(live_issue)
        ended = await w.lease(ended_issue)
        runs = await asyncio.gather(*(w.cli("--issue", str(n), "--owner", "alice",
                                            env={FAULT_PHASE_ENV: "worktree_confirmed"})
                                      for n in (live_issue, ended_issue)))
        assert {code for code, _, _ in runs} == {FAULT_EXIT_CODE}, [err[-400:] for _, _, err in runs]
        await w.release(ended)
        results = {r.issue_number: r.status for r in await recover_open_transitions(w.ctx)}
        assert results == {live_issue: "completed", ended_issue: "compensated"}
        outcomes = w.rows("SELECT issue_number, outcome FROM bootstrap_journal ORDER BY issue_number")
        assert outcomes == [(live_issue, "completed"), (ended_issue, "compensated")]
        assert w.path(live_issue).is_dir() and not w.path(ended_issue).exists()
        assert await recover_open_transitions(w.ctx) == []


async def test_an_allocation_that_resumes_the_owners_lease_runs_its_unfinished_bootstrap(tmp_path: Path) -> None:
    """Found by the burst: with `on_allocate = "run"`, a process killed between the lease commit and the end of
    its bootstrap retried the delivery, the allocator resumed the lease, and the bootstrap never ran again.
    Now an apply that resumes the owner's lease runs the (idempotent) bootstrap too."""
    from bot.verbs.allocate import AllocationCall, Allocator
    from bot.verbs.bootstrap import BootstrapContext
    from state.db import Database
    from tests.support import emulator_sections, make_settings

    async with live_emulator() as live:
        seed_foreman(live.emulator, {"author-1": USER_TOKENS["author-1"]})
        live.emulator.create_issue(OWNER, REPO, title="Resume me", author="alice", labels=[READY])
        settings = make_settings(tmp_path, **emulator_sections(live.base_url), roster={"author-1": ["author"]},
                                 bootstrap={"on_allocate": "off"})
        db = await Database.open(settings.database.path, synchronous="NORMAL")
        try:
            call = AllocationCall(actor="operator", actor_is_operator=True, owner="author-1", dry_run=False)
            first = await Allocator(db, settings, live.client(), bot_login=BOT).run(call)
            assert first.applied and first.bootstrap is None  # as if the process died right after the lease
            run = settings.model_copy(
                update={"bootstrap": settings.bootstrap.model_copy(update={"on_allocate": "run"})})
            again = await Allocator(db, run, live.client(), bot_login=BOT).run(call)
            assert again.to_dict()["decision"] == "resume" and not again.applied
            assert again.bootstrap is not None and again.bootstrap["status"] == "completed", again.bootstrap
            replay = await Allocator(db, run, live.client(), bot_login=BOT).run(call)
            assert replay.bootstrap is not None and replay.bootstrap["replayed"] is True
            ctx = BootstrapContext(db=db, settings=run, gitea=live.client(), bot_login=BOT)
            checkout = invariants.gather_checkout(ctx.checkout_path)
            assert checkout is not None and len(checkout.worktrees) == 1
        finally:
            await db.close()
