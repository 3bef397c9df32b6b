"""Git over smart HTTP from the emulator, and http(s) clone URLs as each Gitea version builds them."""

from __future__ import annotations

import asyncio
import gzip
import sys
from pathlib import Path

import pytest

from bot.gitops.environment import git_env
from bot.gitops.errors import GitFailure
from bot.gitops.remote import auth_env
from bot.gitops.runner import GitRunner
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


#: Processes started while ``_COUNTING`` is on (Python's audit events): the emulator's and git's own.
_STARTED: list[str] = []
_COUNTING: list[bool] = [False]


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _COUNTING[0] and event == "subprocess.Popen":
        _STARTED.append(" ".join(str(a) for a in args[1]))  # type: ignore[attr-defined]


sys.addaudithook(_audit)


async def test_the_emulator_runs_the_git_service_itself_as_gitea_does(tmp_path: Path) -> None:
    """routers/web/repo/githttp.go (1.22.3 and 1.26.3): ``info/refs`` is ``git upload-pack --stateless-rpc
    --advertise-refs .`` after a ``# service=`` pkt-line and a flush, never cached; a fetch's POST is ``git upload-pack
    --stateless-rpc .``. No ``git http-backend`` (a CGI that starts the same service as one more process)."""
    async with live_emulator(clone_protocol="http") as live:
        url = (await live.client().get_repo()).clone_url
        async with live.session.get(f"{url}/info/refs", params={"service": "git-upload-pack"}) as resp:
            body = await resp.read()
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "application/x-git-upload-pack-advertisement"
            assert resp.headers["Cache-Control"] == "no-cache, max-age=0, must-revalidate"
            assert resp.headers["Expires"] == "Fri, 01 Jan 1980 00:00:00 GMT" and resp.headers["Pragma"] == "no-cache"
        head = (await live.client().get_branch("main")).commit_id
        assert body.startswith(b"001e# service=git-upload-pack\n0000")
        assert f"{head} HEAD".encode() in body
        runner = GitRunner(tmp_path, env=git_env(BOT), timeout_s=30)
        _STARTED.clear()
        _COUNTING[0] = True
        try:
            out = await asyncio.to_thread(runner.run, "ls-remote", "--", url, "refs/heads/main")
        finally:
            _COUNTING[0] = False
        assert out.split("\t")[0] == head
        services = [argv for argv in _STARTED if argv.startswith("git upload-pack") or "http-backend" in argv]
        # protocol v2: the advertisement, then one ls-refs command; each is one upload-pack, nothing else.
        assert services == ["git upload-pack --stateless-rpc --advertise-refs .", "git upload-pack --stateless-rpc ."]


async def test_the_git_service_refuses_what_gitea_refuses() -> None:
    """``serviceRPC``: a POST whose Content-Type is not ``application/x-git-<service>-request`` is 400, a body that
    says gzip and is not is 400; routers/web/githttp.go: info/refs is GET only, the services POST only (405)."""
    async with live_emulator(clone_protocol="http") as live:
        url = (await live.client().get_repo()).clone_url
        auth = live.auth(BOT)
        async with live.session.post(f"{url}/git-upload-pack", data=b"0000", headers=auth) as resp:
            assert resp.status == 400
        # aiohttp ends the connection after a body it could not decode: this request does not leave it for the next.
        async with live.session.post(f"{url}/git-upload-pack", data=b"not gzip", headers={
                **auth, "Content-Type": "application/x-git-upload-pack-request", "Content-Encoding": "gzip",
                "Connection": "close"}) as resp:
            assert resp.status == 400
        async with live.session.post(f"{url}/git-upload-pack", data=gzip.compress(b"0000"), headers={
                **auth, "Content-Type": "application/x-git-upload-pack-request", "Content-Encoding": "gzip"}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/x-git-upload-pack-result"
        async with live.session.get(f"{url}/git-upload-pack", headers=auth) as resp:
            assert resp.status == 405
        async with live.session.post(f"{url}/info/refs", params={"service": "git-upload-pack"}, headers=auth) as resp:
            assert resp.status == 405
