"""Catch-up against a stopped `foreman serve`: what happened meanwhile is read from Gitea and handled once."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bot.config_writer import write_config
from bot.core.canonical import render
from bot.emulator.webhooks import SentWebhook
from tests.gitea_fixtures import BOT, OWNER, REPO, seed_foreman
from tests.serve_support import Served, ServeProcess, served_emulator
from tests.support import SECRET, canonical_state

pytestmark = [pytest.mark.process]

INTERVAL_S = 2.0
CONTROLLER = "controller-bot"
AUTHOR = "author-1"
USER_TOKENS = {CONTROLLER: "tok-controller-0007", AUTHOR: "tok-author-1-0006"}
READY = "status:ready"


def _config(proc: ServeProcess, base_url: str) -> dict[str, Any]:
    return proc.serve_document(base_url, {
        "worker": {"concurrency": 2},
        "outbox": {"poll_interval_s": 0.1, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
        "allocator": {"auto": False},
        "bootstrap": {"on_allocate": "off"},
        "reconcile": {"interval_s": INTERVAL_S, "overlap_s": 5},
        "roster": {CONTROLLER: ["controller"], AUTHOR: ["author"]},
    })


def _state_comment() -> str:
    block = render(canonical_state(
        "blocked", "controller", next_action="controller: unblock it", next_prompt="",
        what_happened="the controller blocked it while foreman was down", why="the catch-up test says so",
        blockers="waiting on design", validation="none", last_updated_by=CONTROLLER))
    return f"Blocked for now.\n\n{block}"


class Outage(Served):
    """A live emulator with a hook to a `foreman serve` subprocess that the test stops and starts."""

    async def start(self) -> None:
        await self.proc.serve()

    async def resend(self, delivery: SentWebhook) -> int:
        """Gitea's original delivery (its headers and body byte for byte) arriving late."""
        async with aiohttp.ClientSession() as session, session.post(
            f"{self.proc.url}/webhook", data=delivery.body, headers=delivery.headers
        ) as resp:
            return resp.status

    async def first_pass_done(self) -> None:
        async def probe() -> bool:
            doc = await self.readyz()
            return bool((doc["checks"].get("reconcile") or {}).get("last_success_at"))

        await self.wait(probe, "a reconcile pass to finish")

    def last_pass(self) -> int:
        """The id of the newest catch-up pass (0: none yet)."""
        return int(self.db("SELECT COALESCE(MAX(id), 0) FROM reconcile_passes")[0][0])

    def passes_after(self, pass_id: int, *, finished: bool = False) -> list[tuple[str, str, dict[str, int]]]:
        """(trigger, outcome, found) of every catch-up pass after ``pass_id`` (only the finished ones)."""
        rows = self.db("SELECT trigger, outcome, found_json FROM reconcile_passes WHERE id > ? ORDER BY id",
                       (pass_id,))
        return [(trigger, outcome, json.loads(found)) for trigger, outcome, found in rows
                if not finished or outcome != "running"]

    def reply_count(self, number: int, comment_id: int) -> int:
        issue = self.emu.issue(OWNER, REPO, number)
        return sum(
            1 for c in issue.comments if c.poster.login == BOT and f"command:{comment_id}:reply" in c.body
        )

    def failed_deliveries(self) -> list[SentWebhook]:
        return [d for d in self.emu.deliveries if not d.ok]

    def effects(self) -> dict[str, Any]:
        """Everything an event can change: Gitea's comments and labels, leases, outbox, issue state."""
        return {
            "gitea": [
                (i.number, sorted(self.emu.label_names(OWNER, REPO, i.number)), [(c.id, c.body) for c in i.comments])
                for i in sorted(self.emu.repo(OWNER, REPO).issues.values(), key=lambda i: i.number)
            ],
            "leases": self.db("SELECT lease_id, status FROM leases ORDER BY id"),
            # A verb run again shows here even when its reply is deduplicated (an /allocate resumes the lease).
            "lease_events": self.db("SELECT lease_id, kind, actor FROM lease_events ORDER BY id"),
            "allocations": self.db("SELECT COUNT(*) FROM auto_allocations"),
            "outbox": self.db("SELECT idempotency_key, status FROM outbox ORDER BY id"),
            "issues": self.db("SELECT number, is_open, candidate, state_json FROM issues ORDER BY number"),
            "candidates": self.db("SELECT number, delivery_id FROM issue_events WHERE made_candidate = 1"),
        }


@pytest.fixture
async def outage() -> AsyncIterator[Outage]:
    """A running `foreman serve` of acme/widgets (issues #1-#3) that has finished its first catch-up pass."""
    async with served_emulator("foreman-reconcile-") as (live, proc):
        seed_foreman(live.emulator, USER_TOKENS)
        for n in range(1, 4):
            live.emulator.create_issue(OWNER, REPO, title=f"Catch-up work item {n}", author="alice")
        write_config(proc.config, _config(proc, live.base_url))
        live.emulator.add_hook(OWNER, REPO, url=proc.hook_url, secret=SECRET, events=["issues", "issue_comment"])
        outage = Outage(live, proc)
        await outage.start()
        await outage.first_pass_done()
        yield outage


async def _events_during_outage(o: Outage) -> tuple[int, int]:
    """With the service down: #1 gets status:ready, a controller posts /allocate on it, and a state block on #2."""
    o.emu.add_labels(OWNER, REPO, 1, [READY], actor=CONTROLLER, notify=True)
    command = o.emu.create_comment(
        OWNER, REPO, 1, author=CONTROLLER, body=f"/allocate --owner {AUTHOR}", notify=True
    )
    state = o.emu.create_comment(OWNER, REPO, 2, author=CONTROLLER, body=_state_comment(), notify=True)
    await o.emu.drain_webhooks()
    return command.id, state.id


async def _cli(o: Outage, *args: str) -> str:
    """`foreman --config <the service's config> ARGS` as an operator runs it beside the service."""
    code, out, err = await o.cli(*args)
    assert code == 0, err
    return out


def _handled(o: Outage, command_id: int) -> bool:
    rows = o.db("SELECT state_json FROM issues WHERE number = 2")
    state = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    return o.reply_count(1, command_id) == 1 and state.get("state") == "blocked" and bool(o.db("SELECT 1 FROM leases"))


async def test_events_while_the_service_was_down_are_caught_up_once_and_replays_change_nothing(
    outage: Outage,
) -> None:
    o = outage
    await o.proc.kill()  # SIGKILL: no shutdown hook runs

    command_id, state_id = await _events_during_outage(o)
    missed = o.failed_deliveries()
    assert len(missed) == 3, [d.event for d in missed]  # Gitea tried once each and gave up: nothing was stored

    before_restart = o.last_pass()
    await o.start()
    await o.wait(lambda: _handled(o, command_id), "the outage's events handled")
    # Caught up within one reconcile interval of the restart, counted in passes (a loaded machine stretches the
    # seconds): the start-up pass, or the first pass of the interval after it, found all three events.
    await o.wait(lambda: (first := o.passes_after(before_restart)[:2]) and all(p[1] != "running" for p in first),
                 "the passes that caught up recorded")
    first = o.passes_after(before_restart)[:2]
    assert first[0][0] == "start" and sum((Counter(found) for _, _, found in first), Counter()) == Counter(
        {"issue": 1, "comment": 2}), first

    # Each exactly once: one reply, one lease, #1 became a candidate once, #2's state is the block's.
    handled_at = o.last_pass()
    await o.wait(lambda: o.passes_after(handled_at, finished=True), "a further pass (it finds nothing new)")
    assert o.reply_count(1, command_id) == 1
    assert len(o.db("SELECT lease_id FROM leases")) == 1
    assert len(o.db("SELECT 1 FROM issue_events WHERE number = 1 AND made_candidate = 1")) == 1
    synthetic = o.db("SELECT delivery_id, status FROM deliveries WHERE delivery_id LIKE 'reconcile:%' ORDER BY id")
    kinds = sorted(row[0].split(":")[1] for row in synthetic)
    assert kinds == ["comment", "comment", "issue"], synthetic
    assert all(row[1] == "done" for row in synthetic), synthetic
    assert any(f"reconcile:comment:{state_id}:" in row[0] for row in synthetic)

    # Gaps are visible: /readyz, /metrics, and `foreman deliveries --json` name the last pass and what it found.
    check = (await o.readyz())["checks"]["reconcile"]
    assert check["found_total"] >= 3 and check["last_error"] is None, check
    assert check["down_window"]["from"] and check["down_window"]["seconds"] >= 0, check
    _, metrics = await o.get("/metrics")
    assert 'foreman_reconcile_found_total{kind="comment"} 2.0' in metrics
    assert 'foreman_reconcile_found_total{kind="issue"} 1.0' in metrics
    assert "foreman_reconcile_last_success_timestamp_seconds" in metrics
    assert "service was down" in o.proc.stderr.read_text()
    listing = json.loads(await _cli(o, "deliveries", "--json"))
    assert {d["delivery"] for d in listing if d["source"] == "reconcile"} == {row[0] for row in synthetic}
    summary = json.loads(await _cli(o, "deliveries", "--reconcile", "--json"))
    found = [p for p in [summary["last_pass"], summary["last_success"]] if p and p["found_total"]]
    assert summary["last_pass"]["outcome"] == "ok" and summary["watermark"], summary
    assert summary["last_pass"]["calls"] >= 3, summary  # Gitea's clock, one page of issues, one of comments
    assert not found or found[0]["found"] in ({"issue": 1, "comment": 2}, {"issue": 0, "comment": 0}), summary

    before = o.effects()
    label, command, state = missed
    assert (label.event, command.event, state.event) == ("issues", "issue_comment", "issue_comment")
    # A late webhook (Gitea's original delivery, arriving after catch-up) of the label and of the command: stored
    # as new deliveries (202), run through the handlers, and they change nothing.
    for delivery in (label, command):
        assert await o.resend(delivery) == 202
    # A Replay (Gitea's button: the same body under a new delivery id) of each: the state comment's is new to
    # the service and runs its handlers; the other two are the bodies the late webhooks brought (duplicates).
    for delivery in missed:
        o.emu.replay_delivery(delivery.delivery_id)
    await o.emu.drain_webhooks()
    replays = {d.replay_of: d for d in o.emu.deliveries if d.replay_of is not None}
    assert replays[state.delivery_id].status == 202, replays[state.delivery_id].response_body
    assert all(d.ok for d in replays.values()), [(d.status, d.error) for d in replays.values()]
    ids = [label.delivery_id, command.delivery_id, replays[state.delivery_id].delivery_id]
    await o.wait(lambda: all((o.proc.status(i) or ("", 0))[0] == "done" for i in ids),
                 "replays and late webhooks settled")
    await asyncio.sleep(0.5)  # the outbox would have sent anything they queued
    after = o.effects()
    assert after == before, json.dumps({k: (before[k], after[k]) for k in before if before[k] != after[k]}, default=str)
    assert o.reply_count(1, command_id) == 1
    # The late webhook of the command found the claim that catch-up's delivery holds.
    log = o.proc.stderr.read_text()
    claimed = f"comment {command_id} on #1: its command already ran for delivery reconcile:comment:{command_id}:"
    assert claimed in log, [line for line in log.splitlines() if "already ran" in line or "/allocate" in line]


async def test_a_gitea_outage_during_catch_up_keeps_the_watermark_and_the_next_pass_finishes_it(
    outage: Outage,
) -> None:
    o = outage
    watermark = (await o.readyz())["checks"]["reconcile"]["watermark"]
    await o.proc.terminate()  # SIGTERM: a clean stop this time

    command_id, _ = await _events_during_outage(o)
    rule = o.emu.faults.fail("GET", "/repos/{owner}/{repo}/issues/comments", status=500, times=None)
    await o.start()

    async def failed_pass() -> bool:
        check = (await o.readyz())["checks"]["reconcile"]
        return bool(check.get("last_error")) and check.get("errors_total", 0) >= 1

    await o.wait(failed_pass, "a catch-up pass to fail on the comment listing")
    check = (await o.readyz())["checks"]["reconcile"]
    assert check["last_error"] and "issues/comments" in check["last_error"], check
    assert check["watermark"] == watermark, check  # nothing read past what was fed
    _, metrics = await o.get("/metrics")
    assert "foreman_reconcile_errors_total 0.0" not in metrics and "foreman_reconcile_errors_total" in metrics
    assert o.reply_count(1, command_id) == 0  # the comment listing failed: the command is not yet known
    assert rule.hits >= 1

    rule.remaining = 0  # Gitea is back
    await o.wait(lambda: _handled(o, command_id), "catch-up after the outage")
    check = (await o.readyz())["checks"]["reconcile"]
    assert check["last_error"] is None and check["watermark"] != watermark, check
    assert o.reply_count(1, command_id) == 1
    assert len(o.db("SELECT lease_id FROM leases")) == 1
