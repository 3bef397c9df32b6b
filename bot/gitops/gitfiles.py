"""Reading what git wrote without a git process: object ids, refs, HEAD files, the names git gives worktrees."""

from __future__ import annotations

import os
import re
from pathlib import Path

from bot.core.bootstrap import ref_name_problems
from bot.worktree_files import read_text

ZERO_OID = "0" * 40
OID_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def read_small(path: Path) -> str | None:
    """A file's text as git wrote it (bytes that are not UTF-8 kept as GitPython decodes git's output), None when
    there is no file there (nothing, or a directory)."""
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def refname_problem(branch: str) -> bool:
    return bool(ref_name_problems(branch))


#: git's isspace(): what ``strbuf_trim`` / ``strbuf_rtrim`` strip.
GIT_SPACE = " \t\n\r"
#: What ``git worktree list`` says of a registration whose worktree's ``.git`` is gone (worktree.c,
#: should_prune_worktree; foreman runs git with LC_ALL=C, so this is the text git prints).
PRUNABLE_MISSING = "gitdir file points to non-existent location"
#: A worktree name git's ``worktree add`` may give a path whose last component is ``base``: ``base``, or ``base``
#: followed by a counter when that name is taken. Only for a ``base`` that git's name sanitising leaves as it is.
PLAIN_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class Unsure(Exception):
    """The direct read met something git resolves in ways it does not copy: ask git instead."""


def symbolic_head(head_file: Path) -> str | None:
    """The ref a HEAD file names (``ref: refs/heads/x``), None when detached or unreadable."""
    text = read_text(head_file)
    return text[5:].strip() if text and text.startswith("ref: ") else None


def recorded_path(path: Path) -> str:
    """``path`` as git records it: its parent's real path and its own last component (not followed)."""
    return f"{os.path.realpath(path.parent)}/{path.name}"
