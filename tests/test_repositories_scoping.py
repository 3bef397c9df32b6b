"""What runs on its own in each served repository touches only that repository's rows."""

from __future__ import annotations

from pathlib import Path

from bot.config_sections import RepositoryConfig
from bot.verbs.runs.auto_teardown import run_due_teardowns
from state.leases import LeaseStore
from tests.test_grants_mcp import bound_run


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
