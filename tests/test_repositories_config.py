"""[[repositories]]: many repositories in one process; each one's settings view, its outbox entries its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_settings
from bot.core.dispatch import refuse_dispatch
from state.db import Database, utcnow
from state.outbox import OutboxIntent, OutboxStore, cancel_issue_entries
from tests.support import SECRET

HEAD = f'[webhook]\nsecrets = ["{SECRET}"]\n[roster]\n"author-1" = ["author"]\n'
TWO = HEAD + """
[[repositories]]
owner = "acme"
name = "widgets"
[[repositories]]
owner = "acme"
name = "gadgets"
checkout_root = "elsewhere"
roster = { "author-2" = ["author"] }
[repositories.allocator]
auto = false
[repositories.merge]
style = "squash"
"""


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "foreman.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ=environ or {})


def test_each_repository_has_its_own_view_with_its_overrides(tmp_path: Path) -> None:
    settings = _load(tmp_path, TWO)
    assert settings.repository_keys() == ["acme/widgets", "acme/gadgets"]
    assert settings.repo_key == "acme/widgets"  # the first entry, never org/repo
    widgets = settings.for_repository("acme/widgets")
    gadgets = settings.for_repository("acme/gadgets")
    assert (widgets.repo_key, widgets.authors(), widgets.auto_allocation(), widgets.merge.style) == (
        "acme/widgets", ["author-1"], True, "merge")
    assert (gadgets.repo_key, gadgets.authors(), gadgets.auto_allocation(), gadgets.merge.style) == (
        "acme/gadgets", ["author-2"], False, "squash")
    assert gadgets.repository.checkout_root == tmp_path / "elsewhere"  # relative: against the config's folder
    assert widgets.repository.checkout_root == tmp_path / "var" / "checkouts"
    assert widgets.repositories == [] and gadgets.repositories == []
    assert settings.find_repository("ACME/Gadgets") == "acme/gadgets"
    assert settings.find_repository("acme/other") is None
    with pytest.raises(KeyError):
        settings.for_repository("acme/other")


def test_both_tables_are_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, TWO + '[repository]\nowner = "acme"\nname = "widgets"\n')
    assert caught.value.key == "repositories" and "not both" in caught.value.message
    with pytest.raises(ConfigError) as by_env:  # an override of the single table counts as giving it
        _load(tmp_path, TWO, {"FOREMAN_REPOSITORY__OWNER": "acme"})
    assert by_env.value.key == "repositories"


def test_a_repository_listed_twice_is_refused_naming_both_entries(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, TWO + '[[repositories]]\nowner = "ACME"\nname = "Widgets"\n')
    assert caught.value.key == "repositories.2" and "repositories.0" in caught.value.message


def test_the_single_repository_table_and_its_env_overrides_work_as_before(tmp_path: Path) -> None:
    settings = _load(tmp_path, HEAD + '[repository]\nowner = "acme"\nname = "widgets"\n',
                     {"FOREMAN_REPOSITORY__NAME": "gadgets"})
    assert settings.repository_keys() == ["acme/gadgets"]
    view = settings.for_repository("acme/gadgets")
    assert view.repository == settings.repository and view.roster == settings.roster


def test_an_identity_token_may_belong_to_a_repository_roster_login(tmp_path: Path) -> None:
    settings = _load(tmp_path, TWO + '[gitea.identity_tokens]\n"author-2" = "tok-author-2"\n')
    assert settings.identity_token("author-2") == "tok-author-2"


def test_routing_names_the_unconfigured_repository() -> None:
    served = frozenset({"acme/widgets", "acme/gadgets"})
    assert refuse_dispatch({"repository": {"full_name": "ACME/Gadgets"}}, served) is None
    refusal = refuse_dispatch({"repository": {"full_name": "acme/unlisted"}}, served)
    assert refusal is not None and refusal.outcome == "ignored" and "acme/unlisted" in refusal.reason


async def test_outbox_entries_of_two_repositories_issue_1_stay_apart(tmp_path: Path) -> None:
    """The same idempotency key for #1 in two repositories is two entries; each repository's #1 has its own head,
    and cancelling one repository's #1 (the issue was deleted) leaves the other's untouched."""
    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        for repo in ("acme/widgets", "acme/gadgets"):
            assert await store.add(OutboxIntent("merge:1:2:labels", 1, "labels", {"add": ["x"]}, repo=repo))
            assert not await store.add(OutboxIntent("merge:1:2:labels", 1, "labels", {"add": ["x"]}, repo=repo))
            assert await store.add(OutboxIntent("second", 1, "labels", {"add": ["y"]}, repo=repo))
        heads = await store.due_heads(claim_ttl_s=60, limit=10)
        assert sorted((e.repo, e.key) for e in heads) == [("acme/gadgets", "merge:1:2:labels"),
                                                           ("acme/widgets", "merge:1:2:labels")]
        async with db.transaction() as conn:
            assert await cancel_issue_entries(conn, 1, reason="deleted", now=utcnow(), repo="acme/widgets") == 2
        left = {(e.repo, e.key, e.status) for e in await store.list(limit=10)}
        assert {(r, k) for r, k, s in left if s == "pending"} == {("acme/gadgets", "merge:1:2:labels"),
                                                                  ("acme/gadgets", "second")}
        assert [e.key for e in await store.for_issue(1, repo="acme/gadgets")] == ["merge:1:2:labels", "second"]
    finally:
        await db.close()


def test_a_repositorys_own_grants_are_checked_naming_their_key(tmp_path: Path) -> None:
    bad = TWO + ('[repositories.grants."author.implement"]\n'
                 'calls = [{ tool = "gitea_get_issue_state", effect = "read" }]\n')  # no reserved teardown last
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, bad)
    assert all(key.startswith("repositories.1.grants.author.implement") for key, _ in caught.value.errors), (
        caught.value.errors)


async def test_entries_stored_before_repositories_are_the_first_repositorys(tmp_path: Path) -> None:
    """An entry without a repository (stored before schema 13) is filed under the first configured repository
    when the service starts; until then it is no repository's (no scoped read returns it)."""
    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        assert await store.add(OutboxIntent("old", 3, "labels", {"add": ["x"]}), repo="acme/widgets")
        async with db.transaction() as conn:  # as schema 13 left a row stored before it: repo ''
            await conn.execute("UPDATE outbox SET repo = '' WHERE idempotency_key = 'old'")
        assert await store.for_issue(3, repo="acme/widgets") == []
        assert [e.repo for e in await store.for_issue(3)] == [""]
        assert await store.adopt_unscoped("acme/widgets") == 1
        assert await store.adopt_unscoped("acme/widgets") == 0
        assert [e.repo for e in await store.list(limit=10)] == ["acme/widgets"]
    finally:
        await db.close()


async def test_the_sender_parks_an_entry_of_a_repository_no_longer_served(tmp_path: Path) -> None:
    """An entry whose repository left the configuration is parked naming it (never sent to another repository)."""
    from bot.config_sections import OutboxConfig
    from bot.metrics import Metrics
    from bot.outbox import OutboxSender

    db = await Database.open(tmp_path / "f.db")
    try:
        store = OutboxStore(db)
        assert await store.add(OutboxIntent("k", 1, "labels", {"add": ["x"]}, repo="acme/gone"))
        sent: list[str] = []

        class Nowhere:
            owner = "acme"

            def __getattr__(self, name: str) -> object:
                sent.append(name)
                raise AssertionError(f"{name} must not be called")

        sender = OutboxSender(store, Nowhere(), OutboxConfig(), Metrics(),  # type: ignore[arg-type]
                              clients=lambda repo: None)
        assert await sender.run_once() == 1
        [entry] = await store.list(limit=10)
        assert entry.status == "parked" and "acme/gone" in (entry.last_error or "") and sent == []
    finally:
        await db.close()


async def test_check_config_checks_every_served_repository(tmp_path: Path) -> None:
    """A listed repository Gitea does not have fails its own check, named; the others still pass theirs."""
    from bot.cli.check_config import _gitea_checks
    from tests.gitea_fixtures import BOT, TOKENS, live_emulator

    async with live_emulator() as live:
        text = TWO.replace('name = "gadgets"', 'name = "missing"') + (
            f'[gitea]\nurl = "{live.base_url}"\ntoken = "{TOKENS[BOT]}"\nbot_login = "{BOT}"\n')
        checks = await _gitea_checks(_load(tmp_path, text))
    assert [(c["check"], c.get("repository"), c["status"]) for c in checks][3:] == [
        ("repository", "acme/widgets", "ok"), ("permission", "acme/widgets", "ok"),
        ("repository", "acme/missing", "failed"), ("permission", "acme/missing", "skipped")]
    assert "acme/missing" in checks[5]["detail"]
