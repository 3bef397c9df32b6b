"""What git says of worktrees, as values: ``worktree list --porcelain`` records, registrations, a view from inside."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class WorktreeEntry:
    """One record of ``git worktree list --porcelain``."""

    path: str
    head: str | None
    branch: str | None  # short name; None when detached or bare
    detached: bool
    bare: bool
    locked: str | None  # the lock reason ("" when locked without one), None when unlocked
    prunable: str | None
    raw: tuple[str, ...] = field(compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "worktree": self.path,
            "HEAD": self.head,
            "branch": f"refs/heads/{self.branch}" if self.branch else None,
            "detached": self.detached,
            "locked": self.locked,
            "prunable": self.prunable,
            "porcelain": list(self.raw),
        }


def parse_worktree_porcelain(text: str) -> list[WorktreeEntry]:
    """Parse ``git worktree list --porcelain -z`` (NUL-terminated lines, an empty line between records)."""
    entries: list[WorktreeEntry] = []
    record: list[str] = []
    for line in [*text.split("\0"), ""]:
        if line:
            record.append(line)
            continue
        if not record:
            continue
        values: dict[str, str | None] = {}
        for item in record:
            key, _, value = item.partition(" ")
            values[key] = value if _ else None
        branch = values.get("branch")
        entries.append(
            WorktreeEntry(
                path=str(values.get("worktree") or ""),
                head=values.get("HEAD"),
                branch=branch.removeprefix("refs/heads/") if branch else None,
                detached="detached" in values,
                bare="bare" in values,
                locked=(values["locked"] or "") if "locked" in values else None,
                prunable=(values["prunable"] or "") if "prunable" in values else None,
                raw=tuple(record),
            )
        )
        record = []
    return entries


@dataclass(frozen=True, slots=True)
class AdminDir:
    """A ``.git/worktrees/<name>`` metadata directory: where it says its worktree is, and its lock reason."""

    name: str
    path: Path
    gitdir: str | None  # the worktree's .git file path as recorded, None when missing
    locked: str | None

    @property
    def worktree_path(self) -> str | None:
        return str(Path(self.gitdir).parent) if self.gitdir else None


@dataclass(frozen=True, slots=True)
class WorktreeView:
    """What git reports from inside a worktree (the registration's read-back)."""

    toplevel: str
    common_dir: str
    git_dir: str
    head: str
    head_ref: str

    def to_dict(self) -> dict[str, str]:
        return {
            "toplevel": self.toplevel,
            "common_dir": self.common_dir,
            "git_dir": self.git_dir,
            "HEAD": self.head,
            "head_ref": self.head_ref,
        }
