"""``[organization]``: its configuration (typed errors naming keys), the discovery verdict and what it changes in a
running service, and the emulator's ``GET /orgs/{org}/repos`` as Gitea pages and filters it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.cli.common import repository_view
from bot.config import ConfigError, Settings, load_settings
from bot.discovery import Discovered, discovery_changes, plan_discovery
from bot.gitea import GiteaClient
from bot.gitea.errors import GiteaNotFound
from tests.gitea_fixtures import OWNER, TOKENS, live_emulator, seed_sibling_repository
from tests.support import SECRET

HEAD = f'[webhook]\nsecrets = ["{SECRET}"]\n[roster]\n"author-1" = ["author"]\n'
ORG = HEAD + """
[organization]
name = "acme"
exclude = ["Legacy"]
roster = { "author-3" = ["author"] }
[[repositories]]
owner = "acme"
name = "gadgets"
checkout_root = "elsewhere"
roster = { "author-2" = ["author"] }
"""


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "foreman.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ={})


@dataclass(frozen=True)
class Listed:
    owner: str
    name: str
    raw: Mapping[str, Any] = field(default_factory=dict)


def test_an_organization_serves_its_explicit_entries_and_gives_discovered_ones_its_defaults(tmp_path: Path) -> None:
    settings = _load(tmp_path, ORG)
    assert settings.repository_keys() == ["acme/gadgets"]  # never the defaulted org/repo
    org = settings.organization
    assert org is not None and org.checkout_root == tmp_path / "var" / "checkouts"  # [repository]'s default
    assert org.excludes("LEGACY") and not org.excludes("widgets")
    running = settings.with_repositories([*settings.repositories, org.entry_for("widgets")])
    widgets = running.for_repository("acme/widgets")
    assert widgets.authors() == ["author-3"] and widgets.repository.checkout_root == tmp_path / "var" / "checkouts"
    assert widgets.organization is None and widgets.repository_keys() == ["acme/widgets"]
    gadgets = running.for_repository("acme/gadgets")
    assert gadgets.authors() == ["author-2"] and gadgets.repository.checkout_root == tmp_path / "elsewhere"
    assert "author-3" in settings.all_roster_logins()


def test_a_command_on_one_repository_with_only_an_organization_is_a_typed_refusal(tmp_path: Path) -> None:
    settings = _load(tmp_path, HEAD + '[organization]\nname = "acme"\n')
    refusal = repository_view(settings, None, command="leases")
    assert isinstance(refusal, dict) and refusal["error"] == "invalid_input" and refusal["repositories"] == []
    assert "discovered by `foreman serve` only" in refusal["message"]
    assert refusal["exact_next_action"].startswith('add [[repositories]] owner = "acme"')
    assert repository_view(settings, "acme/widgets", command="leases")["error"] == "invalid_input"  # type: ignore[index]
    assert repository_view(settings, None, command="deliveries") is settings  # every repository's inbox: none


def test_without_an_explicit_entry_nothing_is_served_until_discovery(tmp_path: Path) -> None:
    settings = _load(tmp_path, HEAD + '[organization]\nname = "acme"\ncheckout_root = "org-checkouts"\n')
    assert settings.repository_keys() == [] and settings.served_repositories() == []
    assert settings.organization is not None  # a relative root: against the config's folder
    assert settings.organization.entry_for("w").checkout_root == tmp_path / "org-checkouts"


@pytest.mark.parametrize(("text", "key", "words"), [
    (HEAD + '[organization]\nname = "acme"\n[repository]\nowner = "acme"\nname = "widgets"\n', "organization",
     "not both"),
    (HEAD + '[organization]\nname = "acme/widgets"\n', "organization.name", "no organization login"),
    (HEAD + '[organization]\nname = ""\n', "organization.name", "at least 1"),
    (HEAD + '[organization]\nname = "acme"\nexclude = ["acme/legacy"]\n', "organization.exclude", "bare"),
    (HEAD + '[organization]\nname = "acme"\nwhat = 1\n', "organization.what", "Extra inputs"),
    (ORG.replace('name = "gadgets"', 'name = "legacy"'), "repositories.0", "organization.exclude"),
])
def test_organization_errors_are_typed_and_name_their_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert caught.value.key == key and words in caught.value.message, caught.value.errors


def test_the_verdict_leaves_out_excluded_archived_and_foreign_repositories(tmp_path: Path) -> None:
    org = _load(tmp_path, ORG).organization
    assert org is not None
    verdict = plan_discovery(org, [Listed("acme", "widgets"), Listed("Acme", "legacy"),
                                   Listed("acme", "old", {"archived": True}), Listed("other", "x"),
                                   Listed("acme", "gadgets", {"archived": False})])
    assert verdict.serve == ("widgets", "gadgets")
    assert verdict.skipped == {"Acme/legacy": "excluded (organization.exclude)", "acme/old": "archived",
                               "other/x": "owned by other, not acme"}


def test_changes_serve_the_new_let_go_the_gone_and_never_touch_explicit_entries(tmp_path: Path) -> None:
    org = _load(tmp_path, ORG).organization
    assert org is not None
    verdict = Discovered(("Widgets", "tools"), {"acme/old": "archived"})
    changes = discovery_changes(org, verdict, served={"acme/gadgets", "acme/widgets", "acme/old", "acme/gone"},
                                discovered={"acme/widgets", "acme/old", "acme/gone"}, explicit={"acme/gadgets"})
    assert [(e.owner, e.name) for e in changes.serve] == [("acme", "tools")]
    assert changes.let_go == {"acme/old": "archived", "acme/gone": "no longer listed in acme"}
    # An explicit entry the listing names is served as configured (its overrides), never twice.
    again = discovery_changes(org, Discovered(("gadgets",), {}), served=set(), discovered=set(),
                              explicit={"acme/gadgets"})
    assert again.serve == () and again.let_go == {}


async def test_the_emulator_lists_an_organizations_repositories_as_gitea_pages_them() -> None:
    async with live_emulator() as live:
        emu = live.emulator
        for index in range(3):
            seed_sibling_repository(emu, f"r{index}")
        emu.create_repo(OWNER, "secret", private=True)
        emu.make_org(OWNER)
        emu.archive_repo(OWNER, "r1")
        bob = GiteaClient(live.session, base_url=live.base_url, token=TOKENS["bob"], owner=OWNER, repo="widgets")
        # Two per page: the client follows Link; bob cannot see the private one, which still counts in the total.
        names = [(r.name, r.raw["archived"]) for r in await bob.list_org_repos(OWNER, page_size=2)]
        assert names == [("widgets", False), ("r0", False), ("r1", True), ("r2", False)]
        pages = [r for r in emu.requests if r.path == f"/api/v1/orgs/{OWNER}/repos"]
        assert [dict(r.query)["page"] for r in pages] == ["1", "2", "3"]
        async with live.session.get(f"{live.base_url}/api/v1/orgs/{OWNER}/repos?limit=2&page=3",
                                    headers={"Authorization": f"token {TOKENS['bob']}"}) as resp:
            assert resp.headers["X-Total-Count"] == "5" and [r["name"] for r in await resp.json()] == []
            assert 'rel="prev"' in resp.headers["Link"] and 'rel="next"' not in resp.headers["Link"]
        admin = GiteaClient(live.session, base_url=live.base_url, token=TOKENS["root"], owner=OWNER, repo="widgets")
        assert [r.name for r in await admin.list_org_repos(OWNER)] == ["widgets", "r0", "r1", "r2", "secret"]
        with pytest.raises(GiteaNotFound):
            await admin.list_org_repos("alice")  # a user, not an organization
