"""The review and merge queues as the operator sees them, against the emulator and a running service: `foreman
queue` (text and --json), `/dashboard/api/queue` and the dashboard's Queues section (token or 401, titles escaped),
and the queue facts `foreman invariants` gathers (queues.review_waits, queues.merge_waits past the bound)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot import invariants
from bot.core.bootstrap import branch_for
from bot.invariants.facts import DbFacts, Facts, GiteaFacts, QueueFacts
from state.db import utcnow
from state.leases import LeaseStore
from tests.gitea_fixtures import BOT, OWNER, REPO
from tests.review_support import LOOP, ROSTER, ok
from tests.support import SECRET, Started
from tests.world import FULL_NAME, Sections, World, open_world

TOKEN = "dash-token-queue-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Agent (and user) text is hostile: markup for the page, an escape sequence for the terminal.
TITLE = '<script>alert("q")</script> & \x1b[2J blue'


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    sections: Sections = {**LOOP, "dashboard": {"token": TOKEN}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as opened:
        yield opened


async def in_review(world: World) -> tuple[int, int]:
    """An issue with a hostile title implemented by author-1 (leased, bootstrapped, pushed), its PR open by
    author-1, `status:review`, the implement lease handed over: (issue, pull request)."""
    number = await world.open_issue("alice", TITLE)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [lease] = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert (lease.owner, lease.action, lease.status) == ("author-1", "implement", "live")
    emu = world.live.emulator
    branch = branch_for(number, TITLE)
    emu.push_commit(OWNER, REPO, branch, {"widget.txt": "blue\n"}, pusher="author-1", message="Blue")
    pull = emu.create_pull(OWNER, REPO, head=branch, title="Blue", author="author-1", body=f"Closes #{number}")
    state = {"state": "review", "who_is_next": "reviewer", "next_action": "a reviewer claims the review",
             "next_prompt": "", "what_happened": f"opened PR #{pull.number}", "why": "implemented",
             "related_prs": [pull.number], "blockers": "none", "validation": "pushed"}
    await ok(world, "controller-bot", "gitea_post_issue_state", issue_number=number, state=state)
    await ok(world, "author-1", "gitea_release_lease", issue_number=number, reason="pull request opened")
    assert world.labels(number) == ["status:review"]
    return number, pull.number


async def foreman_queue(world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                        *args: str) -> tuple[int, str, str]:
    from bot.cli import main

    for name, value in world.cli_env().items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["queue", *args])
    out, err = capsys.readouterr()
    return code, out, err


async def queue_facts(world: World, now: Any) -> QueueFacts:
    """The facts `foreman invariants` reads, with both queues running by themselves (this world hands reviews and
    merges out as a controller would, so it runs neither)."""
    settings = world.service.settings
    running = settings.model_copy(update={"allocator": settings.allocator.model_copy(
        update={"queues": ["review", "merge"], "auto": True})})
    database = settings.database.postgres_url() or settings.database.path
    return await invariants.gather_queues(world.gitea, database, running, now=now)


def queue_violations(queues: QueueFacts, now: Any) -> list[tuple[str, str]]:
    facts = Facts(db=DbFacts(), gitea=GiteaFacts(), bot_login=BOT, now=now, queues=queues)
    return [(v.invariant, v.subject) for v in invariants.check(facts)]


async def test_the_queues_on_the_command_line_the_dashboard_and_the_invariants(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    number, pull = await in_review(world)

    # foreman queue --json: exactly one JSON document on stdout, the pull request waiting for review.
    code, out, _ = await foreman_queue(world, monkeypatch, capsys, "--json")
    assert code == 0, out
    doc = json.loads(out)
    [waiting] = doc["reviews_waiting"]
    assert (waiting["issue_number"], waiting["pull_number"], waiting["stage"], waiting["title"]) == (
        number, pull, "review", TITLE)
    assert waiting["barred_owners"] == ["author-1"] and waiting["waiting_since"] is not None
    assert isinstance(waiting["waiting_s"], int) and waiting["waiting_s"] >= 0
    # The command's configuration is the defaults beside the world's (both queues, auto-allocation on).
    assert (doc["merges_waiting"], doc["in_hand"], doc["merge_by"], doc["running"]) == ([], [], "merger",
                                                                                        ["merge", "review"])
    assert (doc["idle_reviewers"], doc["idle_mergers"], doc["repository"]) == (["author-2"], ["author-3"],
                                                                              FULL_NAME)
    # The text: one line per pull request, the title's escape sequence shown, never sent to the terminal.
    code, text, _ = await foreman_queue(world, monkeypatch, capsys)
    assert code == 0 and "\x1b" not in text, text
    assert f"#{number}" in text and f"PR #{pull}" in text and "\\x1b[2J" in text and "idle reviewers: author-2" in text

    # The dashboard: 401 without the token; the same document per served repository with it; the title escaped.
    refused = await world.client.get("/dashboard/api/queue")
    assert refused.status == 401 and (await refused.json())["error"] == "not_authorized"
    resp = await world.client.get("/dashboard/api/queue", headers=AUTH)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
    [served] = (await resp.json())["repositories"]
    assert served["repository"] == FULL_NAME and [w["issue_number"] for w in served["reviews_waiting"]] == [number]
    assert served["reviews_waiting"][0]["title"] == TITLE and served["idle_reviewers"] == ["author-2"]
    one = await world.client.get(f"/dashboard/api/queue?repository={FULL_NAME}", headers=AUTH)
    assert [r["repository"] for r in (await one.json())["repositories"]] == [FULL_NAME]
    unknown = await world.client.get("/dashboard/api/queue?repository=acme/else", headers=AUTH)
    assert unknown.status == 400 and (await unknown.json())["error"] == "invalid_input"
    html = await (await world.client.get("/dashboard", headers=AUTH)).text()
    assert 'id="queues"' in html and 'data-test="reviews-waiting"' in html
    assert html.count("<script") == 1 and "&lt;script&gt;alert(&quot;q&quot;)&lt;/script&gt; &amp;" in html
    assert f'<a href="/dashboard/issues/{number}">#{number}</a>' in html

    # The invariant: within the bound nothing; past it, with author-2 idle, the review waits too long.
    now = utcnow()
    assert queue_violations(await queue_facts(world, now), now) == []
    later = now + timedelta(hours=1)
    assert queue_violations(await queue_facts(world, later), later) == [
        ("queues.review_waits", f"#{number} (PR #{pull})")]

    # author-2 claims the review: in hand, nothing waits.
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)
    code, out, _ = await foreman_queue(world, monkeypatch, capsys, "--json")
    doc = json.loads(out)
    assert doc["reviews_waiting"] == [] and doc["idle_reviewers"] == []
    assert [(h["issue_number"], h["owner"], h["action"]) for h in doc["in_hand"]] == [(number, "author-2", "review")]
    assert queue_violations(await queue_facts(world, later), later) == []

    # Approved: it waits to be merged, in approval order, for author-3.
    await ok(world, "author-2", "gitea_submit_review", issue_number=number, verdict="approve")
    code, out, _ = await foreman_queue(world, monkeypatch, capsys, "--json")
    doc = json.loads(out)
    [merge] = doc["merges_waiting"]
    assert (merge["issue_number"], merge["stage"], merge["approved_by"]) == (number, "merge", "author-2")
    assert merge["approved_at"] is not None and doc["reviews_waiting"] == [] and doc["in_hand"] == []
    api = (await (await world.client.get("/dashboard/api/queue", headers=AUTH)).json())["repositories"][0]
    assert [m["issue_number"] for m in api["merges_waiting"]] == [number]
    html = await (await world.client.get("/dashboard", headers=AUTH)).text()
    assert 'data-test="merges-waiting"' in html and html.count("<script") == 1
    later = utcnow() + timedelta(hours=1)
    assert queue_violations(await queue_facts(world, later), later) == [
        ("queues.merge_waits", f"#{number} (PR #{pull})")]

    # foreman invariants gathers the queues too (the merge waits within the bound: no queue violation).
    from bot.cli import main

    code = await asyncio.to_thread(main, ["invariants", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert {"queues.review_waits", "queues.merge_waits", "leases.in_progress_without_lease"} <= set(
        report["checked"])
    assert not [v for v in report["violations"] if v["invariant"].startswith("queues.")], report
    assert code in (0, 1)


def _config(tmp_path: Path, *names: str) -> Path:
    """A config without a Gitea token serving acme/widgets (``[repository]``), or ``names`` ([[repositories]])."""
    served = "".join(f'[[repositories]]\nowner = "acme"\nname = "{name}"\n' for name in names) or (
        f'[repository]\nowner = "acme"\nname = "widgets"\ncheckout_root = "{tmp_path / "checkouts"}"\n')
    path = tmp_path / "foreman.toml"
    path.write_text(f'[webhook]\nsecrets = ["{SECRET}"]\n[database]\npath = "{tmp_path / "foreman.db"}"\n{served}',
                    encoding="utf-8")
    return path


def test_foreman_queue_without_a_gitea_token_refuses_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.cli import main

    for name in [n for n in os.environ if n.startswith("FOREMAN_")]:
        monkeypatch.delenv(name)
    for args in (["queue", "--json"], ["queue"]):
        assert main([*args, "--config", str(_config(tmp_path))]) == 2
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert (doc["error"], doc["key"]) == ("unavailable", "gitea.token") and doc["exact_next_action"], doc
        assert "Traceback" not in err
    # Several served repositories: say which, as every command acting on one does.
    several = str(_config(tmp_path, "widgets", "gadgets"))
    assert main(["queue", "--json", "--config", several]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "invalid_input" and "--repository" in doc["remediate"], doc
    assert main(["queue", "--json", "--config", several, "--repository", "acme/gadgets"]) == 2
    assert json.loads(capsys.readouterr().out)["key"] == "gitea.token"


@pytest.mark.parametrize("command", ["queue", "invariants"])
def test_gitea_unreachable_is_a_typed_refusal_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The queues (and so the invariants) are read from Gitea: a Gitea that does not answer is `unavailable`,
    exit 1, with the next action."""
    from bot.cli import main

    for name in [n for n in os.environ if n.startswith("FOREMAN_")]:
        monkeypatch.delenv(name)
    config = _config(tmp_path)
    config.write_text(config.read_text(encoding="utf-8") + '[gitea]\nurl = "http://127.0.0.1:1"\n'
                      'token = "not-a-real-token"\ntimeout_s = 1.0\n', encoding="utf-8")
    assert main([command, "--json", "--config", str(config)]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"] == "unavailable" and "check-config" in doc["exact_next_action"], doc
    assert "Traceback" not in err and "not-a-real-token" not in out + err
