"""Two bootstraps of one repository at once (CI, 2026-12-06: "fatal: failed to read
.git/worktrees/issue-3-concurrent-task-0/commondir: Success"): git writes a new registration's files one by one and
takes no lock, and every command that lists the worktrees dies on one half-written. Foreman's git commands in a
repository hold its ``WorktreeRegistry``: shared to run, alone to add or delete a registration."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from bot.gitops.control import ControlCheckout
from bot.gitops.environment import git_env
from bot.gitops.errors import GitFailure
from bot.gitops.worktree_lock import WorktreeRegistry
from tests.test_bootstrap_support import git
from tests.test_gitops_registration import repo

__all__ = ["repo"]  # the fixture


@pytest.fixture
def checkout(repo: Path) -> Path:
    """The registration tests' checkout (one commit on main, ``branches/`` excluded) with three issue branches."""
    for name in ("issue-1-a", "issue-2-b", "issue-3-c"):
        git(repo, "branch", name)
    return repo


def control(path: Path, timeout_s: float = 60) -> ControlCheckout:
    return ControlCheckout(path, env=git_env("foreman-bot"), timeout_s=timeout_s)


def add(checkout: ControlCheckout, path: Path, branch: str, reason: str) -> None:
    """What the bootstrap does: the registration (held alone), then the checkout (outside the registry)."""
    checkout.register_worktree(path, branch, reason)
    checkout.check_out(path)


def half_written(path: Path) -> Path:
    """What another ``git worktree add`` has made at the instant git dies on it: the directory, its ``gitdir``, and
    a ``commondir`` opened but not yet written."""
    admin = path / ".git" / "worktrees" / "elsewhere"
    admin.mkdir(parents=True)
    (admin / "gitdir").write_text(str(path / "branches" / "elsewhere" / ".git") + "\n", encoding="utf-8")
    (admin / "commondir").write_text("", encoding="utf-8")
    return admin


class Background:
    """One call on a thread; its outcome (the value or the exception) once it ended."""

    def __init__(self, call: object) -> None:
        self.outcome: list[object] = []

        def run() -> None:
            try:
                self.outcome.append(call())  # type: ignore[operator]
            except Exception as exc:  # the test inspects it
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def running_after(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return self.thread.is_alive()

    def result(self) -> object:
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.outcome[0]


def test_git_itself_dies_on_a_half_written_registration(checkout: Path) -> None:
    """The fact the lock exists for (git 2.39 and later, worktree.c / setup.c): without it, the add fails."""
    half_written(checkout)
    done = subprocess.run(["git", "worktree", "add", "--quiet", str(checkout / "branches" / "x"), "issue-1-a"],
                          cwd=checkout, capture_output=True, text=True, check=False)
    assert done.returncode == 128 and "commondir" in done.stderr, done
    assert not (checkout / ".git" / "worktrees" / "x").exists()


def test_an_add_waits_while_another_add_is_writing_its_registration(checkout: Path) -> None:
    other = WorktreeRegistry(checkout / ".git", wait_s=60)
    target = checkout / "branches" / "issue-1-a"
    with other.held(("worktree", "add")):  # another bootstrap's `git worktree add`, mid-way
        admin = half_written(checkout)
        adding = Background(lambda: add(control(checkout), target, "issue-1-a", "foreman lease 1"))
        assert adding.running_after(0.3), f"the add ran while another add held the registrations: {adding.outcome}"
        shutil.rmtree(admin)  # the other add ends (here: gone again; a finished one is complete)
    assert adding.result() is None
    entry = control(checkout).listed_worktree_at(target)
    assert entry is not None and entry.branch == "issue-1-a" and entry.locked == "foreman lease 1"


@pytest.mark.parametrize("reader", ["list", "branch_force", "refs"])
def test_every_command_in_the_repository_waits_for_a_change_and_readers_share(checkout: Path, reader: str) -> None:
    calls = {
        "list": lambda c: c.worktrees(),
        "branch_force": lambda c: c.git.run("branch", "-f", "issue-3-c", "main"),
        "refs": lambda c: c.refs("refs/heads/"),
    }
    registry = WorktreeRegistry(checkout / ".git", wait_s=60)
    with registry.held(("worktree", "remove")):
        admin = half_written(checkout)
        read = Background(lambda: calls[reader](control(checkout)))
        assert read.running_after(0.3), f"{reader} ran while a registration was being changed: {read.outcome}"
        shutil.rmtree(admin)
    assert not isinstance(read.result(), Exception)
    with registry.held(("fetch", "--quiet")):  # a reader: another reader runs beside it at once
        shared = Background(lambda: calls[reader](control(checkout)))
        assert not shared.running_after(30)
        assert not isinstance(shared.result(), Exception)
        change = Background(lambda: add(control(checkout), checkout / "branches" / "issue-2-b", "issue-2-b",
                                        "foreman lease 2"))
        assert change.running_after(0.3), "an add ran beside a command that was reading the registrations"
    assert change.result() is None


def test_the_wait_is_bounded_and_says_what_to_do(checkout: Path) -> None:
    with WorktreeRegistry(checkout / ".git", wait_s=60).held(("worktree", "add")):
        with pytest.raises(GitFailure) as caught:
            control(checkout, timeout_s=0.2).worktrees()
    assert "worktree registrations" in str(caught.value) and "retry once it has ended" in str(caught.value)
    assert control(checkout).worktrees()[0].path == str(checkout)  # released with the block


def test_many_adds_at_once_all_register(checkout: Path) -> None:
    """Eight adds on eight threads, three rounds (the bootstrap benchmark's concurrent section, smaller)."""
    for round_ in range(3):
        names = [f"issue-{10 + round_ * 8 + i}-t" for i in range(8)]
        for name in names:
            git(checkout, "branch", name)
        adds = [Background(lambda n=name: add(control(checkout), checkout / "branches" / n, n, "r"))
                for name in names]
        assert [a.result() for a in adds] == [None] * 8
    assert len(control(checkout).worktrees()) == 1 + 24


def test_no_lock_before_the_repository_exists(tmp_path: Path) -> None:
    registry = WorktreeRegistry(tmp_path / "not-cloned-yet" / ".git", wait_s=1)
    with registry.held(("worktree", "add")):
        pass
    assert not (tmp_path / "not-cloned-yet").exists()


def test_removing_a_registration_directly_waits_for_commands_that_read_them(checkout: Path) -> None:
    """The bootstrap's repair deletes a half-made registration of its own in Python (``remove_admin_dir``): a git
    command listing the worktrees at that instant would die on it, so the deletion holds the registrations alone."""
    target = checkout / "branches" / "issue-1-a"
    add(control(checkout), target, "issue-1-a", "foreman lease 1")
    git(checkout, "worktree", "unlock", str(target))
    shutil.rmtree(target)
    admin = control(checkout).admin_dir_for(target) or control(checkout).scanned_admin_dir_for(target)
    assert admin is not None
    with WorktreeRegistry(checkout / ".git", wait_s=60).held(("fetch", "--quiet")):  # a reader in flight
        removal = Background(lambda: control(checkout).remove_admin_dir(admin))
        assert removal.running_after(0.3), f"the registration went while a command was reading: {removal.outcome}"
        assert admin.path.is_dir()
    assert removal.result() is None and not admin.path.exists()


def test_a_checkout_goes_on_while_another_add_registers(checkout: Path) -> None:
    """Only the registration is held alone: a checkout (``reset --hard`` in the new worktree, which lists no
    worktree) runs while another add holds the registrations, so bootstraps of one repository check out side by
    side, and it leaves the worktree exactly as ``git worktree add`` would."""
    target = checkout / "branches" / "issue-1-a"
    control(checkout).register_worktree(target, "issue-1-a", "foreman lease 1")
    assert not (target / "README.md").exists()
    with WorktreeRegistry(checkout / ".git", wait_s=60).held(("worktree", "add")):
        admin = half_written(checkout)  # the other add, mid-way: git's checkout does not read it
        checkout_ = Background(lambda: control(checkout).check_out(target))
        assert not checkout_.running_after(30), "the checkout waited for another add's registration"
        assert checkout_.result() is None
        shutil.rmtree(admin)
    assert (target / "README.md").read_text(encoding="utf-8") == "# r\n"
    assert git(target, "status", "--porcelain") == ""
    plain = checkout / "branches" / "plain"
    git(checkout, "worktree", "add", "--quiet", "--lock", "--reason", "foreman lease 1", str(plain), "issue-2-b")
    ours, theirs = control(checkout).listed_worktree_at(target), control(checkout).listed_worktree_at(plain)
    assert ours is not None and theirs is not None
    assert (ours.head, ours.locked) == (theirs.head, theirs.locked)
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in plain.iterdir())
    admin = Path(git(target, "rev-parse", "--absolute-git-dir"))
    other = Path(git(plain, "rev-parse", "--absolute-git-dir"))
    assert sorted(p.name for p in admin.iterdir()) == sorted(p.name for p in other.iterdir())
