"""The worktree is hostile input (issue 29, item 1): git configuration the agent can write never runs a program in
the service. Each attack writes a marker file if anything of the agent's runs; real git repositories on tmpfs, the
git edge's own calls (the ones publish, teardown and bootstrap make). Each test fails on 2dbfe3f, where git found
the worktree's repository through its ``.git`` file and read the user's global configuration."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot import gitops
from bot.core.bootstrap import worktree_lock_reason
from tests.test_bootstrap_support import git, one_commit_checkout

BRANCH = "issue-1-hostile"
AUTHOR = ("author-1", "author-1@users.noreply")


@dataclass
class Scene:
    """A control checkout, one registered worktree in its ``branches/``, and what the agent owns beside it."""

    root: Path
    checkout: gitops.ControlCheckout
    worktree: Path
    marker: Path

    @property
    def admin(self) -> Path:
        return self.checkout.git_dir / "worktrees" / BRANCH

    def program(self, name: str) -> Path:
        """An executable that appends its name to the marker file (what the agent wants the service to run)."""
        path = self.root / "agent" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"#!/bin/sh\necho {name} >> {self.marker}\nexit 1\n", encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    def attacker_repository(self) -> Path:
        """A repository the agent made, outside the control checkout: its ``.git`` is the agent's to configure."""
        repo = self.root / "agent" / "repo"
        repo.mkdir(parents=True)
        git(repo, "init", "-q", "-b", BRANCH)
        return repo

    def point_git_file_at(self, repo: Path) -> None:
        """The agent rewrites its worktree's ``.git`` file (it owns the worktree)."""
        (self.worktree / ".git").write_text(f"gitdir: {repo / '.git'}\n", encoding="utf-8")

    def ran(self) -> list[str]:
        return self.marker.read_text(encoding="utf-8").split() if self.marker.exists() else []


@pytest.fixture
def scene() -> Iterator[Scene]:
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="gitops-hostile-", dir=shm if shm.is_dir() else None))
    path = one_commit_checkout(root / "checkout")
    git(path, "branch", BRANCH)
    checkout = gitops.ControlCheckout(path, env=gitops.git_env("foreman-bot"), timeout_s=60)
    worktree = path / "branches" / BRANCH
    worktree.parent.mkdir()
    checkout.register_worktree(worktree, BRANCH, worktree_lock_reason("bootstrap:1:k"))
    checkout.check_out(worktree)
    try:
        yield Scene(root, checkout, worktree, root / "marker")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def attempt(action: Callable[[], object]) -> gitops.GitFailure | None:
    """The git edge's refusal (or failure) of ``action``, None when it went through."""
    try:
        action()
    except gitops.GitFailure as exc:
        return exc
    return None


def publish_and_teardown(scene: Scene) -> list[gitops.GitFailure | None]:
    """Every git call publish and teardown make on the worktree, each tried whatever the one before did."""
    (scene.worktree / "work.txt").write_text("the agent's work\n", encoding="utf-8")
    return [
        attempt(lambda: scene.checkout.worktree_changes(scene.worktree)),
        attempt(lambda: scene.checkout.commit_worktree(scene.worktree, "Work", author=AUTHOR)),
        attempt(lambda: scene.checkout.worktree_status(scene.worktree)),
        attempt(lambda: gitops.worktree_head(scene.checkout, scene.worktree)),
        attempt(lambda: scene.checkout.worktree_view(scene.worktree)),
    ]


def assert_refused(results: list[gitops.GitFailure | None]) -> None:
    """Each call was refused before git ran, by the typed refusal naming the worktree's .git file."""
    for result in results:
        assert result is not None and type(result).__name__ == "WorktreeRefused", result
        assert ".git" in str(result)


def test_core_fsmonitor_of_a_repository_the_git_file_names_never_runs(scene: Scene) -> None:
    """The issue's attack: the worktree's ``.git`` file pointed at a repository whose config sets
    ``core.fsmonitor``; git status, add, diff and commit ran it. Now nothing runs and each call is refused."""
    repo = scene.attacker_repository()
    git(repo, "config", "core.fsmonitor", str(scene.program("fsmonitor")))
    scene.point_git_file_at(repo)
    results = publish_and_teardown(scene)
    assert scene.ran() == []
    assert_refused(results)
    assert scene.checkout.branch_sha(BRANCH) == scene.checkout.rev("main")  # nothing was committed anywhere of ours


def test_hooks_in_a_repository_the_git_file_names_never_run(scene: Scene) -> None:
    """Hooks where the agent can put them (the repository its ``.git`` file names): ``--no-verify`` skips only
    pre-commit and commit-msg; prepare-commit-msg, post-commit, post-index-change and reference-transaction ran."""
    repo = scene.attacker_repository()
    hooks = repo / ".git" / "hooks"
    for name in ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-index-change",
                 "reference-transaction"):
        shutil.copy(scene.program(name), hooks / name)
    scene.point_git_file_at(repo)
    results = publish_and_teardown(scene)
    assert scene.ran() == []
    assert_refused(results)


def test_a_clean_filter_the_agent_configures_beside_its_gitattributes_never_runs(scene: Scene) -> None:
    """``.gitattributes`` in the worktree names a filter; the repository the ``.git`` file names defines it."""
    repo = scene.attacker_repository()
    git(repo, "config", "filter.agent.clean", str(scene.program("clean")))
    git(repo, "config", "filter.agent.smudge", str(scene.program("smudge")))
    (scene.worktree / ".gitattributes").write_text("* filter=agent\n", encoding="utf-8")
    scene.point_git_file_at(repo)
    results = publish_and_teardown(scene)
    assert scene.ran() == []
    assert_refused(results)


def test_an_include_path_in_a_config_the_agent_writes_is_never_read(scene: Scene) -> None:
    """``include.path`` in the agent's repository's config, naming a file of the agent's that sets fsmonitor and
    a filter: never read, nothing runs."""
    repo = scene.attacker_repository()
    included = scene.root / "agent" / "included.cfg"
    included.write_text(f"[core]\n\tfsmonitor = {scene.program('fsmonitor')}\n"
                        f"[filter \"agent\"]\n\tclean = {scene.program('clean')}\n", encoding="utf-8")
    git(repo, "config", "include.path", str(included))
    (scene.worktree / ".gitattributes").write_text("* filter=agent\n", encoding="utf-8")
    scene.point_git_file_at(repo)
    results = publish_and_teardown(scene)
    assert scene.ran() == []
    assert_refused(results)


@pytest.mark.parametrize("where", ["HOME", "XDG_CONFIG_HOME"])
def test_the_users_own_configuration_is_never_read(scene: Scene, monkeypatch: pytest.MonkeyPatch,
                                                  where: str) -> None:
    """The ``.git`` file untouched, but the configuration of the user running foreman (an agent on the same user
    writes ``~/.gitconfig`` and ``~/.config/git/``): fsmonitor, a filter (named by its attribute file too) and an
    include there are never read. The publish goes through, unfiltered, and nothing ran."""
    home = scene.root / "home"
    config = home / ".gitconfig" if where == "HOME" else home / "git" / "config"
    config.parent.mkdir(parents=True, exist_ok=True)
    included = scene.root / "agent-included.cfg"
    included.write_text(f"[filter \"agent\"]\n\tclean = {scene.program('included-clean')}\n", encoding="utf-8")
    config.write_text(f"[core]\n\tfsmonitor = {scene.program('fsmonitor')}\n"
                      f"[filter \"other\"]\n\tclean = {scene.program('clean')}\n"
                      f"[include]\n\tpath = {included}\n", encoding="utf-8")
    if where == "XDG_CONFIG_HOME":
        (home / "git" / "attributes").write_text("*.txt filter=agent\n", encoding="utf-8")
    (scene.worktree / ".gitattributes").write_text("*.md filter=other\n", encoding="utf-8")
    monkeypatch.setenv(where, str(home))
    (scene.worktree / "README.md").write_text("# changed\n", encoding="utf-8")
    (scene.worktree / "work.txt").write_text("the agent's work\n", encoding="utf-8")
    assert scene.checkout.worktree_changes(scene.worktree)
    sha = scene.checkout.commit_worktree(scene.worktree, "Work", author=AUTHOR)
    assert scene.checkout.worktree_status(scene.worktree) == []
    assert scene.ran() == []
    assert sha is not None and scene.checkout.branch_sha(BRANCH) == sha
    assert git(scene.checkout.path, "show", f"{sha}:work.txt") == "the agent's work"


def test_a_registration_whose_commondir_was_changed_is_refused_before_git_runs(scene: Scene) -> None:
    """The worktree's registration redirected (``commondir`` naming the agent's repository, ``gitdir`` moved): git
    would read the agent's config; even teardown's removal ran ``git status`` through it. Refused before git runs."""
    repo = scene.attacker_repository()
    git(repo, "config", "core.fsmonitor", str(scene.program("fsmonitor")))
    (scene.admin / "commondir").write_text(f"{repo / '.git'}\n", encoding="utf-8")
    results = publish_and_teardown(scene)
    results.append(attempt(lambda: gitops.remove_clean_worktree(scene.checkout, scene.worktree, "reason")))
    assert scene.ran() == []
    assert_refused(results)
    assert scene.worktree.is_dir() and scene.admin.is_dir()  # nothing removed


def test_a_changed_git_file_is_refused_with_the_command_that_restores_it(scene: Scene) -> None:
    """A ``.git`` file that is not exactly ``gitdir: <registration>`` (here: the same registration, relative) is
    refused; the refusal's ``restore`` command, run by an operator, makes the worktree usable again."""
    git_file = scene.worktree / ".git"
    original = git_file.read_text(encoding="utf-8")
    assert original == f"gitdir: {os.path.realpath(scene.admin)}\n"  # what git worktree add wrote
    git_file.write_text("gitdir: ../../.git/worktrees/" + BRANCH + "\n", encoding="utf-8")
    refusal = attempt(lambda: scene.checkout.worktree_changes(scene.worktree))
    assert isinstance(refusal, gitops.WorktreeRefused) and refusal.restore is not None
    assert [p for p in refusal.problems if str(git_file) in p]
    subprocess.run(["sh", "-c", refusal.restore], check=True)
    assert git_file.read_text(encoding="utf-8") == original
    assert scene.checkout.worktree_changes(scene.worktree) == []


def test_a_worktree_without_a_registration_is_refused_and_git_is_never_asked(scene: Scene) -> None:
    """No registration names the path (a directory someone made under branches/): no restore, no git."""
    stray = scene.worktree.parent / "issue-2-stray"
    stray.mkdir()
    (stray / ".git").write_text(f"gitdir: {scene.admin}\n", encoding="utf-8")
    refusal = attempt(lambda: scene.checkout.worktree_status(stray))
    assert isinstance(refusal, gitops.WorktreeRefused) and refusal.restore is None


def test_git_runs_with_foremans_environment_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Variables of foreman's own environment that choose a repository, an index or configuration never reach git;
    the neutral configuration comes last on the command line."""
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "index"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.fsmonitor'='/bin/false'")
    monkeypatch.setenv("GIT_SSL_CAINFO", "/etc/ssl/ca.pem")
    env = gitops.hardened_env({"GIT_AUTHOR_NAME": "a"}, git_dir=tmp_path / "wt-admin", work_tree=tmp_path / "wt")
    assert env["GIT_DIR"] == str(tmp_path / "wt-admin") and env["GIT_WORK_TREE"] == str(tmp_path / "wt")
    assert "GIT_INDEX_FILE" not in env and "GIT_CONFIG_PARAMETERS" not in env
    assert env["GIT_SSL_CAINFO"] == "/etc/ssl/ca.pem" and env["GIT_AUTHOR_NAME"] == "a"
    assert (env["GIT_CONFIG_NOSYSTEM"], env["GIT_CONFIG_GLOBAL"], env["GIT_ATTR_NOSYSTEM"]) == ("1", "/dev/null", "1")
    args = gitops.config_args()
    assert "core.fsmonitor=false" in args and "core.hooksPath=/dev/null" in args and "credential.helper=" in args
