"""The controller loop end to end against the emulator: `status:ready` to lease, bootstrap, evidence, then MCP."""

# A maintainer's `status:ready` label → candidate → auto-allocation (lease, assignee, `status:in-progress`) →
# server-side bootstrap (branch + registered worktree) → evidence comment with the Canonical Issue State, posted once
# and read back; then the author, through the MCP server, locks, heartbeats, posts its state and releases. Every
# effect is read back from the emulator.

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from bot.catalog import open_door
from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.mcp_server import build_server
from bot.verbs.allocate import AllocationCall, Allocator
from bot.verbs.runtime import caller_for
from state.journal import JournalStore
from state.leases import LeaseStore
from tests.conftest import POSTGRES_MISSING, PostgresSchemas, postgres_reachable
from tests.gitea_fixtures import OWNER, REPO, ReceivedHook, webhook_sink
from tests.support import SECRET, Started, wait_status
from tests.world import FULL_NAME, Sections, World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"]}
LOOP: Sections = {"allocator": {"auto_allocate_owner": "author-1"}, "bootstrap": {"on_allocate": "run"}}


@pytest.fixture(params=[("1.22.3", "sqlite"), ("1.26.3", "sqlite"), ("1.26.3", "postgresql")],
                ids=["1.22.3", "1.26.3", "1.26.3-postgresql"])
async def world(
    tmp_path: Path, postgres_schemas: PostgresSchemas, start: Started, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    """The loop world, once per Gitea version the emulator switches between, and on PostgreSQL once."""
    version, backend = request.param
    sections: Sections = {**LOOP}
    if backend == "postgresql":
        if not postgres_reachable():
            pytest.skip(POSTGRES_MISSING)
        sections["database"] = {"url": postgres_schemas.new()}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as opened:
        opened.live.emulator.version = version
        yield opened


@pytest.fixture
def database(backend: str, postgres_schemas: PostgresSchemas) -> Sections:
    """The config's database section on this backend (conftest's ``backend``: SQLite, then PostgreSQL): none for
    SQLite's embedded default, a fresh schema's URL for PostgreSQL. Asked for before ``start``, so the schema
    outlives the service."""
    return {"database": {"url": postgres_schemas.new()}} if backend == "postgresql" else {}


def comments(world: World, number: int) -> list[tuple[int, str, str]]:
    """(id, author, body) of the issue's plain comments, as Gitea holds them."""
    issue = world.live.emulator.issue(OWNER, REPO, number)
    return [(c.id, c.poster.login, c.body) for c in issue.comments if c.kind == "comment"]


def markers(world: World, number: int) -> list[str]:
    return [find_marker(body) or "" for _, _, body in comments(world, number)]


def worktrees(world: World, number: int) -> list[Path]:
    checkout = Path(world.service.settings.repository.checkout_root)
    return sorted(checkout.glob(f"{OWNER}/{REPO}/branches/issue-{number}-*"))


async def label_ready(world: World, number: int, login: str = "alice") -> None:
    await world.call(login, "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})


async def assert_looped(world: World, number: int, owner: str = "author-1") -> dict[str, Any]:
    """The loop's invariants for one issue: one live lease, one worktree, the Gitea side, one evidence comment
    per effect, and the bootstrap's evidence as the issue's current state. Returns the facts for more checks."""
    emu = world.live.emulator
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [(lease.owner, lease.status) for lease in history] == [(owner, "live")]
    [lease] = history
    assert emu.label_names(OWNER, REPO, number) == ["status:in-progress"]
    assert [u.login for u in emu.issue(OWNER, REPO, number).assignees] == [owner]
    [worktree] = worktrees(world, number)
    assert (worktree / "README.md").is_file() and (worktree / ".git").is_file()
    journal = JournalStore(world.service.db)
    transitions = await journal.history(FULL_NAME.lower(), number)
    assert [(t.phase, t.lease_id) for t in transitions] == [("completed", lease.lease_id)]
    found = markers(world, number)
    evidence = [m for m in found if m.endswith(":evidence")]
    assert sorted(evidence) == sorted([f"{lease.lease_id}:evidence", f"{transitions[0].key}:evidence"]), found
    assert len(found) == len(set(found)), f"a comment was posted twice: {found}"
    [(comment_id, author, body)] = [
        c for c in comments(world, number) if find_marker(c[2]) == f"{transitions[0].key}:evidence"
    ]
    assert author == "foreman-bot"
    state = parse_comment(body).current
    assert state is not None and (state.state, state.who_is_next) == ("in-progress", "author")
    assert "gitea_lock_issue" in state.next_action and "gitea_lock_issue" in state.next_prompt
    snapshot = await world.snapshot(number)
    assert snapshot.state_comment_id == comment_id and snapshot.state == state
    for entry in await world.service.outbox.list(limit=1000):
        assert entry.status == "done", entry.summary()
    return {"lease": lease, "transition": transitions[0], "worktree": worktree, "comment_id": comment_id}


async def tool(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    assert result.structured_content is not None
    assert not result.is_error, result.structured_content
    return dict(result.structured_content)


async def test_the_loop_from_a_ready_label_to_the_authors_release(world: World) -> None:
    """Label → candidate → lease → bootstrap → evidence; then lock, heartbeat, state, release by MCP."""
    number = await world.open_issue("alice", "Make the widget blue")
    await label_ready(world, number)
    events = await world.store.issue_events(FULL_NAME, number)
    assert any(e["made_candidate"] and "status:ready" in e["added"] for e in events), events
    facts = await assert_looped(world, number)
    lease = facts["lease"]

    service = world.service
    runtime = open_door(
        db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    async with Client(build_server(runtime, caller_for(service.settings, "author-1", "mcp"))) as client:
        context = await tool(client, "gitea_get_runtime_context")
        assert context["exact_next_action"] == f"call gitea_lock_issue with issue_number={number}"
        locked = await tool(client, "gitea_lock_issue", issue_number=number)
        assert locked["status"] == "locked"
        beat = await tool(client, "gitea_heartbeat_lease", issue_number=number)
        assert beat["lease"]["expires_at"] >= lease.expires_at.isoformat()
        state = {
            "state": "in-progress", "who_is_next": "controller", "next_action": "review the change",
            "next_prompt": "", "what_happened": "implemented it", "why": "asked for", "related_prs": [],
            "blockers": "none", "validation": "tests pass",
        }
        posted = await tool(client, "gitea_post_issue_state", issue_number=number, state=state)
        await world.settle()
        released = await tool(client, "gitea_release_lease", issue_number=number, reason="done")
        assert released["lease"]["status"] == "released"
    await world.settle()
    [state_key] = posted["outbox"]
    assert markers(world, number)[-2:] == [state_key, f"{lease.lease_id}:release"]
    # The author's state was recorded; its release (the issue still in progress, no hand-over) sends the issue back
    # to status:ready, and the author who gave it up is not handed it again.
    records = await world.store.comment_records(FULL_NAME, number)
    assert any(r.state is not None and r.state.last_updated_by == "author-1" for r in records), records
    snapshot = await world.snapshot(number)
    assert snapshot.state is not None and (snapshot.state.state, snapshot.state.who_is_next) == ("ready", "controller")
    assert world.labels(number) == ["status:ready"]
    assert await LeaseStore(service.db).open_leases(FULL_NAME) == []
    kinds = [e["kind"] for e in await LeaseStore(service.db).events(lease.lease_id)]
    assert kinds == ["acquired", "heartbeat", "released"], kinds


# --- duplicates, replays and out of order -----------------------------------------------------------------------------


async def test_duplicate_and_replayed_deliveries_lease_bootstrap_and_comment_once(world: World) -> None:
    """The same delivery again, Gitea's Replay (new id, same body) and an operator's forced replay
    (every handler runs again): still one lease, one worktree, one comment per effect."""
    number = await world.open_issue("alice", "Make the widget blue")
    await label_ready(world, number)
    before = await assert_looped(world, number)
    emu = world.live.emulator
    [label] = [d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"]

    # 1. The very same delivery (same id, same body) posted again.
    async with world.client.post("/webhook", data=label.body, headers=label.headers) as resp:
        assert (resp.status, (await resp.json())["status"]) == (200, "duplicate")
    # 2. Gitea's "Replay": a new delivery id, the same body and signature.
    replay = emu.replay_delivery(label.delivery_id)
    await world.settle()
    assert replay.status == 200 and json.loads(replay.response_body)["status"] == "duplicate"
    # 3. `foreman replay --force`: the stored delivery runs through every handler again.
    await world.service.store.replay(label.delivery_id, requested_by="test", force=True)
    world.service.worker.wakeup.set()
    await wait_status(world.service, label.delivery_id, "done")
    await world.settle()

    after = await assert_looped(world, number)
    assert (after["lease"].lease_id, after["transition"].key, after["comment_id"]) == (
        before["lease"].lease_id, before["transition"].key, before["comment_id"]
    )
    kinds = [e["kind"] for e in await LeaseStore(world.service.db).events(after["lease"].lease_id)]
    assert kinds == ["acquired", "resumed"], kinds  # the forced replay resumed the lease, it did not lease again
    assert len(await world.service.store.list(limit=1000)) == len({d.delivery_id for d in emu.deliveries}) - 1


def kind(hook: ReceivedHook) -> str:
    return f"{hook.headers['X-Gitea-Event-Type']}/{json.loads(hook.body)['action']}"


def carries(hook: ReceivedHook, label: str) -> bool:
    return label in {item["name"] for item in json.loads(hook.body)["issue"]["labels"]}


async def capture(world: World, actions: Callable[[], Awaitable[None]]) -> list[ReceivedHook]:
    """Run ``actions`` with foreman's hook switched off and a sink's on; returns what the sink received."""
    emu = world.live.emulator
    world.hook.active = False
    async with webhook_sink() as sink:
        sink_hook = emu.add_hook(OWNER, REPO, url=sink.url, secret=SECRET, events=["issues"])
        await actions()
        await emu.drain_webhooks()
        sink_hook.active = False
    world.hook.active = True
    return list(sink.received)


async def forward(world: World, hooks: Sequence[ReceivedHook]) -> None:
    """Deliver captured webhooks to foreman in the given order, each settled before the next is sent."""
    loop = asyncio.get_running_loop()
    for hook in hooks:
        headers = {k: v for k, v in hook.headers.items() if k.lower().startswith("x-") or k.lower() == "content-type"}
        async with world.client.post("/webhook", data=hook.body, headers=headers) as resp:
            assert resp.status == 202, await resp.text()
        await world.wait_settled(headers["X-Gitea-Delivery"], loop.time() + 10)
        await world.settle()


READY_BLOCK = (
    "Ready to go.\n\n## Canonical Issue State\n\nSTATE: ready\nWHO_IS_NEXT: controller\nNEXT_ACTION: allocate it\n"
    "NEXT_PROMPT:\nWHAT_HAPPENED: specified\nWHY: it is needed\nRELATED_PRS: none\nBLOCKERS: none\n"
    "VALIDATION: none\nLAST_UPDATED_BY: alice\n"
)


async def test_label_and_comment_deliveries_in_reverse_order_end_in_the_loop(world: World) -> None:
    """Opened, labelled ready and a maintainer's state comment, delivered newest first: the loop still
    runs once, the older `opened` event never rolls the labels back, and the bot's later evidence stays current."""
    number = 1

    async def actions() -> None:
        assert await world.open_issue("alice", "Make the widget blue") == number
        await label_ready(world, number)
        await world.comment("alice", number, READY_BLOCK)

    captured = {kind(hook): hook for hook in await capture(world, actions)}
    newest_first = ("issue_comment/created", "issue_label/label_updated", "issues/opened")
    assert sorted(captured) == sorted(newest_first)
    await forward(world, [captured[k] for k in newest_first])

    await assert_looped(world, number)
    snapshot = await world.snapshot(number)
    assert snapshot.label_names == ("status:in-progress",)
    events = await world.store.issue_events(FULL_NAME, number)
    assert [(e["action"], e["applied"]) for e in events][-1] == ("opened", 0), events
    records = await world.store.comment_records(FULL_NAME, number)
    assert any(r.author == "alice" and r.trusted for r in records)  # recorded, trusted, and not current


async def test_a_stale_ready_label_delivered_after_its_removal_leases_nothing(world: World) -> None:
    """`status:ready` added then removed, the removal delivered first: the late `ready` event does not
    turn the issue back into a candidate and nothing is leased (candidates are read live from Gitea)."""
    number = await world.open_issue("alice", "Not yet")
    ready_id = world.label_id("status:ready")

    async def actions() -> None:
        await label_ready(world, number)
        await world.call("alice", "DELETE", f"/issues/{number}/labels/{ready_id}")

    captured = await capture(world, actions)
    assert [kind(hook) for hook in captured] == ["issue_label/label_updated"] * 2
    [added] = [hook for hook in captured if carries(hook, "status:ready")]
    [removed] = [hook for hook in captured if not carries(hook, "status:ready")]
    await forward(world, [removed, added])  # the removal first, then the stale ready label
    assert await LeaseStore(world.service.db).history(FULL_NAME, number) == []
    snapshot = await world.snapshot(number)
    assert snapshot.label_names == () and not snapshot.candidate
    assert world.labels(number) == [] and markers(world, number) == []


# --- exclusions, lease expiry and reclaim -----------------------------------------------------------------------------


def evidence_json(body: str) -> dict[str, Any]:
    """The machine-readable section of an evidence comment."""
    start = body.index("```json\n") + len("```json\n")
    return dict(json.loads(body[start : body.index("\n```", start)]))


async def test_a_protected_issue_in_the_config_is_never_allocated(
    tmp_path: Path, database: Sections, start: Started
) -> None:
    """`[allocator] protected_issues`: labelling the protected issue ready leases nothing; the next
    ready issue is leased and its evidence names the protected one as skipped `protected_issue`."""
    allocator = {**LOOP["allocator"], "protected_issues": [1]}
    sections: Sections = {"allocator": allocator, "bootstrap": LOOP["bootstrap"], **database}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        emu = world.live.emulator
        emu.create_issue(OWNER, REPO, title="Protected", author="alice", labels=["priority:p0"])
        emu.create_issue(OWNER, REPO, title="Ordinary", author="alice")
        await label_ready(world, 1)
        assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []
        await label_ready(world, 2)
        facts = await assert_looped(world, 2)
        assert world.labels(1) == ["priority:p0", "status:ready"] and comments(world, 1) == []
        [allocation] = [b for _, _, b in comments(world, 2) if find_marker(b) == f"{facts['lease'].lease_id}:evidence"]
        skipped = evidence_json(allocation)["skipped"]
        assert {"issue_number": 1, "reason": "protected_issue"}.items() <= skipped[0].items(), skipped


async def test_a_controllers_exclusion_in_the_allocate_comment_holds(
    tmp_path: Path, database: Sections, start: Started
) -> None:
    """`/allocate --exclude 1` with #1 ranked first: #2 runs the loop, #1 is untouched."""
    sections: Sections = {"bootstrap": LOOP["bootstrap"], **database}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        emu = world.live.emulator
        emu.create_issue(OWNER, REPO, title="Top", author="alice", labels=["status:ready", "priority:p0"])
        emu.create_issue(OWNER, REPO, title="Next", author="alice", labels=["status:ready"])
        await world.comment("controller-bot", 2, "/allocate --exclude 1")
        facts = await assert_looped(world, 2)
        assert world.labels(1) == ["priority:p0", "status:ready"] and comments(world, 1) == []
        reply = next(b for _, _, b in comments(world, 2) if (find_marker(b) or "").startswith("command:"))
        assert "#2" in reply and "excluded_by_controller" in reply
        # Asked again, the controller gets the author's current lease back (resume), never #1.
        await world.comment("controller-bot", 2, "/allocate --exclude 1")
        assert [lease.lease_id for lease in await LeaseStore(world.service.db).open_leases(FULL_NAME)] == [
            facts["lease"].lease_id
        ]
        assert await LeaseStore(world.service.db).history(FULL_NAME, 1) == []


async def test_an_expired_lease_is_refused_to_its_owner_held_through_the_grace_and_then_reclaimed(
    tmp_path: Path, database: Sections, start: Started
) -> None:
    """Past expiry the owner's heartbeat is refused (the issue is no longer leased to it); inside
    `lease_grace_s` nobody else gets the issue; after it the allocator reclaims it for another author (the old
    lease `expired` + `reclaimed`, never deleted). The first author's work is then stranded (issue 31, item 3): the
    apply's proof passes and author-2's bootstrap takes it over, the first author's worktree kept aside as it was
    (before: the proof failed on `path_free`, registered to author-1, and nothing was leased)."""
    roster = {**ROSTER, "author-2": ["author"]}
    sections: Sections = {**LOOP, **database}
    async with open_world(tmp_path, start, roster=roster, **sections) as world:
        service = world.service
        number = await world.open_issue("alice", "Make the widget blue")
        await label_ready(world, number)
        first = (await assert_looped(world, number))["lease"]
        grace = timedelta(seconds=service.settings.allocator.lease_grace_s)
        [path] = worktrees(world, number)
        (path / "notes.txt").write_text("author-1's, never committed\n", encoding="utf-8")

        expired = open_door(db=service.db, settings=service.settings, bot_login="foreman-bot",
                              clock=lambda: first.expires_at + timedelta(seconds=1))
        beat = await expired.call("heartbeat_lease", caller_for(service.settings, "author-1", "mcp"),
                                  {"issue_number": number})
        assert beat.refusal is not None and beat.refusal.error == "not_authorized", beat.doc

        # The controller hands the issue back (a trusted state block); label sync makes it `status:ready` again.
        await world.comment("controller-bot", number, READY_BLOCK.replace("alice", "controller-bot"))
        assert world.labels(number) == ["status:ready"]

        allocator = Allocator(service.db, service.settings, service.gitea, bot_login="foreman-bot")
        call = AllocationCall(actor="controller-bot", owner="author-2", dry_run=False)
        held = await allocator.run(call, now=first.expires_at + grace / 2)
        assert held.decision is not None and held.decision.kind == "wait" and not held.applied
        assert [(s.issue_number, s.reason) for s in held.decision.skipped] == [(number, "lease_grace")]

        taken = await allocator.run(call, now=first.expires_at + grace + timedelta(seconds=1))
        assert taken.applied and taken.lease is not None and taken.lease.owner == "author-2", taken
        assert taken.bootstrap is not None and taken.bootstrap["status"] == "completed", taken.bootstrap
        assert taken.bootstrap["proof"]["takeover"]["from_owner"] == "author-1", taken.bootstrap
        service.outbox_wakeup()
        await world.settle()
        leases = LeaseStore(service.db)
        history = await leases.history(FULL_NAME, number)
        assert [(lease.owner, lease.status) for lease in history] == [("author-1", "expired"), ("author-2", "live")]
        # (the controller's ready state may resume author-1's lease first: its events end with the reclaim)
        assert [e["kind"] for e in await leases.events(first.lease_id)][-2:] == ["expired", "reclaimed"]
        assert worktrees(world, number) == [path] and not (path / "notes.txt").exists()  # author-2's, fresh
        [kept] = [r for r in await JournalStore(service.db).registrations(FULL_NAME.lower(), number) if r.kept]
        assert kept.owner == "author-1" and kept.lease_id == first.lease_id
        assert (Path(kept.worktree_path) / "notes.txt").read_text(encoding="utf-8") == "author-1's, never committed\n"


# --- Gitea answering 5xx ----------------------------------------------------------------------------------------------


async def test_the_loop_completes_once_gitea_recovers_from_a_5xx_spell(world: World) -> None:
    """5xx on every route the loop uses (candidates, the bootstrap's branch reads beyond the client's
    own retries, comments, labels, assignees) and a comment stored whose answer was lost: the loop completes
    once Gitea answers again, with nothing duplicated."""
    emu = world.live.emulator
    number = await world.open_issue("alice", "Make the widget blue")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]}, settle=False)
    repo = "/repos/{owner}/{repo}"
    rules = [
        emu.faults.fail("GET", f"{repo}/issues", status=503, times=2),
        emu.faults.fail("GET", f"{repo}/branches/{{branch}}", status=502, times=8),
        emu.faults.fail("POST", f"{repo}/issues/{{index}}/labels", status=500, times=2),
        emu.faults.fail("PATCH", f"{repo}/issues/{{index}}", status=503, times=2),
        emu.faults.fail("POST", f"{repo}/issues/{{index}}/comments", status=500, times=2),
        emu.faults.drop_after_store("POST", f"{repo}/issues/{{index}}/comments", times=1),
    ]
    await world.settle()
    assert [rule.remaining for rule in rules] == [0] * len(rules)
    await assert_looped(world, number)
    [label] = [d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"]
    stored = await world.service.store.get(label.delivery_id)
    assert stored is not None and stored.attempts > 1  # the handler was retried until the bootstrap could run


async def test_a_long_outage_parks_the_delivery_and_a_replay_completes_the_loop(
    tmp_path: Path, database: Sections, start: Started
) -> None:
    """Gitea down for longer than `worker.max_attempts`: the delivery is parked as failed with nothing
    leased; after Gitea recovers, the operator's replay runs the whole loop once."""
    loop: Sections = {**LOOP, "worker": {"max_attempts": 2}, **database}
    async with open_world(tmp_path, start, roster=ROSTER, **loop) as world:
        emu = world.live.emulator
        number = await world.open_issue("alice", "Make the widget blue")
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]}, settle=False)
        outage = emu.faults.fail("*", "*", status=503, times=1000)
        [label] = [d for d in await emu.drain_webhooks() if d.event_type == "issue_label"]
        await wait_status(world.service, label.delivery_id, "failed")
        assert await LeaseStore(world.service.db).history(FULL_NAME, number) == []
        emu.faults.clear()
        assert outage.hits >= 8
        await world.service.store.replay(label.delivery_id, requested_by="test")
        world.service.worker.wakeup.set()
        await wait_status(world.service, label.delivery_id, "done")
        await world.settle()
        await assert_looped(world, number)


async def test_an_allocate_comment_retries_a_bootstrap_gitea_could_not_serve(
    tmp_path: Path, database: Sections, start: Started
) -> None:
    """A controller's `/allocate` whose server-side bootstrap meets a 5xx spell longer than the client's
    own retries: the delivery is retried until the bootstrap completes; one lease, one worktree, one reply."""
    loop: Sections = {"bootstrap": {"on_allocate": "run"}, "allocator": {"auto": False}, **database}  # only /allocate
    async with open_world(tmp_path, start, roster=ROSTER, **loop) as world:
        emu = world.live.emulator
        number = await world.open_issue("alice", "Make the widget blue")
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        rule = emu.faults.fail("GET", "/repos/{owner}/{repo}/branches/{branch}", status=502, times=8)
        await world.call("controller-bot", "POST", f"/issues/{number}/comments", {"body": "/allocate"}, settle=False)
        await world.settle()
        assert rule.remaining == 0
        await assert_looped(world, number)
        replies = [c.body for c in emu.issue(OWNER, REPO, number).comments if "command:" in c.body]
        assert len(replies) == 1
        [command] = [
            d for d in emu.deliveries if d.event_type == "issue_comment" and d.payload["comment"]["body"] == "/allocate"
        ]
        stored = await world.service.store.get(command.delivery_id)
        assert stored is not None and stored.attempts > 1


async def test_foreman_invariants_reports_a_consistent_loop_and_catches_a_removed_worktree(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operators: `foreman invariants` checks the consistency invariants read-only (exit 0), and names the broken
    one (exit 1) when a registered worktree is removed by hand."""
    import shutil

    from bot.cli import main

    number = await world.open_issue("alice", "Make the widget blue")
    await label_ready(world, number)
    await assert_looped(world, number)
    env = {**world.cli_env(), "FOREMAN_BOOTSTRAP__ON_ALLOCATE": "run"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert await asyncio.to_thread(main, ["invariants", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    [worktree] = worktrees(world, number)
    shutil.rmtree(worktree)  # someone removed the worktree by hand
    assert await asyncio.to_thread(main, ["invariants", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "worktrees.on_disk" in doc["counts"], doc["counts"]
