"""What runs on its own in each served repository touches only that repository's rows."""

from __future__ import annotations

from pathlib import Path

from bot.config import load_settings
from bot.config_sections import RepositoryConfig
from bot.core.canonical.parsing import parse_comment
from bot.core.evidence import render_evidence
from bot.core.issue_state import CommentObservation, IssueObservation, Trust
from bot.dashboard.model import grants, issue_view
from bot.loops.run_teardowns import run_due_teardowns
from state.db import Database, to_db_time, utcnow
from state.issues import IssueStore
from state.leases import LeaseStore
from state.outbox import OutboxIntent, OutboxStore
from tests.support import canonical_state
from tests.test_grants import REPO
from tests.test_grants_mcp import bound_run
from tests.test_repositories_runs import started_run, two_repositories


async def test_a_repositorys_teardown_loop_leaves_another_repositorys_due_run_alone(tmp_path: Path) -> None:
    """Each served repository has its runs' teardown loop; a due run of acme/widgets is never torn down by the
    loop of another repository (through that repository's door and roster), only by its own."""
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("operator stop")).ok
        other = bound.settings.model_copy(update={"repository": RepositoryConfig(owner="acme", name="gadgets")})
        assert await run_due_teardowns(bound.db, other, bound.runtime) == []
        live = await LeaseStore(bound.db).history(bound.settings.repo_key, 8)
        assert [lease.status for lease in live] == ["live"]
        [report] = await run_due_teardowns(bound.db, bound.settings, bound.runtime)
        assert report["ok"], report


WIDGETS, GADGETS = "acme/widgets", "acme/gadgets"


def _comment(key: str, number: int, state: str) -> OutboxIntent:
    body = render_evidence(key=key, summary=f"#{number} is {state}.", state=canonical_state(state), evidence={})
    return OutboxIntent(key, number, "comment", {"body": body})


async def test_a_repositorys_label_sync_ignores_another_repositorys_open_outbox_entries(tmp_path: Path) -> None:
    """acme/widgets #1 has a label change and a newer state comment still waiting in the outbox; a trusted state
    comment on acme/gadgets #1 plans its own label sync as if they did not exist: its change is queued (not
    taken as already on its way, not held behind widgets' state)."""
    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        assert await store.add(OutboxIntent("w:labels", 1, "labels", {"add": ["status:in-progress"]}), repo=WIDGETS)
        assert await store.add(_comment("w:state", 1, "blocked"), repo=WIDGETS)
        body = render_evidence(key="g:state", summary="#1 is in progress.", state=canonical_state(), evidence={})
        moment = to_db_time(utcnow())
        await IssueStore(db).record_comment(
            CommentObservation(repo=GADGETS, number=1, comment_id=77, action="created", author="controller-bot",
                               created_at=moment, updated_at=moment, delivery_id="d-g1",
                               body_sha256=CommentObservation.body_hash(body), parsed=parse_comment(body),
                               trust=Trust(True, "writer")),
            IssueObservation(number=1, is_open=True, labels=(), updated_at=None),
        )
        [sync] = await IssueStore(db).label_syncs(GADGETS, 1)
        assert sync["outcome"] == "queued", sync
        [queued] = [e for e in await store.for_issue(1, repo=GADGETS) if e.kind == "labels"]
        assert queued.payload["add"] == ["status:in-progress"]
    finally:
        await db.close()


async def test_a_deleted_issue_cancels_only_its_own_repositorys_entries(tmp_path: Path) -> None:
    """issues/deleted of acme/gadgets #5 (recorded outside any door) parks gadgets' open entries of #5 only."""
    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        for repo in (WIDGETS, GADGETS):
            assert await store.add(OutboxIntent("k:labels", 5, "labels", {"add": ["x"]}), repo=repo)
        ended, cancelled, duplicate = await IssueStore(db).record_issue_deleted(GADGETS, 5, sender="alice",
                                                                                delivery_id="d-del")
        assert (ended, cancelled, duplicate) == (0, 1, False)
        assert [e.status for e in await store.for_issue(5, repo=WIDGETS)] == ["pending"]
        assert [e.status for e in await store.for_issue(5, repo=GADGETS)] == ["parked"]
    finally:
        await db.close()


async def test_outbox_reads_by_key_and_issue_are_scoped_to_one_repository(tmp_path: Path) -> None:
    """Keys are unique per repository: the same key and issue number in two repositories are two entries, each
    read back under its own repository (pending comments, unsettled counts, evidence comments included)."""
    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        assert await store.add(_comment("auto-proof:3:0", 3, "blocked"), repo=WIDGETS)
        assert await store.add(_comment("lease-1:evidence", 3, "in-progress"), repo=WIDGETS)
        assert await store.comment_statuses("auto-proof:3:", repo=WIDGETS) == ["pending"]
        assert await store.comment_statuses("auto-proof:3:", repo=GADGETS) == []  # not "already on its way"
        assert await store.by_key("auto-proof:3:0", repo=GADGETS) is None
        assert await store.unsettled_for_issue(3, repo=GADGETS) == 0
        assert await store.evidence_comments(limit=10, repo=GADGETS) == []
        assert await store.add(_comment("auto-proof:3:0", 3, "blocked"), repo=GADGETS)
        found = await store.by_key("auto-proof:3:0", repo=GADGETS)
        assert found is not None and found.repo == GADGETS
        assert await store.unsettled_for_issue(3, repo=WIDGETS) == 2
        assert [e.repo for e in await store.evidence_comments(limit=10, repo=WIDGETS)] == [WIDGETS]
    finally:
        await db.close()


async def test_the_dashboard_shows_a_repositorys_own_runs_only(tmp_path: Path) -> None:
    """A run of org/repo #8 is on org/repo's #8 page and grants section, not on acme/widgets' of the same number."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    run_id, _ = await started_run(settings)
    db = await Database.open(settings.database.path)
    try:
        assert await grants(db, repo="acme/widgets", issue=8) == []
        assert await grants(db, repo="acme/widgets") == []
        assert [g["run"]["run_id"] for g in await grants(db, repo=REPO, issue=8)] == [run_id]
        widgets_page = await issue_view(db, settings.for_repository("acme/widgets"), 8)
        own_page = await issue_view(db, settings.for_repository(REPO), 8)
        assert widgets_page["grants"] == [] and [g["run"]["run_id"] for g in own_page["grants"]] == [run_id]
    finally:
        await db.close()
