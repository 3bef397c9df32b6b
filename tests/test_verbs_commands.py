"""Comment commands through the verb table and the door: parsing, and end to end with the reply on Gitea."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core.evidence import find_marker
from bot.core.verbs import COMMANDS, VERBS
from handlers.verb_commands import USAGE, CommandError, parse_command
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import SECRET, Started
from tests.world import FULL_NAME, World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "author-2": ["author"]}


# --- parsing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("/allocate", ("apply", None, None)),
        ("/allocate --dry-run --exclude 617,#618", ("dry", [617, 618], None)),
        ("  \n/allocate --owner @author-2\nplease", ("apply", None, "author-2")),
        ("please /allocate", None),
        ("/allocated", None),
    ],
)
def test_allocate_commands_are_parsed_from_the_first_line(body: str, expected: Any) -> None:
    """The `/allocate` comment command; plain splitting, no shell."""
    command = parse_command(body)
    if expected is None:
        assert command is None
    else:
        assert command is not None and command.verb.name == "allocate_next_work"
        args = command.arguments
        got = ("dry" if args["dry_run"] else "apply", args.get("exclude_issue_numbers"), args.get("owner"))
        assert got == expected


@pytest.mark.parametrize(
    "body", ["/allocate --exclude", "/allocate --exclude 1.5", "/allocate --force", "/allocate --exclude 0"]
)
def test_malformed_allocate_commands_are_errors_not_guesses(body: str) -> None:
    """Fail closed: a malformed command is an error the reply explains."""
    with pytest.raises(CommandError):
        parse_command(body)


@pytest.mark.parametrize(
    ("body", "excluded"),
    [
        ("/allocate --exclude 617 --exclude 5,7", [5, 7, 617]),
        ("/allocate --exclude 1,2 --dry-run --exclude 3", [1, 2, 3]),
        ("/allocate --exclude 5 --exclude 5", [5]),
        ("/allocate --exclude #9223372036854775807", [9223372036854775807]),
    ],
)
def test_a_repeated_exclude_in_a_comment_takes_every_value(body: str, excluded: list[int]) -> None:
    """A list argument given several times takes every value (it used to keep only the last)."""
    command = parse_command(body)
    assert command is not None and sorted(command.arguments["exclude_issue_numbers"]) == excluded


@pytest.mark.parametrize(
    "body",
    [
        "/allocate --exclude 617,,618",
        "/allocate --exclude 617,",
        "/allocate --exclude ,617",
        "/allocate --exclude 9223372036854775808",
        "/allocate --exclude " + "1" * 5000,
        "/allocate --exclude \u0661\u0662",
        "/allocate --exclude 5 --exclude abc",
        "/allocate --owner author-1 --owner author-2",
        "/bootstrap --key k1 --key k2",
        "/bootstrap --expected-base a --expected-base b",
    ],
)
def test_malformed_or_repeated_scalar_comment_arguments_refuse(body: str) -> None:
    """Malformed list elements, out-of-range numbers and a one-value option given twice are refused
    with a CommandError (the reply explains), never a silent subset or an uncaught ValueError."""
    with pytest.raises(CommandError):
        parse_command(body)


@pytest.mark.parametrize(
    ("body", "verb", "arguments"),
    [
        ("/release", "release_lease", {}),
        ("/release handing over to author-2", "release_lease", {"reason": "handing over to author-2"}),
        ("/heartbeat", "heartbeat_lease", {}),
        ("/lock", "lock_issue", {}),
        ("/bootstrap", "bootstrap_issue_worktree", {}),
        ("/bootstrap --expected-base abc --key k1", "bootstrap_issue_worktree",
         {"expected_base": "abc", "idempotency_key": "k1"}),
        ("/publish Add the parser", "publish_worktree", {"message": "Add the parser"}),
        ("/open-pr", "open_pull_request", {}),
        ("/update-pr", "update_pull_request", {}),
        ("/update-pr --style rebase", "update_pull_request", {"style": "rebase"}),
    ],
)
def test_every_command_names_its_verb(body: str, verb: str, arguments: dict[str, Any]) -> None:
    command = parse_command(body)
    assert command is not None and command.verb is VERBS[verb] and command.arguments == arguments


@pytest.mark.parametrize("body", ["/heartbeat now", "/lock 5", "/release --force", "/bootstrap --base x", "/publish",
                                  "/publish --force now", "/open-pr 5", "/update-pr rebase",
                                  "/update-pr --style"])
def test_malformed_commands_are_errors(body: str) -> None:
    with pytest.raises(CommandError):
        parse_command(body)


def test_commands_come_from_the_verb_table() -> None:
    """One table: every offered command is a verb's `command`, and each has its usage line."""
    assert set(COMMANDS) == set(USAGE) == {"/allocate", "/bootstrap", "/lock", "/heartbeat", "/release",
                                           "/claim-review", "/merge", "/publish", "/open-pr", "/update-pr"}
    assert all(COMMANDS[word].command == word and COMMANDS[word].executable for word in COMMANDS)


# --- end to end ------------------------------------------------------------------------------------------


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER) as opened:
        opened.live.emulator.create_issue(OWNER, REPO, title="work", author="alice", labels=["status:ready"])
        await opened.comment("controller-bot", 1, "/allocate --owner author-1")
        yield opened


def replies(world: World, number: int) -> list[str]:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    bodies = [c.body for c in issue.comments if c.kind == "comment"]
    return [body for body in bodies if (find_marker(body) or "").startswith("command:")]


async def test_a_comment_command_from_someone_not_allowed_gets_a_not_authorized_reply(world: World) -> None:
    """Not on the roster, or not the lease owner: not_authorized through the outbox; lease untouched."""
    leases = LeaseStore(world.service.db)
    [lease] = await leases.open_leases(FULL_NAME)
    for login in ("alice", "author-2"):
        await world.comment(login, 1, "/release taking it")
        reply = replies(world, 1)[-1]
        assert "`/release` was refused" in reply and "`not_authorized`" in reply and "**Next action:**" in reply
    [still] = await leases.open_leases(FULL_NAME)
    assert still == lease
    for entry in await world.service.outbox.list():
        assert entry.status == "done", entry.summary()


async def test_the_owner_heartbeats_and_the_controller_releases_by_comment(world: World) -> None:
    """The same gateway decisions as the MCP tools, with the reply and the evidence on the issue."""
    leases = LeaseStore(world.service.db)
    [lease] = await leases.open_leases(FULL_NAME)
    await world.comment("author-1", 1, "/heartbeat")
    assert "now runs until" in replies(world, 1)[-1]
    # The allocation bootstrapped the worktree (`on_allocate = "run"` by default), so it locks at once.
    await world.comment("author-1", 1, "/lock")
    assert "`/lock` done on #1: locked." in replies(world, 1)[-1]
    await world.comment("controller-bot", 1, "/release reassigning")
    # Released without a hand-over: the issue went back to status:ready, and auto-allocation may lease it again.
    assert [held.owner for held in await leases.open_leases(FULL_NAME) if held.lease_id == lease.lease_id] == []
    ended = (await leases.history(FULL_NAME, 1))[0]
    assert (ended.lease_id, ended.status, ended.end_reason) == (lease.lease_id, "released", "reassigning")
    bodies = [c.body for c in world.live.emulator.issue(OWNER, REPO, 1).comments if c.kind == "comment"]
    assert any(find_marker(b) == f"{lease.lease_id}:release" for b in bodies)
    # The former owner is refused (ownership gate), told its lease was released.
    await world.comment("author-1", 1, "/heartbeat")
    reply = replies(world, 1)[-1]
    assert "`not_authorized`" in reply and "lease_released" in reply, reply


async def test_a_malformed_command_gets_its_usage_back(world: World) -> None:
    await world.comment("author-1", 1, "/release --now")
    reply = replies(world, 1)[-1]
    assert "`invalid_input`" in reply and USAGE["/release"] in reply


async def test_a_command_on_a_pull_request_runs_no_verb_and_is_refused(world: World) -> None:
    """A comment command on a pull request (payload issue has `pull_request`) must not run issue
    verbs: nothing is leased, and the reply says to write it on the issue."""
    emu = world.live.emulator
    # The world's hook sends issue events only; Gitea sends comments on pull requests with the pull_request group.
    emu.add_hook(OWNER, REPO, url=world.webhook_url, secret=SECRET, events=["pull_request"])
    ready = emu.create_issue(OWNER, REPO, title="more work", author="alice", labels=["status:ready"])
    pull = emu.create_issue(OWNER, REPO, title="a pull request", author="alice", pull=True)
    leases = LeaseStore(world.service.db)
    before = await leases.open_leases(FULL_NAME)
    await world.comment("controller-bot", pull.number, "/allocate --owner author-2")
    await world.comment("author-1", pull.number, "/heartbeat")
    assert await leases.open_leases(FULL_NAME) == before
    assert await leases.history(FULL_NAME, ready.number) == []
    answers = replies(world, pull.number)
    assert len(answers) == 2
    for reply in answers:
        assert "`invalid_input`" in reply and "pull request" in reply and "**Next action:**" in reply


async def test_a_forced_replay_never_runs_a_comment_command_again_and_says_what_it_skipped(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 5: a command runs once per comment, whoever replays it. `foreman replay ID --force` of the
    delivery that ran `/heartbeat` runs the delivery's handlers again but not the command (the lease's heartbeat
    stays where the first run put it, one reply), and the replay's answer and record name what it skipped."""
    leases = LeaseStore(world.service.db)
    comment_id = await world.comment("author-1", 1, "/heartbeat")
    [lease] = await leases.open_leases(FULL_NAME)
    [delivery] = [d for d in await world.service.store.list(limit=1000)
                  if d.event == "issue_comment" and json.loads(d.body)["comment"]["id"] == comment_id]
    assert delivery.status == "done"
    await asyncio.sleep(0.05)  # a second run would move the heartbeat
    for name, value in world.cli_env().items():
        monkeypatch.setenv(name, value)
    from bot.cli import main

    assert await asyncio.to_thread(main, ["replay", str(delivery.pk), "--force", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "queued", doc
    skipped = dict(doc["skipped"][0])
    assert len(doc["skipped"]) == 1, doc
    assert skipped.pop("finished_at"), doc
    assert skipped == {"repository": FULL_NAME, "comment": comment_id, "command": "/heartbeat",
                       "ran_for_delivery": delivery.delivery_id}
    async with world.service.db.reader.execute(
        "SELECT skipped_json FROM delivery_replays WHERE delivery_pk = ?", (delivery.pk,)
    ) as cur:
        [(recorded,)] = [tuple(row) for row in await cur.fetchall()]
    assert json.loads(recorded) == doc["skipped"]
    await _settle_replay(world, delivery.delivery_id)
    [after] = await leases.open_leases(FULL_NAME)
    assert after.heartbeat_at == lease.heartbeat_at and after.expires_at == lease.expires_at
    assert sum(1 for body in replies(world, 1) if find_marker(body) == f"command:{comment_id}:reply") == 1
    # The text form says it in a sentence; a second forced replay skips it again.
    assert await asyncio.to_thread(main, ["replay", delivery.delivery_id, "--force"]) == 0
    text = capsys.readouterr().out
    assert f"skipped: the command /heartbeat of comment {comment_id} on {FULL_NAME} already ran" in text, text
    await _settle_replay(world, delivery.delivery_id)
    [still] = await leases.open_leases(FULL_NAME)
    assert still.heartbeat_at == lease.heartbeat_at


async def _settle_replay(world: World, delivery_id: str) -> None:
    world.service.worker.wakeup.set()
    world.settled.discard(delivery_id)
    await world.wait_settled(delivery_id, asyncio.get_running_loop().time() + 10.0)
    await world.settle()
