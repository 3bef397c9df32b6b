"""The read verbs: an agent reads the issue it works on and its pull request (the diff, the files, the reviews and
whether foreman counts each, the CI of the head) through the door, with the bot's Gitea client, bounded per call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bot.author_trust import TrustGitea, trust_of
from bot.core.errors import Envelope
from bot.core.evidence import find_marker
from bot.core.verbs import Verb
from bot.gitea import GiteaError, GiteaNotFound
from bot.gitea.pull_reads import DiffText, FilesPage
from bot.gitea.values import ChangedFile, CombinedStatus, Comment, Issue, PullRequest, Review, ReviewComment
from bot.handler_deps import PermissionCache
from bot.verbs.candidates import depends_on
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.issue_state import state_document
from bot.verbs.merge import merge_gate_now
from bot.verbs.merge_gate import MergeChecks, MergeGate
from bot.verbs.review import PullsGitea, pull_for_issue
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, envelope, executes, issue_of, refused
from state.leases import Lease
from state.publications import PublicationStore

#: The most of a diff one call reads from Gitea (its pages are cut from this); a longer diff says so.
MAX_DIFF_BYTES = 4 << 20
#: The most changed files one call lists (Gitea pages of 50), and dependencies it looks up.
MAX_FILES = 500
MAX_DEPENDENCIES = 20


class ReadGitea(PullsGitea, TrustGitea, Protocol):
    """The Gitea reads of the read verbs (bot.gitea.GiteaClient provides them)."""

    async def list_issue_comments(self, number: int) -> list[Comment]: ...

    async def list_pull_files(self, number: int, *, page: int = ..., limit: int = ...) -> FilesPage: ...

    async def pull_diff(self, number: int, *, max_bytes: int) -> DiffText: ...

    async def list_review_comments(self, number: int, review_id: int) -> list[ReviewComment]: ...

    async def combined_status(self, ref: str) -> CombinedStatus: ...


# --- bounds -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """The part of a text one answer shows: ``text`` from ``offset``; ``cut`` when more follows."""

    text: str
    offset: int
    total: int

    @property
    def end(self) -> int:
        return self.offset + len(self.text)

    @property
    def cut(self) -> bool:
        return self.end < self.total

    def note(self, rest: str) -> dict[str, Any] | None:
        """What was cut and the exact call that reads on (None: nothing was)."""
        if not self.cut:
            return None
        return {"offset": self.offset, "shown_chars": len(self.text), "total_chars": self.total,
                "next_offset": self.end, "read_rest": rest}


def window(text: str, offset: int, limit: int) -> Window:
    start = min(max(0, offset), len(text))
    return Window(text[start:start + limit], start, len(text))


def _limit(rt: VerbRuntime[Any]) -> int:
    return rt.settings.mcp.read_max_chars


async def _gitea(rt: VerbRuntime[Any], verb: Verb, caller: Caller, number: int, lease: Lease | None) -> (
    ReadGitea | VerbResult
):
    """The bot's Gitea client; without one (no gitea.token) the answer is what foreman holds itself, saying what was
    not read (as the duplicate assessment does)."""
    if rt.gitea is None:
        held = await state_document(rt, number, lease) if verb.name == "read_issue" else None
        return rt.done(verb, caller, {
            "issue_number": number, "repository": rt.repo, "canonical_state": held,
            "unread": ["gitea"], "note": "foreman has no Gitea connection (no gitea.token): only what foreman holds "
            "itself is shown"})
    gitea: ReadGitea = rt.gitea
    return gitea


def _other_repository(rt: VerbRuntime[Any], verb: Verb, values: Mapping[str, object]) -> VerbResult | None:
    """A call naming a repository that is not this door's: refused (nothing is read)."""
    named = values.get("repository")
    if not isinstance(named, str) or named.lower() == rt.repo.lower():
        return None
    return refused(verb.name, envelope(
        "not_authorized", f"{ascii(named)[:150]} is not the repository foreman serves you here ({rt.repo}); nothing "
        "was read", "You read only the issues and pull requests of the repositories whose roster names you.",
        f"call {verb.tool} without repository (or with repository={rt.repo})", reason="other_repository",
        repository=named[:150], served=rt.repo))


def _read_refusal(verb: Verb, exc: GiteaError, number: int) -> VerbResult:
    return refused(verb.name, gitea_refusal(exc, GiteaAsk(
        what=f"read #{number}", refused_because="Gitea refused the read.",
        after_failure="Nothing changed; the read can be repeated.", retry=f"call {verb.tool} again",
        read_state=f"call gitea_get_issue_state with issue_number={number}")))


def _not_found(verb: Verb, number: int, repo: str) -> VerbResult:
    return refused(verb.name, envelope(
        "not_found", f"#{number} is not an issue or pull request of {repo} on Gitea", "Check the number.",
        "call gitea_get_runtime_context to see the issues you work on", reason="issue_not_found", issue_number=number))


def _foreign(rt: VerbRuntime[Any], verb: Verb, item: Issue | PullRequest) -> VerbResult | None:
    """Gitea answered with an item of another repository (a renamed or moved one redirected): refused."""
    found = item.raw.get("repository") or item.raw.get("base", {}).get("repo") or {}
    full = str(found.get("full_name") or "") if isinstance(found, Mapping) else ""
    if not full or full.lower() == rt.repo.lower():
        return None
    return refused(verb.name, envelope(
        "not_authorized", f"Gitea answered #{item.number} from {ascii(full)[:150]}, not {rt.repo}; nothing is shown",
        "You read only the repositories foreman serves you.", "call gitea_get_runtime_context",
        reason="other_repository", repository=full[:150], served=rt.repo))


def _user(raw: object) -> str:
    return str(raw.get("login") or raw.get("username") or "") if isinstance(raw, Mapping) else ""


def _time(value: object) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else None


async def _issue_read(rt: VerbRuntime[Any], verb: Verb, caller: Caller, number: int, values: Mapping[str, object],
                      lease: Lease | None) -> tuple[ReadGitea, Issue] | VerbResult:
    """What both reads start with: the repository asked for is the caller's, Gitea is there, and the issue (or PR)
    is this repository's; else the answer (a refusal, or what foreman holds without Gitea)."""
    other = _other_repository(rt, verb, values)
    if other is not None:
        return other
    gitea = await _gitea(rt, verb, caller, number, lease)
    if isinstance(gitea, VerbResult):
        return gitea
    try:
        issue = await gitea.get_issue(number)
    except GiteaNotFound:
        return _not_found(verb, number, rt.repo)
    except GiteaError as exc:
        return _read_refusal(verb, exc, number)
    foreign = _foreign(rt, verb, issue)
    return foreign if foreign is not None else (gitea, issue)


# --- gitea_read_issue -------------------------------------------------------------------------------------------------


@executes("read_issue")
async def read_issue(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    number = issue_of(values)
    first = await _issue_read(rt, verb, caller, number, values, lease)
    if isinstance(first, VerbResult):
        return first
    gitea, issue = first
    if issue.is_pull:
        return refused(verb.name, envelope(
            "invalid_input", f"#{number} is a pull request, not an issue", "Read it as a pull request.",
            f"call gitea_read_pull_request with issue_number={number}", reason="not_an_issue", issue_number=number))
    limit = _limit(rt)
    comment_id = values.get("comment_id")
    offset = int(str(values.get("offset") or 0))
    try:
        comments = await gitea.list_issue_comments(number)
        pulls = await _linked_pulls(rt, gitea, issue)
        dependencies = await _dependencies(gitea, issue.body)
        listing = await _comments(rt, gitea, verb, number, comments, values, limit)
    except GiteaError as exc:
        return _read_refusal(verb, exc, number)
    if isinstance(listing, Envelope):
        return refused(verb.name, listing)
    body = window(issue.body, 0 if comment_id is not None else offset, limit)
    milestone = issue.raw.get("milestone")
    doc: dict[str, Any] = {
        "issue_number": number,
        "repository": rt.repo,
        "title": issue.title,
        "state": issue.state,
        "author": issue.user.login,
        "created_at": _time(issue.created_at),
        "updated_at": _time(issue.updated_at),
        "html_url": issue.html_url,
        "labels": sorted(issue.label_names),
        "assignees": [user.login for user in issue.assignees],
        "milestone": ({"id": milestone.get("id"), "title": milestone.get("title"), "state": milestone.get("state"),
                       "due_on": milestone.get("due_on")} if isinstance(milestone, Mapping) else None),
        "body": body.text,
        "body_cut": body.note(f"call {verb.tool} with issue_number={number} and offset={body.end}"),
        "comments": listing,
        "canonical_state": await state_document(rt, number, lease),
        "pull_requests": pulls,
        "dependencies": dependencies,
    }
    return rt.done(verb, caller, doc)


async def _comments(
    rt: VerbRuntime[Any], gitea: ReadGitea, verb: Verb, number: int, comments: Sequence[Comment],
    values: Mapping[str, object], limit: int,
) -> dict[str, Any] | Envelope:
    """One page of the issue's comments (or the one ``comment_id`` names), each with its author's trust and
    whether it is foreman's evidence comment, each body bounded."""
    newest_first = values.get("newest_first") is True
    per_page = int(str(values.get("per_page") or 10))
    page = int(str(values.get("page") or 1))
    comment_id = values.get("comment_id")
    ordered = list(reversed(comments)) if newest_first else list(comments)
    total = len(ordered)
    pages = max(1, (total + per_page - 1) // per_page)
    offset = 0
    if comment_id is not None:
        chosen = [c for c in ordered if c.id == comment_id]
        if not chosen:
            return envelope("invalid_input", f"comment {comment_id} is not a comment of #{number}",
                            "Use an id from the issue's comments[].", f"call {verb.tool} with issue_number={number}"
                            " and no comment_id to list its comments", reason="issue_not_found",
                            comment_id=comment_id)
        offset = int(str(values.get("offset") or 0))
    else:
        chosen = ordered[(page - 1) * per_page: page * per_page]
    cache = PermissionCache()
    bot = rt.bot_login or rt.settings.gitea.bot_login or ""
    items = []
    for comment in chosen:
        author = comment.user.login
        try:
            trust = await trust_of(author, rt.settings, gitea, bot, cache)
            trusted, why = bool(trust.trusted), trust.reason
        except GiteaError as exc:  # fail closed: unknown is not trusted
            trusted, why = False, f"unreadable: {exc.message}"[:200]
        marker = find_marker(comment.body)
        text = window(comment.body, offset, limit)
        items.append({
            "id": comment.id,
            "author": author,
            "created_at": _time(comment.created_at),
            "updated_at": _time(comment.updated_at),
            "trusted": trusted,
            "trust_reason": why,
            "evidence": marker is not None and bool(bot) and author.lower() == bot.lower(),
            "evidence_key": marker,
            "body": text.text,
            "body_cut": text.note(f"call {verb.tool} with issue_number={number}, comment_id={comment.id} and "
                                  f"offset={text.end}"),
        })
    following = None
    if comment_id is None and page < pages:
        following = (f"call {verb.tool} with issue_number={number}, page={page + 1}"
                     + (", newest_first=true" if newest_first else "") + f" and per_page={per_page}")
    return {"total": total, "page": page if comment_id is None else None, "per_page": per_page, "pages": pages,
            "newest_first": newest_first, "items": items, "next_page": following}


async def _linked_pulls(rt: VerbRuntime[Any], gitea: ReadGitea, issue: Issue) -> list[dict[str, Any]]:
    """The issue's pull requests: the one foreman recorded opening, and the one ``pull_for_issue`` answers (its
    canonical branch's, merged ones too)."""
    recorded = await PublicationStore(rt.db).pull_for_issue(rt.repo, issue.number)
    found: dict[int, PullRequest] = {}
    if recorded is not None:
        try:
            found[recorded.pr_number] = await gitea.get_pull(recorded.pr_number)
        except GiteaNotFound:
            pass
    # With no PR recorded, only the open ones are searched: a search of merged ones too lists every pull request
    # the repository ever had (Gitea has no head filter), which grew each read with the issues already lived.
    current = await pull_for_issue(gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length,
                                   include_merged=recorded is not None)
    if current is not None:
        found[current.number] = current
    recorded_number = recorded.pr_number if recorded is not None else None
    return [{"number": pull.number, "title": pull.title, "state": pull.state, "merged": pull.merged,
             "head": pull.head_ref, "base": pull.base_ref, "head_sha": pull.head_sha, "html_url": pull.html_url,
             "opened_by_foreman": pull.number == recorded_number}
            for pull in sorted(found.values(), key=lambda p: p.number)]


async def _dependencies(gitea: ReadGitea, body: str) -> list[dict[str, Any]]:
    """The issues the body names on ``Depends:`` lines (what the allocator waits for), each with its state."""
    out: list[dict[str, Any]] = []
    for number in depends_on(body)[:MAX_DEPENDENCIES]:
        try:
            dep = await gitea.get_issue(number)
        except GiteaNotFound:
            out.append({"issue_number": number, "state": "missing", "title": None, "holds_back": False})
            continue
        out.append({"issue_number": number, "state": dep.state, "title": dep.title,
                    "holds_back": dep.state == "open"})
    return out


# --- gitea_read_pull_request ------------------------------------------------------------------------------------------


@executes("read_pull_request")
async def read_pull_request(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    number = issue_of(values)
    first = await _issue_read(rt, verb, caller, number, values, lease)
    if isinstance(first, VerbResult):
        return first
    gitea, issue = first
    try:
        if issue.is_pull:
            pull: PullRequest | None = await gitea.get_pull(number)
        else:
            pull = await pull_for_issue(gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length,
                                        include_merged=True)
    except GiteaError as exc:
        return _read_refusal(verb, exc, number)
    if pull is None:
        return refused(verb.name, envelope(
            "not_found", f"#{number} has no pull request (none opened from its branch, none recorded)",
            "Its author opens one with gitea_open_pull_request.",
            f"call gitea_get_issue_state with issue_number={number}", reason="no_pull_request", issue_number=number))
    issue_number = number if not issue.is_pull else None
    try:
        files = await _files(gitea, pull.number)
        diff = await gitea.pull_diff(pull.number, max_bytes=MAX_DIFF_BYTES)
        reviews = await gitea.list_reviews(pull.number)
        comments = await _review_comments(gitea, pull.number, reviews)
        status = await gitea.combined_status(pull.head_sha) if pull.head_sha else None
        gate = await merge_gate_now(rt, gitea, issue_number if issue_number is not None else pull.number, pull,
                                    MergeChecks(gitea, rt.settings))
    except GiteaError as exc:
        return _read_refusal(verb, exc, number)
    limit = _limit(rt)
    file = values.get("file")
    page = int(str(values.get("page") or 1))
    diff_doc = _diff_page(verb, number, diff, file if isinstance(file, str) else None, page, limit)
    if isinstance(diff_doc, Envelope):
        return refused(verb.name, diff_doc)
    body = window(pull.body, int(str(values.get("offset") or 0)), limit)
    doc: dict[str, Any] = {
        "issue_number": number,
        "repository": rt.repo,
        "pull_number": pull.number,
        "title": pull.title,
        "state": pull.state,
        "author": pull.user.login,
        "html_url": pull.html_url,
        "body": body.text,
        "body_cut": body.note(f"call {verb.tool} with issue_number={number} and offset={body.end}"),
        "head": {"ref": pull.head_ref, "sha": pull.head_sha},
        "base": {"ref": pull.base_ref, "sha": pull.base_sha},
        "merge_base": pull.merge_base,
        "mergeable": pull.mergeable,
        "merged": pull.merged,
        "merge_commit_sha": pull.merge_commit_sha,
        "files": files,
        "diff": diff_doc,
        "reviews": _reviews(reviews, gate, limit),
        "review_comments": [_review_comment(c, limit) for c in comments],
        "gate": gate.to_dict(),
        "not_counted": gate.not_counted_docs(),
        "commit_status": _status(status),
    }
    return rt.done(verb, caller, doc)


async def _files(gitea: ReadGitea, number: int) -> dict[str, Any]:
    """Every changed file (up to ``MAX_FILES``), read page by page."""
    out: list[ChangedFile] = []
    page, total = 1, 0
    while len(out) < MAX_FILES:
        found = await gitea.list_pull_files(number, page=page)
        total = found.total
        out.extend(found.files)
        if not found.files or len(out) >= total:
            break
        page += 1
    return {"total": total, "complete": len(out) >= total,
            "items": [{"filename": f.filename, "status": f.status, "additions": f.additions, "deletions": f.deletions,
                       **({"previous_filename": f.previous_filename} if f.previous_filename else {})}
                      for f in out[:MAX_FILES]]}


def diff_sections(text: str) -> list[tuple[str, str]]:
    """The unified diff file by file: (the file's name on its new side, its section from ``diff --git``)."""
    sections: list[tuple[str, str]] = []
    starts = [i for i in range(len(text)) if text.startswith("diff --git ", i) and (i == 0 or text[i - 1] == "\n")]
    for at, start in enumerate(starts):
        end = starts[at + 1] if at + 1 < len(starts) else len(text)
        section = text[start:end]
        sections.append((_section_name(section), section))
    return sections


def _section_name(section: str) -> str:
    for line in section.split("\n", 8)[1:8]:
        if line.startswith("+++ ") and line != "+++ /dev/null":
            return line[4:].removeprefix("b/")
        if line.startswith("rename to "):
            return line[len("rename to "):]
    for line in section.split("\n", 8)[1:8]:
        if line.startswith("--- ") and line != "--- /dev/null":
            return line[4:].removeprefix("a/")
    head = section.split("\n", 1)[0]
    return head.rsplit(" b/", 1)[-1] if " b/" in head else head


def _pages(sections: Sequence[tuple[str, str]], limit: int) -> list[list[tuple[str, str]]]:
    """Whole file sections packed into pages of at most ``limit`` characters (a longer section is a page alone)."""
    pages: list[list[tuple[str, str]]] = []
    size = 0
    for name, section in sections:
        if not pages or size + len(section) > limit:
            pages.append([])
            size = 0
        pages[-1].append((name, section))
        size += len(section)
    return pages


def _diff_page(verb: Verb, number: int, diff: DiffText, file: str | None, page: int, limit: int) -> (
    dict[str, Any] | Envelope
):
    """One page of the diff: without ``file``, whole file sections packed up to the bound (a section longer than it
    cut, with ``file`` named to read it on); with ``file``, that file's section in pages of the bound."""
    sections = diff_sections(diff.text)
    names = [name for name, _ in sections]
    call = f"call {verb.tool} with issue_number={number}"
    if file is not None:
        found = [section for name, section in sections if name == file]
        if not found:
            return envelope("invalid_input", f"{ascii(file)[:200]} is not a file of this pull request's diff",
                            "Use a filename from files[] (or diff.files).", f"{call} and no file to list them",
                            reason="file_not_in_diff")
        text = found[0]
        pages = max(1, (len(text) + limit - 1) // limit)
        shown = text[(page - 1) * limit: page * limit]
        rest = f"{call}, file={file} and page={page + 1}" if page < pages else None
        return {"file": file, "page": page, "pages": pages, "text": shown, "files_on_page": [file] if shown else [],
                "complete": diff.complete, "files": names, "next_page": rest, "cut": None}
    packed = _pages(sections, limit)
    pages = max(1, len(packed))
    chosen = packed[page - 1] if page <= len(packed) else []
    text = "".join(section for _, section in chosen)
    cut = None
    if len(text) > limit:  # one file's section alone, longer than the bound
        name = chosen[0][0]
        cut = {"file": name, "shown_chars": limit, "total_chars": len(text),
               "read_rest": f"{call}, file={name} and page=2"}
        text = text[:limit]
    rest = f"{call} and page={page + 1}" if page < pages else None
    return {"file": None, "page": page, "pages": pages, "text": text, "files_on_page": [n for n, _ in chosen],
            "complete": diff.complete, "files": names, "next_page": rest, "cut": cut}


async def _review_comments(gitea: ReadGitea, number: int, reviews: Sequence[Review]) -> list[ReviewComment]:
    out: list[ReviewComment] = []
    for review in reviews:
        if int(review.raw.get("comments_count") or 0) > 0:
            out.extend(await gitea.list_review_comments(number, review.id))
    return out


def _reviews(reviews: Sequence[Review], gate: MergeGate, limit: int) -> list[dict[str, Any]]:
    """Each review with whether foreman counts it: an approval the merge is pinned to or that counts on the head, a
    request-changes verdict that blocks, or why not (the merge gate's ``not_counted``)."""
    approvals = {v.review_id for v in gate.approvals}
    counted = gate.counted.review_id if gate.counted is not None else None
    blocking = {r.id for r in gate.blocking}
    why = {n.review_id: n.why for n in gate.not_counted}
    out = []
    for review in reviews:
        if review.id in approvals or review.id == counted:
            counts: str | None = "approval"
        elif review.id in blocking:
            counts = "blocks"
        else:
            counts = None
        out.append({"id": review.id, "user": review.user.login if review.user is not None else "",
                    "state": review.state, "commit_id": review.commit_id, "official": review.official,
                    "stale": review.stale, "dismissed": review.dismissed,
                    "submitted_at": _time(review.submitted_at), "body": review.body[:limit],
                    "counted": counts is not None, "counts_as": counts, "not_counted_why": why.get(review.id)})
    return out


def _review_comment(comment: ReviewComment, limit: int) -> dict[str, Any]:
    return {"id": comment.id, "review_id": comment.pull_request_review_id,
            "user": comment.user.login if comment.user is not None else "", "path": comment.path,
            "line": comment.position or None, "old_line": comment.original_position or None,
            "commit_id": comment.commit_id, "created_at": _time(comment.created_at), "body": comment.body[:limit],
            "body_cut": len(comment.body) > limit}


def _status(status: CombinedStatus | None) -> dict[str, Any] | None:
    if status is None:
        return None
    return {"sha": status.sha, "state": status.state or None, "total_count": status.total_count,
            "statuses": [{"context": s.context, "state": s.state, "target_url": s.target_url,
                          "description": s.description, "created_at": _time(s.created_at)} for s in status.statuses]}
