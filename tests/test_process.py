"""Real `foreman serve` processes: crash-and-resume (SIGKILL), graceful shutdown, embedded default start."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.config_writer import merged, write_config
from tests.serve_support import STOP_S, ServeProcess, run_foreman, serve_process
from tests.support import emulator_sections, payload, webhook_headers

pytestmark = [pytest.mark.process]


@pytest.fixture
async def proc(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    async with serve_process(tmp_path, module="tests.crash_service") as service:
        yield service


async def test_a_delivery_killed_mid_handler_resumes_after_restart_without_rerunning_finished_handlers(
    proc: ServeProcess,
) -> None:
    """A process SIGKILLed mid-delivery resumes it on restart; the finished sibling is not rerun."""
    await proc.start()
    assert await proc.post(payload(), "crash-1") == 202
    await proc.wait_for(lambda: "slow-start crash-1" in proc.lines(), "the slow handler to start")
    await proc.kill()
    assert proc.status("crash-1") == ("processing", 1)
    proc.gate.touch()
    await proc.start()
    await proc.wait_for(lambda: proc.status("crash-1") == ("done", 2), "the delivery to finish after restart")
    lines = proc.lines()
    assert lines.count("fast crash-1") == 1
    assert lines.count("slow-start crash-1") == 2
    assert lines.count("slow-end crash-1") == 1
    assert await proc.terminate() == 0


async def test_every_acknowledged_delivery_survives_a_kill_right_after_the_202(proc: ServeProcess) -> None:
    """A delivery is stored before the 202, so killing the process right after loses none."""
    proc.gate.touch()
    await proc.start()
    ids = [f"ack-{i}" for i in range(25)]
    statuses = await asyncio.gather(*(proc.post(payload(number=i + 1), d) for i, d in enumerate(ids)))
    assert set(statuses) == {202}
    await proc.kill()
    stored = [proc.status(d) for d in ids]
    assert all(s is not None for s in stored), stored
    await proc.start()
    await proc.wait_for(lambda: all((proc.status(d) or ("",))[0] == "done" for d in ids), "every delivery done")
    lines = proc.lines()
    assert all(f"slow-end {d}" in lines for d in ids)


async def test_sigterm_lets_in_flight_work_finish_within_the_grace(tmp_path: Path) -> None:
    """Graceful shutdown finishes in-flight work when it ends within the grace period (a minute here: the work ends
    once the shutdown is seen waiting for it, which on a loaded machine can take seconds)."""
    grace = {"server": {"shutdown_grace_s": 60.0}}
    async with serve_process(tmp_path, module="tests.crash_service", overrides=grace) as proc:
        await proc.start()
        await proc.post(payload(), "grace-1")
        await proc.wait_for(lambda: "slow-start grace-1" in proc.lines(), "the slow handler to start")
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        await proc.wait_for(lambda: "for 1 in-flight deliveries" in proc.tail(), "the shutdown to wait for it")
        proc.gate.touch()
        assert await asyncio.wait_for(proc.proc.wait(), timeout=STOP_S) == 0
    assert proc.status("grace-1") == ("done", 1)


async def test_sigterm_past_the_grace_puts_the_delivery_back_for_the_next_start(proc: ServeProcess) -> None:
    """Work that outlives the grace period is safely abandoned (queued again, attempt not counted)."""
    await proc.start()
    await proc.post(payload(), "abandon-1")
    await proc.wait_for(lambda: "slow-start abandon-1" in proc.lines(), "the slow handler to start")
    assert await proc.terminate() == 0
    assert proc.status("abandon-1") == ("queued", 0)
    proc.gate.touch()
    await proc.start()
    await proc.wait_for(lambda: proc.status("abandon-1") == ("done", 1), "the delivery to run on the next start")


async def test_embedded_default_starts_with_a_generated_secret_and_no_gitea(tmp_path: Path) -> None:
    """No config edits needed: a secret is generated under var/ (0600), reused, and /readyz
    reports that Gitea is not reachable instead of crashing."""
    async with serve_process(tmp_path, config=tmp_path / "unused.toml") as service:
        env = {"FOREMAN_SERVER__PORT": str(service.port), "FOREMAN_CONFIG": ""}
        await service.start("serve", env=env)
        secret_file = tmp_path / "var" / "webhook-secret"
        assert secret_file.is_file()
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert str(secret_file) in service.stderr.read_text()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{service.url}/readyz") as resp:
                doc = await resp.json()
        assert resp.status == 200 and doc["checks"]["gitea"]["ok"] is False
        secret = secret_file.read_text().strip()
        body = payload()
        headers = webhook_headers(body, secret=secret)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{service.url}/webhook", data=body, headers=headers) as resp:
                assert resp.status == 202
        assert await service.terminate() == 0
        await service.start("serve", env=env)
        assert await service.terminate() == 0
    assert secret_file.read_text().strip() == secret


async def test_an_explicitly_empty_secret_list_refuses_to_start(tmp_path: Path) -> None:
    """`secrets = []` refuses to start, exit 2, with an error naming webhook.secrets."""
    config = write_config(tmp_path / "foreman.toml", {"webhook": {"secrets": []}})
    code, _, err = await run_foreman("serve", "--config", str(config), cwd=tmp_path)
    assert code == 2
    doc = json.loads(err.strip().splitlines()[-1])
    assert doc["key"] == "webhook.secrets" and "empty" in doc["message"]


async def test_an_outbox_comment_posted_just_before_a_kill_is_adopted_after_restart(tmp_path: Path) -> None:
    """The process is SIGKILLed after Gitea stored the comment but before the outbox commit;
    after the restart the marker is found and the comment adopted: exactly one comment."""
    from bot.core.evidence import render_evidence
    from state.db import Database
    from state.outbox import OutboxIntent, OutboxStore
    from tests.gitea_fixtures import OWNER, REPO, live_emulator

    async with live_emulator() as live:
        live.emulator.create_issue(OWNER, REPO, title="evidence", author="alice")
        # Gitea holds its answer long enough for the test to see the comment stored and kill the service first,
        # however loaded the machine; the service waits longer still.
        outbox = {"outbox": {"claim_ttl_s": 0.5, "backoff_base_s": 0.05, "poll_interval_s": 0.05},
                  "gitea": {"timeout_s": 60.0}}
        service = ServeProcess(tmp_path, overrides=merged(emulator_sections(live.base_url), outbox))
        body = render_evidence(key="kill-1", summary="Leased #1.", state=None, evidence={"issue": 1})
        db = await Database.open(service.db)
        await OutboxStore(db).add(OutboxIntent("kill-1", 1, "comment", {"body": body}), repo="acme/widgets")
        await db.close()

        def comments() -> list[str]:
            return [c.body for c in live.emulator.issue(OWNER, REPO, 1).comments if c.kind == "comment"]

        def outbox_row() -> tuple[str, int]:
            with sqlite3.connect(service.db) as conn:
                row: tuple[str, int] = conn.execute(
                    "SELECT status, attempts FROM outbox WHERE idempotency_key = 'kill-1'").fetchone()
                return row

        comments_route = "/repos/{owner}/{repo}/issues/{index}/comments"
        live.emulator.faults.delay("POST", comments_route, 15.0, times=1, after_store=True)
        try:
            await service.serve()
            await service.wait_for(lambda: len(comments()) == 1, "Gitea to store the comment")
            await service.kill()
            assert outbox_row() == ("sending", 1)
            await service.serve()
            await service.wait_for(lambda: outbox_row()[0] == "done", "the outbox entry to be settled")
            assert await service.terminate() == 0
        finally:
            await service.stop()
        assert comments() == [body]
        with sqlite3.connect(service.db) as conn:
            result = json.loads(conn.execute("SELECT result_json FROM outbox").fetchone()[0])
        assert result["adopted"] is True and result["verified"] is True


async def test_a_start_that_never_becomes_healthy_leaves_no_process_behind(tmp_path: Path) -> None:
    """A process that never answers /healthz (here one that only sleeps) is killed by the failed start itself, so no
    test leaks a server whatever it does with the failure."""
    sleeper = ServeProcess(tmp_path, module="timeit")
    with pytest.raises(AssertionError, match="never became healthy"):
        await sleeper.start("-n", "1", "import time; time.sleep(600)", healthy_s=1.0)
    assert sleeper.proc is not None and sleeper.proc.returncode is not None
