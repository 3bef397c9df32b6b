"""Worktree bootstrap planning (pure): branch, path and key derivation, phase order, plans on observed state."""

from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final, Literal, get_args

from bot.core.reasons import BlockReason

Phase = Literal[
    "accepted",
    "branch_confirmed",
    "path_reserved",
    "worktree_confirmed",
    "registration_verified",
    "lock_established",
    "completed",
    "compensation_required",
    "compensation_completed",
]
PHASES: Final[tuple[Phase, ...]] = get_args(Phase)
FORWARD_PHASES: Final[tuple[Phase, ...]] = PHASES[:7]
Outcome = Literal["open", "completed", "compensated"]
BlockKind = Literal["stale_pin", "invalid_state", "conflict"]

BRANCHES_DIR: Final = "branches"
#: Where a stranded worktree is kept for its earlier owner when another author takes the issue over, below
#: ``branches/``: no branch name can start with ``.``, so no issue's canonical path is ever there.
KEPT_DIR: Final = ".kept"
DEFAULT_SLUG_LENGTH: Final = 40
#: Caller-supplied idempotency keys: safe in an outbox marker (with a suffix) and in a git lock reason.
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
_SHA_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_REASON_PREFIX = "foreman bootstrap "


# --- phases -----------------------------------------------------------------------------------------------------------


def outcome_of(phase: Phase) -> Outcome:
    """``completed`` and ``compensation_completed`` end a transition; every other phase leaves it open."""
    if phase == "completed":
        return "completed"
    if phase == "compensation_completed":
        return "compensated"
    return "open"


def next_phase(phase: Phase) -> Phase | None:
    """The phase a successful step records after ``phase`` (None once the transition has ended)."""
    if phase in ("completed", "compensation_completed"):
        return None
    if phase == "compensation_required":
        return "compensation_completed"
    return FORWARD_PHASES[FORWARD_PHASES.index(phase) + 1]


def may_follow(previous: Phase, phase: Phase) -> bool:
    """The journal's only legal moves: one step forward, or from an unfinished forward phase to compensation."""
    if phase == "compensation_required":
        return previous in FORWARD_PHASES and previous != "completed"
    return next_phase(previous) == phase


# --- names and paths --------------------------------------------------------------------------------------------------


def slugify(title: str, max_length: int = DEFAULT_SLUG_LENGTH) -> str:
    """A branch-safe slug of an issue title: ASCII letters and digits joined by single dashes, cut at a dash
    when longer than ``max_length``; ``work`` when nothing is left."""
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii").lower()
    words = [w for w in re.split(r"[^a-z0-9]+", folded) if w]
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > max_length:
            if not slug:
                slug = word[:max_length]
            break
        slug = candidate
    return slug or "work"


def ref_name_problems(name: str) -> list[str]:
    """Why ``name`` is not a valid branch name (``git check-ref-format --branch`` rules); empty when valid."""
    problems: list[str] = []
    if not name:
        return ["is empty"]
    if name in ("@", "HEAD"):
        problems.append(f"cannot be {name!r}")
    if name.startswith("-"):
        problems.append("cannot start with '-'")
    if name.startswith("/") or name.endswith("/") or "//" in name:
        problems.append("cannot start or end with '/' or contain '//'")
    if name.endswith("."):
        problems.append("cannot end with '.'")
    if ".." in name:
        problems.append("cannot contain '..'")
    if "@{" in name:
        problems.append("cannot contain '@{'")
    bad = sorted({c for c in name if ord(c) < 0x20 or ord(c) == 0x7F or c in " ~^:?*[\\"})
    if bad:
        problems.append(f"cannot contain {''.join(bad)!r}")
    for part in name.split("/"):
        if part.startswith("."):
            problems.append(f"component {part!r} cannot start with '.'")
        if part.endswith(".lock"):
            problems.append(f"component {part!r} cannot end with '.lock'")
    return problems


def branch_for(issue_number: int, title: str, *, slug_length: int = DEFAULT_SLUG_LENGTH) -> str:
    """``issue-<N>-<slug>``, checked against git's ref-name rules (ValueError if it somehow is not valid)."""
    if isinstance(issue_number, bool) or not isinstance(issue_number, int) or issue_number < 1:
        raise ValueError("issue_number must be a positive integer")
    name = f"issue-{issue_number}-{slugify(title, slug_length)}"
    problems = ref_name_problems(name)
    if problems:
        raise ValueError(f"derived branch {name!r} {'; '.join(problems)}")
    return name


def issue_branch_prefix(issue_number: int) -> str:
    """What every branch of the issue starts with: ``issue-<N>-``."""
    return f"issue-{issue_number}-"


def is_issue_branch(name: str, issue_number: int) -> bool:
    """True for any ``issue-<N>-*`` branch of this issue (used to spot a second branch for one issue)."""
    return name.startswith(issue_branch_prefix(issue_number))


def derive_key(repo: str, issue_number: int, lease_id: str, attempt: int) -> str:
    """The idempotency key foreman derives when the caller gives none: one per (repo, issue, lease, attempt),
    where ``attempt`` counts the lease's transitions that ended compensated (so a failed attempt can be
    followed by a fresh one, while a replay of an unfinished or completed one finds the same key)."""
    digest = hashlib.sha256(f"{repo}\n{issue_number}\n{lease_id}\n{attempt}".encode()).hexdigest()[:32]
    return f"bootstrap-{issue_number}-{digest}"


def key_problem(key: str) -> str | None:
    """Why a caller-supplied idempotency key is refused (None when acceptable)."""
    if not _KEY_RE.fullmatch(key):
        return "must be 1-100 characters of letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
    return None


def sha_problem(value: str) -> str | None:
    """Why an expected-base pin is refused (None for a full lowercase hex object id)."""
    if not _SHA_RE.fullmatch(value):
        return "must be a full 40- or 64-character lowercase hex commit id"
    return None


def reflog_message(key: str) -> str:
    """The reflog message of a branch this transition creates (its creation proof)."""
    return f"{_REASON_PREFIX}{key}"


def worktree_lock_reason(key: str) -> str:
    """The git lock reason of a worktree this transition adds (its creation proof)."""
    return f"{_REASON_PREFIX}{key}"


class PathRejected(ValueError):
    """A requested or derived worktree path is outside the canonical ``branches/`` root (or malformed)."""


def branches_root(checkout: PurePosixPath) -> PurePosixPath:
    return checkout / BRANCHES_DIR


def check_canonical(checkout: PurePosixPath, path: PurePosixPath) -> PurePosixPath:
    """``path`` itself (normalized) when it lies strictly below ``<checkout>/branches/``; PathRejected otherwise.

    Lexical only: symbolic links are the edge's job (``bot.worktree_files.escapes_root``).
    """
    if not checkout.is_absolute():
        raise PathRejected(f"the control checkout path {str(checkout)!r} must be absolute")
    text = str(path)
    if "\x00" in text:
        raise PathRejected("a path cannot contain NUL")
    if not path.is_absolute():
        raise PathRejected(f"{text!r} is not an absolute path below {branches_root(checkout)}")
    if any(part in ("..", ".") for part in path.parts) or posixpath.normpath(text) != text:
        raise PathRejected(f"{text!r} contains '.' or '..' components")
    root = branches_root(checkout)
    try:
        below = path.relative_to(root)
    except ValueError:
        raise PathRejected(f"{text!r} is outside the canonical branches root {root}") from None
    if not below.parts:
        raise PathRejected(f"{text!r} is the branches root itself, not a worktree below it")
    return path


def worktree_path_for(checkout: PurePosixPath, branch: str) -> PurePosixPath:
    """``<checkout>/branches/<branch>``, checked (a branch name with ``..`` or a leading ``/`` cannot escape)."""
    problems = ref_name_problems(branch)
    if problems:
        raise PathRejected(f"branch {branch!r} {'; '.join(problems)}")
    return check_canonical(checkout, checkout / BRANCHES_DIR / branch)


def kept_path_for(checkout: PurePosixPath, branch: str, owner: str, journal_id: int) -> PurePosixPath:
    """``<checkout>/branches/.kept/<branch>--<owner>--journal-<id>``: where the worktree of ``owner``'s transition
    ``journal_id`` is kept when another author takes the issue over (one name per transition, stable across
    replays; one path component: a ``/`` of the branch, and a login's characters outside ``[A-Za-z0-9._-]``,
    become ``-``)."""
    problems = ref_name_problems(branch)
    if problems:
        raise PathRejected(f"branch {branch!r} {'; '.join(problems)}")
    who = re.sub(r"[^A-Za-z0-9._-]", "-", owner).strip(".") or "owner"
    name = f"{branch.replace('/', '-')}--{who}--journal-{int(journal_id)}"
    return check_canonical(checkout, checkout / BRANCHES_DIR / KEPT_DIR / name)


def resolve_requested(checkout: PurePosixPath, requested: str) -> PurePosixPath:
    """A caller-named path (``branches/<name>``, relative to the checkout) made absolute and checked.

    Absolute paths, ``..`` components, and anything not under ``branches/`` are refused.
    """
    if not requested or "\x00" in requested:
        raise PathRejected("the path is empty or contains NUL")
    if requested.startswith("/") or PurePosixPath(requested).is_absolute():
        raise PathRejected(f"{requested!r} is absolute; name a path relative to the checkout, under branches/")
    parts = PurePosixPath(requested).parts
    if ".." in parts or "." in parts or posixpath.normpath(requested) != requested.rstrip("/"):
        raise PathRejected(f"{requested!r} contains '.' or '..' components")
    return check_canonical(checkout, checkout / requested.rstrip("/"))


# --- decisions on observed state --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Blocked:
    """A step that cannot go on: a typed reason (``reason`` is a stable machine token) and a message."""

    kind: BlockKind
    reason: BlockReason
    message: str


@dataclass(frozen=True, slots=True)
class BranchFacts:
    """What git holds for the issue branch when a transition looks at it."""

    sha: str | None  # where refs/heads/<branch> points now (None: no such branch)
    created_by_this: bool  # its reflog's creation entry names this transition
    created_sha: str | None  # where this transition created it (from the reflog or the journal)
    prior_same_owner: bool  # an earlier completed transition of the same owner created or adopted it
    checked_out_elsewhere: str | None = None  # a worktree other than the canonical path holds it


BranchPlan = Literal["create", "ours", "adopt"]


def plan_branch(facts: BranchFacts, *, pin: str) -> BranchPlan | Blocked:
    """Create the branch at the pinned base, recognise our own, adopt valid existing work, or refuse.

    Never rebases, repoints or overwrites: a branch that exists at another commit and is not provably ours
    (or the same owner's earlier work) is ambiguous, and one of ours that moved since is a stale pin.
    """
    if facts.checked_out_elsewhere is not None:
        return Blocked(
            "invalid_state",
            "branch_checked_out_elsewhere",
            f"the branch is checked out in another worktree ({facts.checked_out_elsewhere}), outside branches/"
            " or under another name",
        )
    if facts.sha is None:
        return "create"
    if facts.created_by_this:
        if facts.created_sha is not None and facts.sha != facts.created_sha:
            return Blocked(
                "stale_pin", "branch_moved", f"the branch this transition created at {facts.created_sha} now"
                f" points at {facts.sha}",
            )
        return "ours"
    if facts.prior_same_owner:
        return "adopt"
    if facts.sha == pin:
        return "adopt"
    return Blocked(
        "invalid_state",
        "branch_exists_elsewhere",
        f"the branch already exists at {facts.sha}, which is not the pinned base {pin}, and no transition of"
        " this owner created it",
    )


@dataclass(frozen=True, slots=True)
class WorktreeFacts:
    """What git and the file system hold at the canonical worktree path."""

    path_exists: bool  # anything at the path (lstat)
    path_is_symlink: bool
    escapes_root: bool  # the path (or a parent) resolves outside <checkout>/branches
    entry_branch: str | None  # branch of a registered worktree at the path ("" detached, None unregistered)
    entry_head: str | None
    entry_prunable: bool  # registered, but its directory is gone
    entry_locked_by_this: bool  # the registration's lock reason names this transition
    admin_dir_by_this: bool  # leftover .git/worktrees metadata pointing at the path, locked by this transition
    content_proven: bool  # every file at the path is a byte-identical blob of the branch tree, nothing else
    clean: bool  # a registered worktree with no tracked change and no untracked or ignored file
    prior_same_owner: bool  # an earlier completed transition of the same owner registered it
    #: this transition's journal recorded the path free when it reserved it (``path_reserved``, ``existed: false``):
    #: only then can something found there later be a half-made worktree of its own
    reserved_empty: bool = False


WorktreePlan = Literal["create", "ours", "repair", "adopt"]


def plan_worktree(facts: WorktreeFacts, *, branch: str, pin: str, branch_created_by_this: bool) -> (
    WorktreePlan | Blocked
):
    """Add the worktree, recognise our own (possibly half-made: ``repair``), adopt a valid existing one, or refuse.

    Pre-existing content is adopted only when nothing would have to change (the same owner's registered
    worktree, or a clean registered worktree at the pinned base); anything else is left byte for byte as it is.
    """
    if facts.escapes_root or facts.path_is_symlink:
        return Blocked("invalid_state", "path_escapes_root", "the worktree path is, or goes through, a symbolic"
                       " link that leaves the branches root")
    if facts.entry_branch is not None:
        if facts.entry_branch != branch:
            shown = facts.entry_branch or "a detached HEAD"
            return Blocked("invalid_state", "incompatible_registration", f"a worktree registered at the path"
                           f" holds {shown}, not {branch}")
        if facts.entry_locked_by_this:
            if facts.entry_prunable or not facts.clean:
                return "repair" if (facts.content_proven or facts.entry_prunable) else Blocked(
                    "invalid_state", "dirty_unproven", "the worktree this transition added holds content that"
                    " is not provably its own",
                )
            return "ours"
        if facts.entry_prunable:
            return Blocked("invalid_state", "stale_registration", "a worktree registration for the path exists"
                           " but its directory is gone, and this transition did not create it")
        if facts.prior_same_owner:
            return "adopt"
        if facts.clean and facts.entry_head == pin and not branch_created_by_this:
            return "adopt"
        return Blocked("invalid_state", "preexisting_worktree", "a worktree of another origin is registered at"
                       " the path and is not clean at the pinned base; it is left untouched")
    if facts.admin_dir_by_this:
        return "repair"
    if facts.path_exists:
        # Content identical to the branch tree proves nothing about who made it: a directory that was there
        # before this transition reserved the path is preexisting work, kept byte for byte (never re-created).
        if facts.content_proven and branch_created_by_this and facts.reserved_empty:
            return "repair"
        return Blocked("invalid_state", "path_occupied", "something that is not a registered worktree of this"
                       " transition occupies the path; it is left untouched")
    return "create"


@dataclass(frozen=True, slots=True)
class UndoFacts:
    """What compensation knows about each artifact: whether this journal proves it created it, and whether
    removing it now would lose anything."""

    worktree_created: bool
    worktree_present: bool  # registered, or a directory / metadata left at the path
    worktree_registered: bool  # git lists a worktree at the path (it holds the branch while it stays)
    worktree_preserves: bool  # removing it loses nothing (clean or content-proven, HEAD where we created it)
    branch_created: bool
    branch_present: bool
    branch_at_created: bool  # still exactly where this transition created it
    registration_live: bool
    lease_live_and_ours: bool


@dataclass(frozen=True, slots=True)
class UndoPlan:
    undo: tuple[str, ...]  # in order
    keep: tuple[str, ...]  # artifacts left as they are (not ours, or already gone)
    blocked: tuple[str, ...]  # ours, but removing them would lose content: a person must look


def plan_compensation(facts: UndoFacts, *, release_lease: bool) -> UndoPlan:
    """Undo only what this journal proves it created, in reverse order of creation; never lose content."""
    undo: list[str] = []
    keep: list[str] = []
    blocked: list[str] = []
    worktree_stays = False
    if facts.worktree_present:
        if not facts.worktree_created:
            keep.append("worktree")
            worktree_stays = facts.worktree_registered
        elif facts.worktree_preserves:
            undo.append("worktree")
        else:
            blocked.append("worktree")
            worktree_stays = facts.worktree_registered
    if facts.branch_present:
        if not facts.branch_created:
            keep.append("branch")
        elif not facts.branch_at_created or worktree_stays:
            blocked.append("branch")
        else:
            undo.append("branch")
    if facts.registration_live:
        undo.append("registration")
    if facts.lease_live_and_ours:
        (undo if release_lease else keep).append("lease")
    return UndoPlan(tuple(undo), tuple(keep), tuple(blocked))
