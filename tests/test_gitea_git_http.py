"""Git over smart HTTP from the emulator, and http(s) clone URLs as each Gitea version builds them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.gitops import GitFailure, GitRunner, auth_env, git_env
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS, live_emulator
from tests.support import Started
from tests.world import open_world


def _clone(url: str, dest: Path, token: str | None) -> str:
    runner = GitRunner(dest.parent, env=git_env(BOT), timeout_s=30)
    runner.run("clone", "--quiet", url, dest.name, extra_env=auth_env(url, token))
    return GitRunner(dest, env=git_env(BOT), timeout_s=30).run("rev-parse", "HEAD").strip()


async def test_clone_over_http_with_the_token_and_refusals(tmp_path: Path) -> None:
    """A private repository: the token (``http.extraHeader``, never in argv) clones; a wrong token and no
    token are 401; a user without access gets 404 "Repository not found"."""
    async with live_emulator(clone_protocol="http") as live:
        emu = live.emulator
        emu.repo(OWNER, REPO).private = True
        repo = await live.client().get_repo()
        assert repo.clone_url == f"{live.base_url}/{OWNER}/{REPO}.git"
        head = await asyncio.to_thread(_clone, repo.clone_url, tmp_path / "ok", TOKENS[BOT])
        assert head == (await live.client().get_branch("main")).commit_id
        with pytest.raises(GitFailure) as wrong:
            await asyncio.to_thread(_clone, repo.clone_url, tmp_path / "wrong", "not-a-token")
        # Gitea's 401 (WWW-Authenticate: Basic) makes git ask for a user name, which foreman never allows.
        assert "could not read Username" in wrong.value.stderr and "not-a-token" not in str(wrong.value)
        with pytest.raises(GitFailure):
            await asyncio.to_thread(_clone, repo.clone_url, tmp_path / "anon", None)
        emu.add_user("mallory", token="tok-mallory-0012")
        with pytest.raises(GitFailure) as denied:
            await asyncio.to_thread(_clone, repo.clone_url, tmp_path / "mallory", "tok-mallory-0012")
        assert "not found" in denied.value.stderr.lower()
        statuses = [r.status for r in emu.requests if r.path.endswith("/info/refs")]
        assert 200 in statuses and 401 in statuses and 404 in statuses


async def test_a_public_repository_clones_anonymously_and_push_needs_write(tmp_path: Path) -> None:
    async with live_emulator(clone_protocol="http") as live:
        url = (await live.client().get_repo()).clone_url
        await asyncio.to_thread(_clone, url, tmp_path / "anon", None)
        work = GitRunner(tmp_path / "anon", env=git_env(BOT), timeout_s=30)
        (tmp_path / "anon" / "new.txt").write_text("x\n")
        work.run("add", "new.txt")
        work.run("commit", "-q", "-m", "x")
        # The emulator serves from this event loop: git runs in a thread.
        with pytest.raises(GitFailure):
            await asyncio.to_thread(
                work.run, "push", "-q", "origin", "HEAD:refs/heads/bob-push", extra_env=auth_env(url, TOKENS["bob"])
            )
        await asyncio.to_thread(
            work.run, "push", "-q", "origin", "HEAD:refs/heads/alice-push", extra_env=auth_env(url, TOKENS["alice"])
        )
        assert (await live.client().get_branch("alice-push")).commit_id


@pytest.mark.parametrize(("version", "from_host"), [("1.22.3", False), ("1.25.4", False), ("1.26.3", True)])
async def test_clone_url_comes_from_root_url_then_from_the_request_host(version: str, from_host: bool) -> None:
    """ComposeHTTPSCloneURL: setting.AppURL in 1.22-1.23, GuessCurrentAppURL with legacy detection (ROOT_URL)
    in 1.24-1.25, the request's Host by default in 1.26 (PUBLIC_URL_DETECTION=auto)."""
    root = "http://gitea.public.invalid:3000/"
    async with live_emulator(clone_protocol="http", root_url=root, version=version) as live:
        url = (await live.client().get_repo()).clone_url
        expected_base = live.base_url if from_host else root.rstrip("/")
        assert url == f"{expected_base}/{OWNER}/{REPO}.git"


async def test_the_loop_bootstraps_a_private_repository_over_http_with_the_token(
    tmp_path: Path, start: Started
) -> None:
    """The whole loop (label → lease → bootstrap → evidence) against clone URLs served over smart HTTP: the
    bootstrap's ls-remote, clone and fetch carry the bot's token, and only the bot's."""
    from tests.test_loop_e2e import LOOP, ROSTER, assert_looped, label_ready

    async with open_world(tmp_path, start, roster=ROSTER, **LOOP) as world:
        emu = world.live.emulator
        assert emu.clone_protocol == "http"  # the world's default
        emu.repo(OWNER, REPO).private = True
        # CanBeAssigned: on a private repository the agent account needs access (read on pull requests will do).
        emu.set_permission(OWNER, REPO, "author-1", "read")
        number = await world.open_issue("alice", "Clone me over HTTP")
        await label_ready(world, number)
        facts = await assert_looped(world, number)
        assert facts["worktree"].is_dir()
        git = [r for r in emu.requests if r.path.startswith(f"/{OWNER}/{REPO}.git/")]
        assert git and {r.login for r in git} == {BOT} and {r.status for r in git} == {200}


async def test_the_loop_still_bootstraps_from_file_urls_when_asked(tmp_path: Path, start: Started) -> None:
    """``file://`` stays an explicit option of the world (and of the emulator): no git request reaches HTTP."""
    from tests.test_loop_e2e import LOOP, ROSTER, assert_looped, label_ready

    async with open_world(tmp_path, start, roster=ROSTER, clone_protocol="file", **LOOP) as world:
        number = await world.open_issue("alice", "Clone me from the file system")
        await label_ready(world, number)
        facts = await assert_looped(world, number)
        assert facts["worktree"].is_dir()
        assert not [r for r in world.live.emulator.requests if r.path.startswith(f"/{OWNER}/{REPO}.git/")]
