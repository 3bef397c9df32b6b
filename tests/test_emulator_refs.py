"""The emulator reads a branch's or a pull request's head from the ref files git stored (no process per read), with
the same answers as ``git rev-parse``; and keeps a diff's figures between two commits, which never change."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bot.emulator import pullgit


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every ``subprocess.run`` from now on, recorded (and run)."""
    calls: list[object] = []
    real_run = subprocess.run

    def run(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    work, bare = tmp_path / "work", tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "a.txt").write_text("one\n", encoding="utf-8")
    _git(work, "add", "a.txt")
    _git(work, "commit", "-q", "-m", "one")
    (work / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    _git(work, "commit", "-q", "-am", "two")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare


def test_refs_read_from_files_answer_as_git_does(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main = _git(bare, "rev-parse", "main")
    first = _git(bare, "rev-parse", "main^")
    _git(bare, "update-ref", "refs/heads/loose", first)
    _git(bare, "update-ref", "refs/pull/3/head", main)
    _git(bare, "pack-refs", "--all")  # main and loose now packed, loose written again as a loose file
    _git(bare, "update-ref", "refs/heads/loose", main)
    _git(bare, "update-ref", "refs/heads/gone", main)
    _git(bare, "pack-refs", "--all")
    _git(bare, "update-ref", "-d", "refs/heads/gone")
    calls = _count_runs(monkeypatch)
    found = {ref: pullgit.rev(bare, ref) for ref in ("refs/heads/main", "refs/heads/loose", "refs/pull/3/head",
                                                     "refs/heads/gone", "refs/heads/never")}
    assert found == {"refs/heads/main": main, "refs/heads/loose": main, "refs/pull/3/head": main,
                     "refs/heads/gone": None, "refs/heads/never": None}
    assert calls == []  # no process for a branch or a pull request's head
    assert pullgit.rev(bare, "main^") == first and calls  # anything else is git's


def test_a_symbolic_or_unreadable_ref_file_is_left_to_git(bare: Path) -> None:
    main = _git(bare, "rev-parse", "main")
    _git(bare, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    assert pullgit.rev(bare, "refs/heads/alias") == main


def test_a_diffs_figures_between_two_commits_are_kept(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main, first = _git(bare, "rev-parse", "main"), _git(bare, "rev-parse", "main^")
    assert pullgit.shortstat(bare, first, main) == (1, 1, 0)
    calls = _count_runs(monkeypatch)
    assert pullgit.shortstat(bare, first, main) == (1, 1, 0) and calls == []
    assert pullgit.shortstat(bare, "main^", "main") == (1, 1, 0) and calls  # names, not ids: asked again
