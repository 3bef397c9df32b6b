"""The git edge's direct reads (issue 19, item 3 "flat"): one worktree's registration and one issue's branches read
from git's own files give exactly what ``git worktree list --porcelain`` and ``git for-each-ref`` say, at a cost
that does not grow with the number of worktrees and branches."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.gitops.control import ControlCheckout
from bot.gitops.environment import git_env
from bot.gitops.records import WorktreeEntry
from tests.test_bootstrap_support import git, one_commit_checkout

#: What the audit hook records while ``counting`` is on: (event, first argument).
_EVENTS: list[tuple[str, str]] = []
_COUNTING: list[bool] = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _COUNTING[0] and event in ("open", "subprocess.Popen", "os.listdir", "os.scandir"):
        _EVENTS.append((event, str(args[1] if event == "subprocess.Popen" else args[0])))


sys.addaudithook(_audit)


@contextmanager
def counted() -> Iterator[list[tuple[str, str]]]:
    """Every file opened, directory listed and process started inside the block (Python's audit events)."""
    seen: list[tuple[str, str]] = []
    _EVENTS.clear()
    _COUNTING[0] = True
    try:
        yield seen
    finally:
        _COUNTING[0] = False
        seen.extend(_EVENTS)
        _EVENTS.clear()


def _root() -> Path:
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="gitops-registration-", dir=shm if shm.is_dir() else None))


@pytest.fixture
def repo() -> Iterator[Path]:
    """A checkout with one commit on main, ``branches/`` excluded, under /dev/shm."""
    root = _root()
    checkout = one_commit_checkout(root / "checkout")
    try:
        yield checkout
    finally:
        shutil.rmtree(root, ignore_errors=True)


def control(path: Path) -> ControlCheckout:
    return ControlCheckout(path, env=git_env("foreman-bot"), timeout_s=60)


def porcelain_of(checkout: Path, path: Path) -> WorktreeEntry | None:
    """git's own record for ``path`` (``git worktree list --porcelain -z``, every worktree read)."""
    return control(checkout).listed_worktree_at(path)


def assert_same(checkout: Path, path: Path) -> WorktreeEntry | None:
    """The direct read equals git's record field by field, the porcelain lines included."""
    direct = control(checkout).worktree_at(path)
    listed = porcelain_of(checkout, path)
    assert direct == listed
    if listed is not None:
        assert direct is not None
        assert direct.raw == listed.raw and direct.to_dict() == listed.to_dict()
    return direct


def add(checkout: Path, name: str, *extra: str) -> Path:
    path = checkout / "branches" / name
    git(checkout, "worktree", "add", "-q", *extra, str(path))
    return path


def test_the_direct_read_of_a_registration_is_what_git_worktree_list_says(repo: Path) -> None:
    """Normal, locked (with and without a reason), detached, missing directory (prunable), missing and locked,
    a branch only in packed-refs, a second worktree of the same name (git's counter), a moved one, one outside
    the checkout, and paths git has no registration for: each compared with ``git worktree list --porcelain``."""
    normal = add(repo, "issue-1-normal", "-b", "issue-1-normal")
    locked = add(repo, "issue-2-locked", "-b", "issue-2-locked", "--lock", "--reason", "foreman bootstrap k-2")
    bare_lock = add(repo, "issue-3-bare-lock", "-b", "issue-3-bare-lock")
    git(repo, "worktree", "lock", str(bare_lock))  # an empty reason
    detached = add(repo, "issue-4-detached", "--detach")
    gone = add(repo, "issue-5-gone", "-b", "issue-5-gone")
    shutil.rmtree(gone)
    gone_locked = add(repo, "issue-6-gone-locked", "-b", "issue-6-gone-locked", "--lock", "--reason", "kept")
    shutil.rmtree(gone_locked)
    packed = add(repo, "issue-7-packed", "-b", "issue-7-packed")
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "issue-7-packed").exists()
    # the same last component twice: git names the second one's metadata "twin1"
    first = repo / "branches" / "a" / "twin"
    second = repo / "branches" / "b" / "twin"
    git(repo, "worktree", "add", "-q", "-b", "twin-a", str(first))
    git(repo, "worktree", "add", "-q", "-b", "twin-b", str(second))
    assert (repo / ".git" / "worktrees" / "twin1").is_dir()
    # moved: its metadata keeps the old name; found through the worktree's .git file
    moved_from = add(repo, "issue-8-before", "-b", "issue-8-moved")
    moved = repo / "branches" / "issue-8-after"
    git(repo, "worktree", "move", str(moved_from), str(moved))
    outside = repo.parent / "elsewhere" / "issue-9-outside"
    git(repo, "worktree", "add", "-q", "-b", "issue-9-outside", str(outside))
    checked = [normal, locked, bare_lock, detached, gone, gone_locked, packed, first, second, moved, moved_from,
               outside]
    entries = {path: assert_same(repo, path) for path in checked}
    assert all(entries[p] is not None for p in checked if p != moved_from)
    assert entries[moved_from] is None
    found = {p: e for p, e in entries.items() if e is not None}
    assert found[locked].locked == "foreman bootstrap k-2" and found[bare_lock].locked == ""
    assert found[detached].detached and found[detached].branch is None
    assert found[gone].prunable and found[gone_locked].prunable is None and found[gone_locked].locked == "kept"
    assert found[packed].branch == "issue-7-packed" and found[normal].locked is None
    # nothing registered there: an empty path, a plain directory, the checkout's own branches/ folder
    plain = repo / "branches" / "issue-10-plain"
    plain.mkdir()
    for path in (repo / "branches" / "issue-11-nothing", plain, repo / "branches"):
        assert assert_same(repo, path) is None
    # the main worktree is answered by git itself
    assert assert_same(repo, repo) is not None


def test_a_foreign_registration_is_not_taken_for_the_path(repo: Path) -> None:
    """A ``.git`` file at the path that names another path's metadata, metadata that names the path from
    another repository, and a worktree of another repository at the path: git lists none of them there."""
    other = add(repo, "issue-1-other", "-b", "issue-1-other")
    liar = repo / "branches" / "issue-2-liar"
    liar.mkdir()
    (liar / ".git").write_text((other / ".git").read_text(encoding="utf-8"), encoding="utf-8")
    assert assert_same(repo, liar) is None
    assert assert_same(repo, other) is not None
    foreign_repo = repo.parent / "foreign"
    foreign_repo.mkdir()
    git(foreign_repo, "init", "-q", "-b", "main")
    git(foreign_repo, "commit", "-q", "--allow-empty", "-m", "x")
    theirs = repo / "branches" / "issue-3-theirs"
    git(foreign_repo, "worktree", "add", "-q", "-b", "issue-3-theirs", str(theirs))
    assert assert_same(repo, theirs) is None
    # metadata of ours whose gitdir names another path than its own name says
    add(repo, "issue-4-named", "-b", "issue-4-named")
    (repo / ".git" / "worktrees" / "issue-4-named" / "gitdir").write_text(f"{repo.parent}/x/issue-4-named/.git\n",
                                                                          encoding="utf-8")
    assert assert_same(repo, repo / "branches" / "issue-4-named") is None
    assert assert_same(repo, repo.parent / "x" / "issue-4-named") is not None


def test_unusual_heads_are_answered_exactly_by_asking_git(repo: Path) -> None:
    """A HEAD the direct read does not copy git on (an unborn branch, a symbolic ref) gives git's own answer."""
    unborn = add(repo, "issue-1-unborn", "-b", "issue-1-unborn")
    admin = repo / ".git" / "worktrees" / "issue-1-unborn"
    (admin / "HEAD").write_text("ref: refs/heads/issue-1-not-there\n", encoding="utf-8")
    entry = assert_same(repo, unborn)
    assert entry is not None and entry.branch == "issue-1-not-there" and entry.head == "0" * 40
    symbolic = add(repo, "issue-2-symbolic", "-b", "issue-2-symbolic")
    (repo / ".git" / "refs" / "heads" / "issue-2-alias").write_text("ref: refs/heads/main\n", encoding="utf-8")
    (repo / ".git" / "worktrees" / "issue-2-symbolic" / "HEAD").write_text("ref: refs/heads/issue-2-alias\n",
                                                                            encoding="utf-8")
    entry = assert_same(repo, symbolic)
    assert entry is not None and entry.branch == "main"


def _fill(checkout: Path, count: int) -> None:
    """``count`` more worktrees, each on its own branch."""
    start = len(list((checkout / ".git" / "worktrees").glob("*"))) if (checkout / ".git" / "worktrees").is_dir() else 0
    for i in range(start, start + count):
        add(checkout, f"filler-{i}", "-b", f"filler-{i}")


def _work(checkout: Path, path: Path, issue: int) -> dict[str, Any]:
    """The files opened and the processes started by one read of each kind."""
    c = control(checkout)
    found: dict[str, Any] = {}
    for name, call in (("worktree_at", lambda: c.worktree_at(path)), ("admin_dir_for", lambda: c.admin_dir_for(path)),
                       ("branch_refs", lambda: c.branch_refs(f"issue-{issue}-")),
                       ("exact_refs", lambda: c.exact_refs("refs/heads/main", f"refs/heads/issue-{issue}-x"))):
        with counted() as events:
            call()
        found[name] = {"opened": sum(1 for e, _ in events if e == "open"),
                       "processes": [a for e, a in events if e == "subprocess.Popen"]}
    return found


def test_one_worktrees_registration_costs_the_same_with_3_or_40_other_worktrees(repo: Path) -> None:
    """The reads the bootstrap makes per issue open the same number of files and start the same processes
    (none for a registration) however many worktrees and branches exist (the old reads ran ``git worktree
    list`` and opened every registration's files)."""
    path = add(repo, "issue-1-mine", "-b", "issue-1-mine", "--lock", "--reason", "foreman bootstrap k")
    fresh = repo / "branches" / "issue-2-fresh"
    _fill(repo, 3)
    few = (_work(repo, path, 1), _work(repo, fresh, 2))
    _fill(repo, 37)
    many = (_work(repo, path, 1), _work(repo, fresh, 2))
    assert few == many
    for found in few:
        assert found["worktree_at"]["processes"] == [] and found["admin_dir_for"]["processes"] == []
    assert few[1]["branch_refs"]["processes"] == []  # no branch of the issue: nothing to verify with git


def test_an_issues_branches_are_what_for_each_ref_lists_of_them(repo: Path) -> None:
    """Loose, packed, loose over packed, nested, symbolic; a broken file, one naming a missing object (listed, as
    git lists it), a lock file, and another issue whose number starts alike: as ``git for-each-ref refs/heads/``."""
    main = git(repo, "rev-parse", "HEAD")
    git(repo, "branch", "issue-5-packed")
    git(repo, "branch", "issue-5-repacked")
    git(repo, "pack-refs", "--all")
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    second = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", "refs/heads/issue-5-repacked", second)  # loose now, over the packed one
    git(repo, "branch", "issue-5-loose")
    git(repo, "branch", "issue-5-nested/deeper")
    git(repo, "branch", "issue-50-other")
    git(repo, "branch", "issue-5")
    heads = repo / ".git" / "refs" / "heads"
    (heads / "issue-5-symbolic").write_text("ref: refs/heads/main\n", encoding="utf-8")
    (heads / "issue-5-broken").write_text("not a ref\n", encoding="utf-8")
    (heads / "issue-5-missing").write_text("1" * 40 + "\n", encoding="utf-8")
    (heads / "issue-5-x.lock").write_text(main + "\n", encoding="utf-8")
    listed = {name: sha for sha, name in (line.split(" ") for line in git(
        repo, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/").splitlines())}
    expected = {name: sha for name, sha in listed.items() if name.startswith("refs/heads/issue-5-")}
    assert control(repo).branch_refs("issue-5-") == expected
    assert set(expected) == {"refs/heads/issue-5-packed", "refs/heads/issue-5-repacked", "refs/heads/issue-5-loose",
                             "refs/heads/issue-5-nested/deeper", "refs/heads/issue-5-symbolic",
                             "refs/heads/issue-5-missing"}
    assert expected["refs/heads/issue-5-repacked"] == second and expected["refs/heads/issue-5-packed"] == main
    assert control(repo).branch_refs("issue-6-") == {}
    assert control(repo).exact_refs("refs/heads/issue-5-packed", "refs/heads/issue-5-repacked",
                                    "refs/heads/none") == {"refs/heads/issue-5-packed": main,
                                                           "refs/heads/issue-5-repacked": second}
