"""The control checkout's clone URL, the bot's token, a changed origin and an owner Gitea cannot assign."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, load_settings
from bot.config_sections import RepositoryConfig
from bot.gitea import GiteaClient
from bot.verbs import bootstrap as bootstrap_mod
from bot.verbs.bootstrap import BootstrapContext, bootstrap_preflight
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS
from tests.support import HANG_S
from tests.test_bootstrap_support import BootstrapWorld, git, open_bootstrap_world, tree_snapshot

pytestmark = [pytest.mark.process]

#: Every git route of the emulator (githttp.py's resource, as the fault table names it).
GIT_ROUTE = "/{owner}/{repo}/{rest}"


def _database_text(w: BootstrapWorld) -> str:
    """Every row of every table of foreman's database, as SQL text (the journal, the outbox, leases, ...)."""
    with sqlite3.connect(w.settings.database.path) as conn:
        return "\n".join(conn.iterdump())


def _secret_free(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


# --- the bot's token: clone over HTTP, typed refusals that never carry it ---------------------------------------------


async def test_the_control_checkout_is_cloned_over_http_with_the_bots_token_only() -> None:
    """The bootstrap world clones over smart HTTP (git http-backend behind Gitea's rules), with the bot's token
    in an extra header: never in argv, never in ``.git/config``."""
    async with open_bootstrap_world() as w:
        origin = git(w.checkout, "config", "--get", "remote.origin.url")
        assert origin == f"{w.live.base_url}/{OWNER}/{REPO}.git"
        number = w.issue()
        await w.lease(number)
        w.move_main()  # the bootstrap must fetch
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        calls = [r for r in w.live.emulator.requests if r.path.startswith(f"/{OWNER}/{REPO}.git/")]
        assert len({r.path for r in calls}) >= 2 and {r.login for r in calls} == {BOT}
        assert TOKENS[BOT] not in (w.checkout / ".git" / "config").read_text(encoding="utf-8")


async def test_a_wrong_token_is_a_typed_refusal_naming_gitea_token_and_never_shows_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "tok-wrong-0123456789abcdef"
    async with open_bootstrap_world(clone=False, token=wrong) as w:
        number = w.issue()
        await w.lease(number)
        result = await w.bootstrap(number)
        doc = result.to_dict()
        assert result.status == "refused" and result.refusal is not None, doc
        assert result.refusal.error == "not_authorized", doc
        assert result.refusal.reason == "gitea_token_refused"
        assert "gitea.token" in result.refusal.exact_next_action and "foreman check-config" in (
            result.refusal.exact_next_action)
        proof = (await bootstrap_preflight(w.ctx, number, "alice")).to_dict()
        assert not proof["ok"] and proof["checks"]["repo_reachable"]["error"] == "not_authorized"
        assert "gitea.token" in proof["checks"]["repo_reachable"]["exact_next_action"]
        _secret_free(wrong, json.dumps(doc), json.dumps(proof), caplog.text, _database_text(w))


async def test_git_refusing_the_token_is_clone_auth_failed_in_bootstrap_and_preflight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API accepts the token but git's endpoint answers 401 (a proxy in front of git, a token without the
    repository scope for git): the bootstrap refuses ``not_authorized``/``clone_auth_failed`` naming gitea.token
    at once (not ``unavailable``, which would be retried), the preflight says the same; the token appears
    nowhere: not in the refusal, the journal (a completed transition is there), the outbox or the logs."""
    caplog.set_level(logging.DEBUG)
    token = TOKENS[BOT]
    async with open_bootstrap_world() as w:
        first = w.issue()
        await w.lease(first)
        assert (await w.bootstrap(first)).status == "completed"
        number = w.issue("Another one")
        await w.lease(number, owner="bob")
        w.move_main()  # the next bootstrap fetches
        w.live.emulator.faults.fail("*", GIT_ROUTE, status=401, times=100, message="Unauthorized")
        result = await w.bootstrap(number, caller="bob")
        doc = result.to_dict()
        assert result.status == "refused" and result.refusal is not None, doc
        assert result.refusal.error == "not_authorized" and result.refusal.reason == "clone_auth_failed"
        assert "gitea.token" in result.refusal.exact_next_action
        proof = (await bootstrap_preflight(w.ctx, number, "bob")).to_dict()
        reach = proof["checks"]["repo_reachable"]
        assert not reach["ok"] and reach["error"] == "not_authorized" and reach["reason"] == "clone_auth_failed"
        assert "gitea.token" in reach["exact_next_action"]
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(1,)]
        _secret_free(token, json.dumps(doc), json.dumps(proof), caplog.text, _database_text(w))


@pytest.mark.parametrize("clone_protocol", ["file", "http"])
async def test_both_clone_protocols_bootstrap(clone_protocol: str) -> None:
    """``file://`` stays an explicit option: the same transition completes on both."""
    async with open_bootstrap_world(clone_protocol=clone_protocol) as w:
        origin = git(w.checkout, "config", "--get", "remote.origin.url")
        assert origin.startswith("file://" if clone_protocol == "file" else "http://")
        number = w.issue()
        await w.lease(number)
        assert (await w.bootstrap(number)).status == "completed"


# --- a configured clone_url / clone_url_rewrite -----------------------------------------------------------------------


def _load(tmp_path: Path, repository: str) -> Any:
    path = tmp_path / "foreman.toml"
    path.write_text(f'[webhook]\nsecrets = ["{"s" * 16}"]\n[repository]\nowner = "o"\nname = "r"\n{repository}\n',
                    encoding="utf-8")
    return load_settings(path, environ={})


@pytest.mark.parametrize(("text", "key", "needle"), [
    ('clone_url = "ssh://git@gitea.internal/o/r.git"', "repository.clone_url", "http"),
    ('clone_url = "https://foreman:hunter2secret@gitea.internal/o/r.git"', "repository.clone_url", "credentials"),
    ('clone_url = "https:///o/r.git"', "repository.clone_url", "host"),
    ('clone_url_rewrite = { from = "https://git.example.org/", to = "ftp://gitea.internal/" }',
     "repository.clone_url_rewrite.to", "http"),
    ('clone_url_rewrite = { from = "https://git.example.org/", to = "http://x:hunter2secret@gitea.internal/" }',
     "repository.clone_url_rewrite.to", "credentials"),
    ('clone_url_rewrite = { from = "git@example.org:", to = "http://gitea.internal/" }',
     "repository.clone_url_rewrite.from", "http"),
    ('clone_url_rewrite = { to = "http://gitea.internal/" }', "repository.clone_url_rewrite.from", ""),
    ('clone_url = "http://gitea.internal/o/r.git"\n'
     'clone_url_rewrite = { from = "https://git.example.org/", to = "http://gitea.internal/" }',
     "repository.clone_url_rewrite", "not both"),
])
def test_clone_url_keys_are_validated_and_each_refusal_names_its_key(
    tmp_path: Path, text: str, key: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert caught.value.key == key, caught.value.errors
    assert needle in caught.value.message
    assert "hunter2secret" not in str(caught.value) and "hunter2secret" not in repr(caught.value.errors)


def test_valid_clone_url_settings_load(tmp_path: Path) -> None:
    explicit = _load(tmp_path, 'clone_url = "http://gitea.internal:3000/o/r.git"').repository
    assert explicit.clone_url == "http://gitea.internal:3000/o/r.git" and explicit.clone_url_rewrite is None
    rewrite = _load(tmp_path, 'clone_url_rewrite = { from = "https://git.example.org/", '
                              'to = "http://gitea.internal:3000/" }').repository
    assert rewrite.clone_url_rewrite is not None
    assert rewrite.effective_clone_url("https://git.example.org/o/r.git") == "http://gitea.internal:3000/o/r.git"
    # A URL outside the rewrite's prefix is used as Gitea reports it.
    assert rewrite.effective_clone_url("https://other.example.org/o/r.git") == "https://other.example.org/o/r.git"
    assert explicit.effective_clone_url("https://git.example.org/o/r.git") == "http://gitea.internal:3000/o/r.git"


UNREACHABLE_ROOT = "http://gitea.public.invalid:3000/"


async def test_an_unreachable_root_url_fails_without_the_clone_url_settings() -> None:
    """Gitea up to 1.25 reports ROOT_URL clone URLs: foreman cannot reach this one (the reason for the keys)."""
    async with open_bootstrap_world(clone=False, emulator={"root_url": UNREACHABLE_ROOT, "version": "1.25.4"}) as w:
        number = w.issue()
        await w.lease(number)
        result = await w.bootstrap(number)
        assert result.status == "refused" and result.refusal is not None and result.refusal.error == "unavailable"
        assert not w.checkout.exists()


@pytest.mark.parametrize("mode", ["rewrite", "explicit"])
async def test_a_configured_clone_url_reaches_gitea_when_root_url_does_not(mode: str) -> None:
    def keys(base: str) -> dict[str, Any]:
        if mode == "rewrite":
            return {"clone_url_rewrite": {"from": UNREACHABLE_ROOT, "to": base + "/"}}
        return {"clone_url": f"{base}/{OWNER}/{REPO}.git"}

    async with open_bootstrap_world(clone=False, emulator={"root_url": UNREACHABLE_ROOT, "version": "1.25.4"}) as w:
        # The emulator listens on a new port each time: the keys name the live one.
        repository = RepositoryConfig.model_validate({**w.settings.repository.model_dump(), **keys(w.live.base_url)})
        settings = w.settings.model_copy(update={"repository": repository})
        w.ctx = BootstrapContext(db=w.db, settings=settings, gitea=w.ctx.gitea, bot_login=BOT)
        number = w.issue()
        await w.lease(number)
        assert (await w.ctx.gitea.get_repo()).clone_url.startswith(UNREACHABLE_ROOT)  # type: ignore[union-attr]
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        wanted = f"{w.live.base_url}/{OWNER}/{REPO}.git"
        assert git(w.checkout, "config", "--get", "remote.origin.url") == wanted
        [inputs] = [json.loads(row[0]) for row in w.rows("SELECT inputs_json FROM bootstrap_journal")]
        assert inputs["clone_url"] == wanted and inputs["reported_clone_url"].startswith(UNREACHABLE_ROOT)
        proof = (await bootstrap_preflight(w.ctx, number, "alice")).to_dict()
        assert proof["checks"]["repo_reachable"]["ok"], proof


# --- what only the operator fixes: a changed origin, an owner Gitea cannot assign -------------------------------------


def _worktree_state(w: BootstrapWorld, path: Path) -> dict[str, Any]:
    """A worktree as the agent left it: every file's bytes and mode (tracked, changed, untracked, ignored, the
    .git file), its git metadata directory (HEAD, index, lock), and what git status says."""
    admin = Path(git(path, "rev-parse", "--path-format=absolute", "--git-dir"))
    return {
        "files": tree_snapshot(path),
        "admin": tree_snapshot(admin),
        "status": git(path, "--no-optional-locks", "status", "--porcelain=v1", "--untracked-files=all", "--ignored"),
    }


def _cli(config: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(config), *args], cwd=REPO_ROOT, env=clean,
                          capture_output=True, text=True, timeout=HANG_S, check=False)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else None), done.stderr


async def test_a_changed_origin_is_refused_with_repoint_as_the_way_out_and_worktrees_stay_byte_identical() -> None:
    """Gitea 1.26 builds clone URLs from the request's Host: reached by another name (an operator changes
    gitea.url), it reports another URL. The bootstrap refuses ``checkout_origin`` naming ``foreman checkout
    repoint``; that command (run as the operator would) points origin at the new URL after proving it serves the
    same repository, and never touches a worktree: files (changed, untracked, ignored), index, HEAD, lock."""
    async with open_bootstrap_world() as w:
        first = w.issue()
        await w.lease(first)
        done = await w.bootstrap(first)
        assert done.status == "completed"
        path = Path(done.proof["worktree_path"])
        (path / "src" / "app.py").write_text("print('work in progress')\n", encoding="utf-8")
        (path / "notes.txt").write_text("untracked\n", encoding="utf-8")
        (path / "debug.log").write_text("ignored\n", encoding="utf-8")
        (path / "docs" / "guide.md").write_text("# staged\n", encoding="utf-8")
        git(path, "add", "docs/guide.md")
        before = _worktree_state(w, path)
        heads = git(w.checkout, "for-each-ref", "refs/heads/")
        old_origin = git(w.checkout, "config", "--get", "remote.origin.url")

        new_base = w.live.base_url.replace("127.0.0.1", "localhost")
        gitea = GiteaClient(w.live.session, base_url=new_base, token=TOKENS[BOT], owner=OWNER, repo=REPO,
                            backoff_base_s=0.005, timeout_s=5.0)
        settings = w.settings.model_copy(update={"gitea": w.settings.gitea.model_copy(update={"url": new_base})})
        w.ctx = BootstrapContext(db=w.db, settings=settings, gitea=gitea, bot_login=BOT)  # a restarted service
        second = w.issue("Second")
        await w.lease(second, owner="bob")
        refused = await w.bootstrap(second, caller="bob")
        assert refused.status == "refused" and refused.refusal is not None, refused.to_dict()
        assert refused.refusal.reason == "checkout_origin"
        assert "foreman checkout repoint" in refused.refusal.exact_next_action
        assert refused.refusal.details["checkout_origin"] == old_origin
        assert refused.refusal.details["clone_url"] == f"{new_base}/{OWNER}/{REPO}.git"

        config = w.config_file({"gitea": {"url": new_base}})
        code, doc, err = await asyncio.to_thread(_cli, config, "checkout", "repoint", "--json")
        assert code == 0 and doc is not None, err
        assert doc["changed"] is True and doc["from"] == old_origin and doc["to"] == f"{new_base}/{OWNER}/{REPO}.git"
        assert git(w.checkout, "config", "--get", "remote.origin.url") == doc["to"]
        assert _worktree_state(w, path) == before
        assert git(w.checkout, "for-each-ref", "refs/heads/") == heads
        record = (w.checkout / ".git" / "foreman-origin.jsonl").read_text(encoding="utf-8").splitlines()
        assert json.loads(record[-1])["from"] == old_origin and json.loads(record[-1])["to"] == doc["to"]
        again = await asyncio.to_thread(_cli, config, "checkout", "repoint", "--json")
        assert again[0] == 0 and again[1] is not None and again[1]["changed"] is False

        w.ctx = BootstrapContext(db=w.db, settings=settings, gitea=gitea, bot_login=BOT)
        resumed = await w.bootstrap(second, caller="bob")
        assert resumed.status == "completed", resumed.to_dict()
        assert _worktree_state(w, path) == before


async def test_repoint_refuses_a_url_that_serves_another_repository() -> None:
    async with open_bootstrap_world() as w:
        w.live.emulator.create_repo(OWNER, "other", files={"README.md": "# something else\n"})
        w.live.emulator.set_permission(OWNER, "other", BOT, "admin")
        old_origin = git(w.checkout, "config", "--get", "remote.origin.url")
        repository = RepositoryConfig.model_validate({**w.settings.repository.model_dump(),
                                                      "clone_url": f"{w.live.base_url}/{OWNER}/other.git"})
        w.ctx = BootstrapContext(db=w.db, settings=w.settings.model_copy(update={"repository": repository}),
                                 gitea=w.ctx.gitea, bot_login=BOT)
        result = await bootstrap_mod.repoint_control_checkout(w.ctx)
        assert result["ok"] is False and result["error"] == "invalid_state"
        assert result["details"]["reason"] == "origin_not_same_repository"
        assert "repository.clone_url" in result["exact_next_action"]
        assert git(w.checkout, "config", "--get", "remote.origin.url") == old_origin


async def test_an_owner_gitea_cannot_assign_is_a_typed_blocker_without_a_retry_storm() -> None:
    """A private repository and an agent account without access: Gitea answers the assignment with a 500
    (CanBeAssigned). The bootstrap assigns through ``GiteaClient.set_assignees``: one PATCH, the typed
    ``GiteaUnassignable``, the transition compensated with ``owner_unassignable`` naming what the operator grants."""
    async with open_bootstrap_world() as w:
        emu = w.live.emulator
        emu.repo(OWNER, REPO).private = True
        emu.set_permission(OWNER, REPO, "bob", "none")
        number = w.issue()
        await w.lease(number, owner="bob")
        result = await w.bootstrap(number, caller="bob")
        assert result.refusal is not None, result.to_dict()
        assert result.status == "compensated" and result.refusal.error == "invalid_state", result.to_dict()
        assert result.refusal.reason == "owner_unassignable"
        action = result.refusal.exact_next_action
        assert "grants bob access" in action and "status:ready" in action
        patches = [r for r in emu.requests if r.method == "PATCH" and r.path.endswith(f"/issues/{number}")]
        assert len(patches) == 1, [(r.path, r.status) for r in patches]
        assert not (w.checkout / "branches" / w.branch(number)).exists()
