"""The control checkout's origin, read from git once per state of ``.git/config`` (issue 19, item 3: every
allocation asked twice, its proof and its bootstrap, one git process each), and read again whenever the file
changed: a changed origin is never answered from what an earlier read saw."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bot.gitops.control import ControlCheckout
from bot.gitops.environment import git_env
from tests.test_bootstrap_support import git
from tests.test_gitops_registration import repo

__all__ = ["repo"]  # the fixture

OLD = time.time() - 3600  # well past the racy window


class Counted(ControlCheckout):
    """A control checkout that counts its ``git config`` processes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, env=git_env("foreman-bot"), timeout_s=30)
        self.reads = 0
        attempt = self.git.attempt

        def counted(*args: str, **kwargs: object) -> tuple[int, str, str]:
            self.reads += args[:1] == ("config",)
            return attempt(*args, **kwargs)  # type: ignore[arg-type]

        self.git.attempt = counted  # type: ignore[method-assign]


def _settle(path: Path, when: float = OLD) -> None:
    """Age the config file past the racy window (as any config is a few seconds after it was written)."""
    os.utime(path / ".git" / "config", (when, when))


def test_an_unchanged_config_is_read_from_git_once_per_process(repo: Path) -> None:
    git(repo, "remote", "add", "origin", "http://gitea.invalid/o/r.git")
    _settle(repo)
    first, second = Counted(repo), Counted(repo)  # two calls' checkouts, as two allocations build them
    assert first.origin_url() == "http://gitea.invalid/o/r.git" and first.reads == 1
    assert second.origin_url() == "http://gitea.invalid/o/r.git" and second.reads == 0


def test_a_changed_origin_is_read_again(repo: Path) -> None:
    git(repo, "remote", "add", "origin", "http://gitea.invalid/o/r.git")
    _settle(repo)
    assert Counted(repo).origin_url() == "http://gitea.invalid/o/r.git"
    git(repo, "remote", "set-url", "origin", "http://other.invalid/o/r.git")  # an operator's change
    _settle(repo, OLD + 60)  # even once it is old: another file, another time
    again = Counted(repo)
    assert again.origin_url() == "http://other.invalid/o/r.git" and again.reads == 1


def test_an_edit_in_place_of_the_same_size_is_read_again(repo: Path) -> None:
    git(repo, "remote", "add", "origin", "http://gitea.invalid/o/a.git")
    _settle(repo)
    assert Counted(repo).origin_url() == "http://gitea.invalid/o/a.git"
    config = repo / ".git" / "config"
    text = config.read_text(encoding="utf-8")
    with config.open("r+", encoding="utf-8") as handle:  # the same inode and size, as an editor may write it
        handle.write(text.replace("/o/a.git", "/o/b.git"))
    _settle(repo, OLD + 1)
    again = Counted(repo)
    assert again.origin_url() == "http://gitea.invalid/o/b.git" and again.reads == 1


@pytest.mark.parametrize("reads", [1, 2])
def test_a_config_written_within_the_racy_window_is_read_every_time(repo: Path, reads: int) -> None:
    git(repo, "remote", "add", "origin", "http://gitea.invalid/o/r.git")  # written just now
    checkout = Counted(repo)
    for _ in range(reads):
        assert checkout.origin_url() == "http://gitea.invalid/o/r.git"
    assert checkout.reads == reads


def test_no_origin_is_an_answer_and_a_missing_config_is_not_cached(repo: Path) -> None:
    _settle(repo)
    assert Counted(repo).origin_url() is None
    checkout = Counted(repo)
    assert checkout.origin_url() is None and checkout.reads == 0
    (repo / ".git" / "config").rename(repo / ".git" / "config.aside")
    try:
        gone = Counted(repo)
        gone.origin_url()
        assert gone.reads == 1
    finally:
        (repo / ".git" / "config.aside").rename(repo / ".git" / "config")
