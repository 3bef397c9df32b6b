"""What the publish verb commits from a worktree (issue 29, item 4): a repository nested in it is refused with its
paths named before anything is committed (git would record it as a dangling gitlink, mode 160000, with no
.gitmodules), and a symbolic link that leaves the worktree stays refused."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot import worktree_files
from state.publications import PublicationStore
from tests.support import Started
from tests.test_bootstrap_support import git
from tests.test_publish import ROSTER, call_tool, leased_and_locked, remote_sha, worktree_of
from tests.world import FULL_NAME, World, open_world


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER) as opened:
        yield opened


def gitlinks(worktree: Path, sha: str) -> list[str]:
    """The entries of ``sha``'s tree with mode 160000 (the test's own git, on the pushed commit)."""
    out = subprocess.run(["git", "-C", str(worktree), "ls-tree", "-r", sha], capture_output=True, text=True,
                         check=True).stdout
    return [line.split("\t", 1)[1] for line in out.splitlines() if line.startswith("160000 ")]


def make_repo(path: Path, *, commit: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    (path / "inner.txt").write_text("inner\n", encoding="utf-8")
    if commit:
        git(path, "add", "inner.txt")
        git(path, "commit", "-q", "-m", "inner")
    return path


async def publish(world: World, number: int, message: str) -> tuple[bool, dict[str, object]]:
    return await call_tool(world, "author-1", "gitea_publish_worktree", issue_number=number, message=message)


async def test_a_nested_repository_is_refused_naming_it_and_nothing_is_committed_or_pushed(world: World) -> None:
    """A directory with its own `git init` and a commit (git would stage a gitlink), at the top or deeper: refused
    invalid_input naming each, nothing committed or pushed; with the nested .git removed, its files are published as
    plain files."""
    number = await leased_and_locked(world)
    worktree, branch = await worktree_of(world, number)
    head = git(worktree, "rev-parse", "HEAD")
    make_repo(worktree / "vendored")
    make_repo(worktree / "deep" / "er")
    (worktree / "ok.txt").write_text("ok\n", encoding="utf-8")
    refused, doc = await publish(world, number, "Vendor a library")
    assert refused and doc["error"] == "invalid_input", doc
    details = doc["details"]
    assert isinstance(details, dict) and details["paths"] == ["deep/er", "vendored"], doc
    assert "vendored" in str(doc["message"]) and "remove the nested .git" in str(doc["exact_next_action"])
    assert remote_sha(world, branch) is None and git(worktree, "rev-parse", "HEAD") == head
    assert git(worktree, "diff", "--cached", "--name-only") == ""  # nothing staged either
    [pub] = await PublicationStore(world.service.db).for_issue(FULL_NAME.lower(), number)
    assert pub.phase == "started" and pub.commit_sha is None
    for nested in ("vendored", "deep/er"):
        subprocess.run(["rm", "-rf", str(worktree / nested / ".git")], check=True)
    refused, doc = await publish(world, number, "Vendor a library")
    assert not refused, doc
    sha = str(doc["commit"])
    assert gitlinks(worktree, sha) == [] and remote_sha(world, branch) == sha
    files = git(worktree, "ls-tree", "-r", "--name-only", sha).split()
    assert {"vendored/inner.txt", "deep/er/inner.txt", "ok.txt"} <= set(files)


async def test_an_empty_nested_repository_is_refused_before_git_fails_on_it(world: World) -> None:
    """`git init` without a commit: `git add` would fail on it (an unexpected failure); it is refused, named."""
    number = await leased_and_locked(world)
    worktree, branch = await worktree_of(world, number)
    make_repo(worktree / "fresh", commit=False)
    refused, doc = await publish(world, number, "An empty repository")
    assert refused and doc["error"] == "invalid_input", doc
    details = doc["details"]
    assert isinstance(details, dict) and details["paths"] == ["fresh"], doc
    assert remote_sha(world, branch) is None


async def test_a_nested_directory_whose_git_is_a_gitdir_file_is_refused(world: World, tmp_path: Path) -> None:
    """`.git` as a file: pointing at a real repository (git would stage a gitlink of its HEAD) or at nothing (git
    skips the file): both are refused, named."""
    number = await leased_and_locked(world)
    worktree, branch = await worktree_of(world, number)
    elsewhere = make_repo(tmp_path / "elsewhere")
    (worktree / "linked").mkdir()
    (worktree / "linked" / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n", encoding="utf-8")
    (worktree / "linked" / "file.txt").write_text("file\n", encoding="utf-8")
    (worktree / "dangling").mkdir()
    (worktree / "dangling" / ".git").write_text("gitdir: /nonexistent/repo\n", encoding="utf-8")
    (worktree / "dangling" / "file.txt").write_text("file\n", encoding="utf-8")
    refused, doc = await publish(world, number, "Link another repository")
    assert refused and doc["error"] == "invalid_input", doc
    details = doc["details"]
    assert isinstance(details, dict) and details["paths"] == ["dangling", "linked"], doc
    assert remote_sha(world, branch) is None


async def test_a_repository_nested_after_the_look_is_unstaged_and_refused(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent writes while foreman publishes: a repository nested between the verb's look and `git add` is
    caught in what git staged (a 160000 entry), unstaged again, and refused the same way; nothing committed."""
    number = await leased_and_locked(world)
    worktree, branch = await worktree_of(world, number)
    head = git(worktree, "rev-parse", "HEAD")
    make_repo(worktree / "late")
    # The verb's look misses it (raising=False: on a checkout without the look the attack runs as it is).
    monkeypatch.setattr(worktree_files, "nested_repositories", lambda root, changes: [], raising=False)
    refused, doc = await publish(world, number, "Race a nested repository in")
    assert refused and doc["error"] == "invalid_input", doc
    details = doc["details"]
    assert isinstance(details, dict) and details["paths"] == ["late"], doc
    assert git(worktree, "rev-parse", "HEAD") == head and git(worktree, "diff", "--cached", "--name-only") == ""
    assert remote_sha(world, branch) is None


async def test_a_symbolic_link_to_a_directory_outside_the_worktree_is_refused(world: World, tmp_path: Path) -> None:
    """The guard kept: a link (here to a directory) that leaves the worktree is refused naming it, nothing pushed."""
    number = await leased_and_locked(world)
    worktree, branch = await worktree_of(world, number)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours\n", encoding="utf-8")
    os.symlink(outside, worktree / "elsewhere")
    (worktree / "ok.txt").write_text("ok\n", encoding="utf-8")
    refused, doc = await publish(world, number, "With a directory link")
    assert refused and doc["error"] == "invalid_input", doc
    details = doc["details"]
    assert isinstance(details, dict) and details["paths"] == ["elsewhere"], doc
    assert remote_sha(world, branch) is None
