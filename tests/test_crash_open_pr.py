"""`foreman serve` killed between Gitea creating an issue's pull request and foreman recording it.

The author asks for the pull request with the `/open-pr` comment command, so the verb runs inside the service; the
crash seam ``FOREMAN_FAULT_AFTER_STEP=pull_created`` makes the service exit hard right after Gitea answered the
create (the PR exists, foreman holds no record of it, the author's lease is still live and nothing is queued).
Started again, the worker resumes the abandoned delivery: the verb adopts the PR Gitea holds, never a second one,
records it, ends the author's lease (``pull_request_opened``) and moves the labels to ``status:review``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from bot import invariants
from bot.config_writer import write_config
from bot.verbs.bootstrap.faults import FAULT_EXIT_CODE, FAULT_STEP_ENV
from state.journal import JournalStore
from state.leases import LeaseStore
from state.publications import PublicationStore
from tests.gitea_fixtures import OWNER, REPO, live_emulator, seed_foreman
from tests.serve_support import ServeProcess
from tests.support import SECRET
from tests.test_crash_burst import Burst, scratch  # noqa: F401 (the fixture)
from tests.test_crash_life import FULL_NAME, ROSTER, STEP_S, TOKENS, Lives, _config, agents

pytestmark = [pytest.mark.process, pytest.mark.slow]


async def test_a_kill_after_gitea_created_the_pull_request_is_answered_by_adopting_it(scratch: Path) -> None:  # noqa: F811
    async with live_emulator() as live:
        emu = live.emulator
        seed_foreman(emu, TOKENS, writers=ROSTER)
        number = emu.create_issue(OWNER, REPO, title="Killed while opening", author="alice").number
        proc = ServeProcess(scratch)
        write_config(proc.config, _config(proc, live.base_url, scratch))
        hook_url = f"{proc.url}/webhook"
        emu.add_hook(OWNER, REPO, url=hook_url, secret=SECRET, events=["issues", "issue_comment", "pull_request"])
        try:
            await proc.serve(env={FAULT_STEP_ENV: "pull_created"})
            async with agents(proc.config) as runtime:
                burst = Burst(0, live, proc, hook_url)
                lives = Lives(0, live, proc, burst, runtime, [])
                db = runtime.db
                await burst.api("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})

                async def bootstrapped() -> bool:
                    return await JournalStore(db).live_registration(FULL_NAME.lower(), number) is not None

                await lives.until(f"bootstrapped #{number}", bootstrapped)
                lease = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
                registration = await JournalStore(db).live_registration(FULL_NAME.lower(), number)
                assert lease is not None and registration is not None
                author = lease.owner
                await lives.until_ok(author, "lock_issue", "locking", issue_number=number)
                Path(registration.worktree_path, "opened.txt").write_text("opened\n", encoding="utf-8")
                await lives.until_ok(author, "publish_worktree", "publishing", issue_number=number,
                                     message="Open me", idempotency_key="publish-1")

                url = live.api(f"/repos/{OWNER}/{REPO}/issues/{number}/comments")
                async with live.session.post(url, json={"body": "/open-pr"},
                                             headers={"Authorization": f"token {TOKENS[author]}"}) as resp:
                    assert resp.status == 201, await resp.text()
                assert proc.proc is not None
                assert await asyncio.wait_for(proc.proc.wait(), STEP_S) == FAULT_EXIT_CODE, proc.stderr.read_text()
                # Gitea holds the PR; foreman recorded nothing: no PR record, the author's lease live, no PR entries.
                [created] = await live.client().list_pulls(state="all")
                assert created.head_ref == registration.branch
                assert await PublicationStore(db).pull_for_issue(FULL_NAME.lower(), number) is None
                still = await LeaseStore(db).live_for_issue(FULL_NAME.lower(), number)
                assert still is not None and still.lease_id == lease.lease_id
                with sqlite3.connect(f"file:{proc.db}?mode=ro", uri=True) as conn:
                    assert conn.execute("SELECT COUNT(*) FROM outbox WHERE idempotency_key LIKE 'pr:%'"
                                        ).fetchone() == (0,)

                await proc.serve()
                await burst.replay_lost()

                async def recorded() -> bool:
                    return await PublicationStore(db).pull_for_issue(FULL_NAME.lower(), number) is not None

                await lives.until("the PR recorded after the restart", recorded)
                await burst.settle()
                record = await PublicationStore(db).pull_for_issue(FULL_NAME.lower(), number)
                assert record is not None and record.pr_number == created.number, (record, created)
                [ended] = [x for x in await LeaseStore(db).history(FULL_NAME.lower(), number)
                           if x.lease_id == lease.lease_id]
                assert ended.status == "released" and ended.end_reason == "pull_request_opened", ended
                violations = invariants.check(await lives.facts(scratch))
            assert await proc.terminate() == 0
        finally:
            await proc.stop()
        assert not violations, "\n".join(map(str, violations))
        # One PR, never a second; the labels mirror the review state.
        assert [p.number for p in await live.client().list_pulls(state="all")] == [created.number]
        status = sorted(label for label in emu.label_names(OWNER, REPO, number) if label.startswith("status:"))
        assert status == ["status:review"], status
