"""Gitea's drafts: a pull request whose title starts with a work-in-progress prefix is a draft Gitea refuses to merge
(405 "Work in progress PRs cannot be merged"). Gitea's default ``[repository.pull-request]
WORK_IN_PROGRESS_PREFIXES`` is ``WIP:, [WIP]``, compared case-insensitively (models/issues/pull.go
``HasWorkInProgressPrefix``, 1.22; ``CutWorkInProgressPrefix``, 1.26; services/pull/check.go ``CheckPullMergeable``).
Pure: the pull-request verb titles a PR without one, and the merge verb refuses a draft before asking Gitea."""

from __future__ import annotations

from typing import Final

#: Gitea's default prefixes (modules/setting/repository.go); a site may configure others.
WORK_IN_PROGRESS_PREFIXES: Final = ("WIP:", "[WIP]")


def is_work_in_progress(title: str) -> bool:
    """Whether Gitea reads ``title`` as a draft's (one of the prefixes, any ASCII case)."""
    head = title.upper()
    return any(head.startswith(prefix.upper()) for prefix in WORK_IN_PROGRESS_PREFIXES)


def without_work_in_progress(title: str, *, fallback: str) -> str:
    """``title`` with every leading work-in-progress prefix removed (``[WIP] WIP: x`` is ``x``), trimmed;
    ``fallback`` when nothing is left."""
    text = title.strip()
    while is_work_in_progress(text):
        prefix = next(p for p in WORK_IN_PROGRESS_PREFIXES if text.upper().startswith(p.upper()))
        text = text[len(prefix):].strip()
    return text or fallback
