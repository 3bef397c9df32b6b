"""The one verb table: gateway preconditions, MCP tool names, comment commands, docs and tests read it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)

from bot.core import verb_outputs as out
from bot.core.gateway import ROLES, Decision, GatewayContext, Precondition, Role, evaluate_preconditions
from bot.core.verb_outputs import answer_schema, result
from bot.core.verb_params import MAX_COMMIT_MESSAGE, Param, validators

# ruff's S106 reads "missing_token" as a password argument; it names a missing artifact (seed 001).

Effect = Literal["read", "mutate"]
Gate = Precondition[GatewayContext]
ALL_ROLES: frozenset[Role] = frozenset(ROLES)


def role_gate(roles: frozenset[Role]) -> Gate:
    """The verb's first precondition: the caller holds one of ``roles`` (all roles = on the roster)."""
    if not roles:
        raise ValueError("a verb needs at least one allowed role")
    if roles == ALL_ROLES:
        return ON_ROSTER
    names = sorted(roles)
    label = " or ".join(names)
    return Precondition(
        key=f"role:{'|'.join(names)}",
        check=lambda ctx: bool(ctx.caller_roles & roles),
        remediate=f"this needs the {label} role; have a {label}-role identity perform it",
        missing_token=f"role:{'|'.join(names)}",
        rejection_kind="not_authorized",
        next_action="call gitea_get_runtime_context to see the work assigned to you",
        words=" or ".join(f"an identity with the {name} role" for name in names),
    )


#: What a login with no role on the roster is told, whatever it calls: only an operator can give it a role, and it
#: has no tool to call meanwhile.
NOT_ON_ROSTER = "you are not on the foreman roster; ask an operator to add your login under [roster]"

#: The gate a login with no roster role fails first, whatever the verb (``identity_gate``).
ON_ROSTER: Gate = Precondition(
    key="on_roster",
    check=lambda ctx: bool(ctx.caller_roles),
    remediate=NOT_ON_ROSTER,
    missing_token="roster_role",  # noqa: S106
    rejection_kind="not_authorized",
    next_action="ask an operator to add your login under [roster] in foreman's configuration; until then you have no "
    "tool to call",
    words="any identity on the roster",
)


def identity_gate(verb: Verb) -> tuple[Gate, ...]:
    """The gates decided on the caller's identity alone, before anything else: the verb's role gate, after the roster
    gate that tells a login with no role at all to ask an operator (never to call a tool it does not have)."""
    first = verb.preconditions[0]
    return (first,) if first is ON_ROSTER else (ON_ROSTER, first)


PRECONDITION_OWNERSHIP: Gate = Precondition(
    key="owns_lease",
    check=lambda ctx: ctx.owns_live_lease,
    remediate="issue is not leased to you; call gitea_get_runtime_context to find your work",
    missing_token="owns_lease",  # noqa: S106
    rejection_kind="not_authorized",
    words="the holder of the issue's live lease",
)

PRECONDITION_OWNERSHIP_OR_CONTROLLER: Gate = Precondition(
    key="owns_lease_or_controller",
    check=lambda ctx: ctx.owns_live_lease or "controller" in ctx.caller_roles,
    remediate=(
        "issue is not leased to you and you are not the controller; "
        "call gitea_get_runtime_context to find your work"
    ),
    missing_token="owns_lease_or_controller",  # noqa: S106
    rejection_kind="not_authorized",
    words="the holder of the issue's live lease, or a controller",
)

PRECONDITION_NOT_PR_AUTHOR: Gate = Precondition(
    key="not_pr_author",
    check=lambda ctx: ctx.pr_author is None or ctx.pr_author != ctx.caller,
    remediate="you wrote this pull request and cannot review it; have a different reviewer claim it",
    missing_token="not_pr_author",  # noqa: S106
    rejection_kind="not_authorized",
    next_action="call gitea_get_runtime_context to find other work",
    words="not the pull request's author",
)

PRECONDITION_NOT_IMPLEMENTER: Gate = Precondition(
    key="not_implementer",
    check=lambda ctx: ctx.implementer is None or ctx.implementer != ctx.caller,
    remediate="you implemented this issue (its last implement lease was yours) and cannot review it; "
    "have a different reviewer claim it",
    missing_token="not_implementer",  # noqa: S106
    rejection_kind="not_authorized",
    next_action="call gitea_get_runtime_context to find other work",
    words="not the issue's implementer",
)

PRECONDITION_IN_REVIEW: Gate = Precondition(
    key="in_review",
    check=lambda ctx: ctx.issue_state == "review",
    remediate="the issue is not in status:review; its author must open the pull request first",
    missing_token="status_review",  # noqa: S106
    message="Missing required status:review",
    next_action="call gitea_get_issue_state to follow the issue until it is in review",
    words="the issue is in status:review",
)

PRECONDITION_LIVE_LEASE: Gate = Precondition(
    key="live_lease",
    check=lambda ctx: ctx.lease_live,
    remediate="the issue has no live lease; the controller must call gitea_allocate_next_work first",
    missing_token="live_lease",  # noqa: S106
    message="Missing required live lease",
    next_action="call gitea_get_issue_state to see who holds the issue",
    words="the issue has a live lease",
)

PRECONDITION_WORKTREE: Gate = Precondition(
    key="worktree_registered",
    check=lambda ctx: ctx.worktree_registered,
    remediate="no registered worktree under branches/ for this issue; call gitea_bootstrap_issue_worktree",
    missing_token="worktree",  # noqa: S106
    message="Missing required worktree",
    words="the issue's worktree is registered to you (gitea_bootstrap_issue_worktree)",
)

PRECONDITION_LOCK: Gate = Precondition(
    key="issue_locked",
    check=lambda ctx: ctx.locked,
    remediate="the issue is not locked to your worktree; call gitea_lock_issue first",
    missing_token="issue_lock",  # noqa: S106
    message="Missing required issue lock",
    words="the issue is locked to that worktree (gitea_lock_issue)",
)

PRECONDITION_COMMITS: Gate = Precondition(
    key="commits",
    check=lambda ctx: ctx.commits_ahead > 0,
    remediate="the issue branch on Gitea has no commit beyond the default branch; call gitea_publish_worktree",
    missing_token="commits",  # noqa: S106
    message="Missing required commit(s)",
    words="the issue branch on Gitea has a commit beyond the default branch (gitea_publish_worktree)",
)

PRECONDITION_PR_EXISTS: Gate = Precondition(
    key="pr_exists",
    check=lambda ctx: ctx.pr_number is not None,
    remediate="no pull request for this issue yet; the author must call gitea_open_pull_request first",
    missing_token="pull_request",  # noqa: S106
    message="Missing required pull request",
    next_action="call gitea_get_issue_state to follow the issue until its PR is open",
    words="the issue's pull request is open",
)

PRECONDITION_PR_APPROVED: Gate = Precondition(
    key="pr_approved",
    check=lambda ctx: ctx.pr_approved,
    remediate="the pull request has no approving review; a reviewer must call gitea_claim_review and approve",
    missing_token="approval",  # noqa: S106
    message="Missing required approval",
    next_action="call gitea_get_issue_state to follow the review",
    words="the pull request has an approval a roster reviewer recorded through foreman",
)


#: The argument every tool takes where its identity works in more than one served repository (its login on more
#: than one repository's roster): which one the call acts on. The MCP server takes it off the call and hands the
#: rest to that repository's door, so no verb ever receives it; a sealed grant is bound to its repository instead.
REPOSITORY_PARAM = Param(
    "repository", "repository", "the repository the call acts on, as owner/name (default: the only one you work in)"
)


def _issue(description: str = "the issue number") -> Param:
    return Param("issue_number", "issue_number", description, required=True)


@dataclass(frozen=True, slots=True)
class Verb:
    """One gateway action: who may call it, what must hold first (gates first), what it touches.

    ``params`` are its arguments (the MCP tool's input schema). ``command`` is its comment command
    (``/release``), if it has one. ``executable`` is False for a verb the gateway decides but no edge
    carries out yet: it is then neither an MCP tool nor a comment command.
    """

    name: str
    summary: str
    roles: frozenset[Role]
    preconditions: tuple[Gate, ...]
    effect: Effect
    next_verbs: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    command: str | None = None
    executable: bool = True
    #: The tool's title, for people (an MCP client shows it instead of the name).
    title: str = ""
    #: The verb's result (``bot.core.verb_outputs.result``): what its tool's ``outputSchema`` says a success holds.
    output: Mapping[str, Any] | None = None
    #: A write verb's replay, in one line: what calling it again with the same arguments (and key) does.
    replay: str = ""
    #: A replay with the same arguments (and key) changes nothing more (MCP ``idempotentHint``); reads always.
    idempotent: bool = False
    #: It may end or overwrite something rather than only add (MCP ``destructiveHint``).
    destructive: bool = False

    def __post_init__(self) -> None:
        if not self.preconditions or self.preconditions[0].rejection_kind != "not_authorized":
            raise ValueError(f"{self.name}: the first precondition must be a role/ownership gate")
        kinds = [p.rejection_kind for p in self.preconditions]
        first_gap = kinds.index("tracing_gap") if "tracing_gap" in kinds else len(kinds)
        if "not_authorized" in kinds[first_gap:]:
            raise ValueError(f"{self.name}: every ownership/role gate must come before artifact checks")
        tokens = [p.missing_token for p in self.preconditions]
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{self.name}: missing tokens must be unique")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: argument names must be unique")
        if self.command is not None and not re.fullmatch(r"/[a-z][a-z-]*", self.command):
            raise ValueError(f"{self.name}: a comment command is a slash and a lower-case word")

    @property
    def tool(self) -> str:
        """The MCP tool name."""
        return f"gitea_{self.name}"

    @property
    def issue_scoped(self) -> bool:
        """Whether the verb acts on one issue (its ``issue_number`` argument)."""
        return any(p.name == "issue_number" for p in self.params)

    def output_schema(self) -> dict[str, Any]:
        """The JSON Schema of what the tool answers in ``structuredContent``: the verb's result (with ``verb`` and
        ``next``), a refusal (the error envelope), or a run's plan-only result."""
        if self.output is None:
            raise ValueError(f"{self.name}: declare its result (output=result(...)) next to it in the verb table")
        return answer_schema(self.name, dict(self.output))

    def who_and_when(self) -> tuple[str, list[str]]:
        """Who may call the verb and what must hold first, in words (the gates' ``words``, never their keys)."""
        gates = [p for p in self.preconditions if p.rejection_kind == "not_authorized"]
        artifacts = [p for p in self.preconditions if p.rejection_kind != "not_authorized"]
        words = [p.words for p in gates if not (p is ON_ROSTER and len(gates) > 1)]
        return "; ".join(words), [p.words for p in artifacts]

    def input_schema(self, *, repository: bool = False) -> dict[str, Any]:
        """The JSON Schema of the verb's arguments (an object; unknown arguments are refused); with ``repository``
        also the optional ``repository`` argument (``REPOSITORY_PARAM``) of an identity in several repositories."""
        params = (*self.params, REPOSITORY_PARAM) if repository else self.params
        return {
            "type": "object",
            "properties": {p.name: p.published_schema() for p in params},
            "required": [p.name for p in params if p.required],
            "additionalProperties": False,
        }

    def check_arguments(self, arguments: Mapping[str, object]) -> tuple[dict[str, object], list[dict[str, str]]]:
        """The arguments as the verb receives them (defaults filled in), and every problem
        (``{"argument", "problem"}``) found: the call checked against :meth:`input_schema`, one argument at a time.

        ``null`` for an optional argument means left out (the published schema allows it); for a required one it is
        refused. The
        caller's identity is never an argument: a ``caller``/``owner``-like argument the verb does not declare is
        refused like any other unknown name.
        """
        known = {p.name: p for p in self.params}
        problems = [
            {
                "argument": _shown(name),
                "problem": f"unknown argument; {self.tool} takes: {', '.join(known) or 'nothing'}",
            }
            for name in arguments
            if name not in known
        ]
        values: dict[str, object] = {}
        for param in self.params:
            if param.name not in arguments:
                if param.required:
                    problems.append({"argument": param.name, "problem": "required"})
                values[param.name] = param.default
                continue
            value = arguments[param.name]
            if value is None:
                if param.required:
                    problems.append({"argument": param.name, "problem": "required (null is not a value)"})
                values[param.name] = param.default  # an optional argument sent as null is left out
                continue
            accepted, problem = param.accept(value)
            if problem is not None:
                problems.append({"argument": param.name, "problem": problem})
            values[param.name] = accepted
        return values, problems


def _shown(name: object) -> str:
    """An argument name as a refusal may quote it: short, printable ASCII."""
    text = name if isinstance(name, str) else repr(type(name))
    return text if len(text) <= 64 and text.isascii() and text.isprintable() else ascii(text[:64])


def _verb(
    name: str,
    summary: str,
    *,
    roles: frozenset[Role],
    gates: tuple[Gate, ...] = (),
    artifacts: tuple[Gate, ...] = (),
    effect: Effect,
    next_verbs: tuple[str, ...] = (),
    params: tuple[Param, ...] = (),
    command: str | None = None,
    executable: bool = True,
    title: str = "",
    output: Mapping[str, Any] | None = None,
    replay: str = "",
    idempotent: bool = False,
    destructive: bool = False,
) -> Verb:
    return Verb(
        name=name,
        summary=summary,
        roles=roles,
        preconditions=(role_gate(roles), *gates, *artifacts),
        effect=effect,
        next_verbs=next_verbs,
        params=params,
        command=command,
        executable=executable,
        title=title,
        output=output,
        replay=replay,
        idempotent=idempotent or effect == "read",
        destructive=destructive,
    )


_VERBS: tuple[Verb, ...] = (
    _verb(
        "allocate_next_work",
        "rank eligible issues and (with dry_run=false) lease the chosen one to an owner",
        roles=frozenset({"controller"}),
        effect="mutate",
        title="Allocate the next work",
        output=result({
            "decision": {"enum": ["select", "resume", "wait"]}, "fingerprint": out.TEXT,
            "fingerprint_parts": out.OBJECT, "considered": out.INTEGER,
            "ranked": out.array(out.obj({"rank": out.INTEGER, "issue_number": out.ISSUE})),
            "skipped": out.array(out.obj({"issue_number": out.ISSUE, "reason": out.TEXT})),
            "exclusions": out.OBJECT, "issue_number": out.nullable(out.ISSUE), "dry_run": out.BOOLEAN,
            "applied": out.BOOLEAN,
        }, {"lease": out.nullable(out.OBJECT), "outbox": out.OUTBOX, "candidate_source": out.STRING}),
        replay="an apply replayed with the same expected_fingerprint is refused stale_pin (the lease it made changed"
        " the inputs); without it the owner's live lease is resumed and nothing new is leased",
        idempotent=True,
        next_verbs=("bootstrap_issue_worktree",),
        params=(
            Param("owner", "login", "roster login that receives the lease (default: the only identity with the role)"),
            Param("action", "choice", "what the lease is for: implement (an author), review (a reviewer) or merge "
                  "(a merger, of a pull request whose approval counts on its head)",
                  default="implement", choices=("implement", "review", "merge")),
            Param("candidates_json", "candidates",
                  "candidate records (default: open status:ready issues from Gitea); only issue_number is required"),
            Param("exclude_issue_numbers", "issue_numbers",
                  "issues removed before ranking; never selected or leased (reason excluded_by_controller)"),
            Param("dry_run", "boolean", "decide only; apply with false", default=True),
            Param("expected_fingerprint", "fingerprint",
                  "the dry-run's fingerprint: apply refuses (stale_pin) if it changed"),
        ),
        command="/allocate",
    ),
    _verb(
        "bootstrap_issue_worktree",
        "create or recover the issue's branch and worktree under branches/",
        roles=frozenset({"author", "controller"}),  # a review or a merge needs no worktree
        gates=(PRECONDITION_OWNERSHIP,),
        effect="mutate",
        title="Bootstrap the issue's worktree",
        output=result({"status": out.TEXT, "issue_number": out.ISSUE, "proof": out.OBJECT},
                      {"idempotency_key": out.nullable(out.STRING), "phase": out.STRING, "replayed": out.BOOLEAN,
                       "journal": out.array(out.OBJECT), "outbox": out.OUTBOX}),
        replay="the same idempotency_key answers the finished transition from its journal (replayed: true) or resumes"
        " an unfinished one; without a key the registered worktree and branch are recovered, nothing is created twice",
        idempotent=True,
        next_verbs=("lock_issue",),
        params=(
            _issue(),
            Param("idempotency_key", "key", "replaying the same key returns or resumes the same transition"),
            Param("expected_base", "sha", "the default-branch SHA you expect; stale_pin if the live one differs"),
        ),
        command="/bootstrap",
    ),
    _verb(
        "lock_issue",
        "lock the issue to the owner's registered worktree",
        roles=frozenset({"author", "controller"}),
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE,),
        effect="mutate",
        title="Lock the issue to your worktree",
        output=result({"status": out.TEXT, "issue_number": out.ISSUE, "lock": out.OBJECT,
                       "already_locked": out.BOOLEAN}, {"proof": out.OBJECT}),
        replay="locking again answers the same lock (already_locked: true)",
        idempotent=True,
        next_verbs=("get_issue_state", "heartbeat_lease"),
        params=(_issue(),),
        command="/lock",
    ),
    _verb(
        "heartbeat_lease",
        "extend the live lease",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        title="Extend your lease",
        output=result({"issue_number": out.ISSUE, "lease": out.LEASE}),
        replay="each call extends the live lease again, from now (safe to retry)",
        next_verbs=("post_issue_state",),
        params=(_issue(),),
        command="/heartbeat",
    ),
    _verb(
        "release_lease",
        "end the live lease with a reason (recorded, never deleted)",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        title="Release a lease",
        output=result({"issue_number": out.ISSUE, "lease": out.LEASE, "outbox": out.OUTBOX},
                      {"already_ended": out.STRING, "auto_allocation": out.nullable(out.AUTO_ALLOCATION)}),
        replay="the lease has ended: a second release is refused (no live lease) and changes nothing; after a"
        " hand-over it answers the ended lease (already_ended)",
        idempotent=True,
        destructive=True,
        next_verbs=("get_runtime_context",),
        params=(_issue(), Param("reason", "text", "why the lease ends", default="released")),
        command="/release",
    ),
    _verb(
        "get_issue_state",
        "read the issue's latest Canonical Issue State",
        roles=ALL_ROLES,
        effect="read",
        title="Read the issue's state",
        output=result({"issue_number": out.ISSUE, "state": out.nullable(out.CANONICAL_STATE),
                       "lease": out.nullable(out.LEASE), "lease_live": out.BOOLEAN},
                      {"labels": out.STRINGS, "is_open": out.nullable(out.BOOLEAN),
                       "label_sync": out.nullable(out.STRING), "open_blockers": out.ISSUES,
                       "state_comment_id": out.nullable(out.INTEGER),
                       "note": {**out.STRING, "description": "instead of the labels: foreman has not seen the issue"}}),
        next_verbs=("post_issue_state",),
        params=(_issue(),),
    ),
    _verb(
        "post_issue_state",
        "post an evidence comment carrying a Canonical Issue State block",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        effect="mutate",
        title="Post the issue's state",
        output=result({"issue_number": out.ISSUE, "state": out.CANONICAL_STATE, "outbox": out.OUTBOX,
                       "queued": out.BOOLEAN}, {"note": out.STRING}),
        replay="the same state on the same basis is queued once (queued: false the second time)",
        idempotent=True,
        next_verbs=("open_pull_request", "release_lease"),
        params=(
            _issue(),
            Param("state", "state", "the new state", required=True),
            Param("summary", "text", "one-paragraph human summary above the block", max_length=600),
        ),
    ),
    _verb(
        "get_runtime_context",
        "read the caller's identity, roles, leases, the default-branch SHA and what to do next",
        roles=ALL_ROLES,
        effect="read",
        title="Where am I: identity, leases, next step",
        output=result({
            "identity": out.obj({"login": out.TEXT, "roles": out.STRINGS, "channel": out.TEXT}),
            "role": {"anyOf": [out.STRING, out.STRINGS]}, "repository": out.TEXT,
            "default_branch": out.obj({"name": out.nullable(out.STRING), "live_sha": out.nullable(out.SHA),
                                       "checkout_sha": out.nullable(out.SHA), "in_sync": out.nullable(out.BOOLEAN),
                                       "detail": out.STRING}),
            "leases": out.array(out.obj({**out.LEASE["properties"], "seconds_left": out.INTEGER,
                                         "handed_back": out.BOOLEAN},
                                        {"worktree_path": out.nullable(out.STRING)})),
            "callable_now": out.array(out.obj(
                {"tool": out.TEXT}, {"issue_numbers": {"anyOf": [out.ISSUES, {"const": "any"}]}})),
            "exact_next_action": out.TEXT,
        }, {"work_waiting": out.OBJECT}),
        next_verbs=("get_issue_state", "allocate_next_work"),
    ),
    _verb(
        "publish_worktree",
        "commit the worktree's changes with your message and push the issue branch (never forced)",
        roles=frozenset({"author"}),
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE, PRECONDITION_LOCK),
        effect="mutate",
        title="Commit and push the worktree",
        output=result({"issue_number": out.ISSUE, "branch": out.TEXT, "commit": out.SHA,
                       "parent": out.nullable(out.SHA), "publication": out.TEXT,
                       "read_back": out.obj({"branch": out.TEXT, "commit_id": out.SHA}), "outbox": out.OUTBOX,
                       "replayed": out.BOOLEAN},
                      {"remote_before": out.nullable(out.STRING), "caught_up": out.OBJECT}),
        replay="the same idempotency_key answers the same commit (replayed: true) or resumes its push; without a key a"
        " new call commits what changed since",
        idempotent=True,
        next_verbs=("open_pull_request", "get_issue_state"),
        params=(
            _issue(),
            Param("message", "commit_message", "the commit message: a subject line (at most 100 characters), then"
                  " optionally a blank line and a body of several lines", required=True,
                  max_length=MAX_COMMIT_MESSAGE),
            Param("idempotency_key", "key", "replaying the same key adopts the same commit and resumes its push"),
        ),
        command="/publish",
    ),
    _verb(
        "open_pull_request",
        "open the issue's pull request (head: the issue branch, base: the default branch; one per issue) and hand"
        " the issue to review: your lease ends (pull_request_opened)",
        roles=frozenset({"author"}),
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE, PRECONDITION_COMMITS),
        effect="mutate",
        title="Open the pull request",
        output=result({"issue_number": out.ISSUE, "pull_request": out.ISSUE, "head": out.TEXT,
                       "head_sha": out.SHA, "base": out.TEXT, "adopted": out.BOOLEAN,
                       "outbox": out.OUTBOX, "handed_over": out.HANDED_OVER},
                      {"url": out.STRING, "replayed": out.BOOLEAN,
                       "auto_allocation": out.nullable(out.AUTO_ALLOCATION)}),
        replay="the same idempotency_key answers the recorded pull request (replayed: true); the issue's one pull"
        " request is adopted, never opened twice",
        idempotent=True,
        next_verbs=("get_issue_state", "get_runtime_context"),
        params=(
            _issue(),
            Param("idempotency_key", "key", "replaying the same key answers the recorded pull request, after the"
                  " hand-over ended your lease"),
        ),
        command="/open-pr",
    ),
    _verb(
        "update_pull_request",
        "bring the issue's pull request up to date with its base on Gitea (merge the base in, or rebase onto it) as"
        " you, and hand the issue back to review: your implement lease ends (pull_request_updated)",
        roles=frozenset({"author"}),
        gates=(PRECONDITION_OWNERSHIP,),
        effect="mutate",
        title="Update the pull request from its base",
        output=result({"issue_number": out.ISSUE, "pull_request": out.ISSUE, "style": {"enum": ["merge", "rebase"]},
                       "base": out.TEXT, "base_sha": out.SHA, "head": out.TEXT, "head_before": out.SHA,
                       "head_sha": out.SHA, "contains_base": out.BOOLEAN, "adopted": out.BOOLEAN,
                       "outbox": out.OUTBOX, "handed_over": out.HANDED_OVER},
                      {"url": out.STRING, "re_review": out.BOOLEAN, "replayed": out.BOOLEAN,
                       "auto_allocation": out.nullable(out.AUTO_ALLOCATION)}),
        replay="the same style again answers the recorded update (replayed: true) without asking Gitea again",
        idempotent=True,
        destructive=True,
        next_verbs=("get_issue_state", "get_runtime_context"),
        params=(
            _issue(),
            Param("style", "choice", "how Gitea updates the branch: merge (a merge commit of the base, the default) or"
                  " rebase (the branch rebased onto the base and force-pushed)", default="merge",
                  choices=("merge", "rebase")),
        ),
        command="/update-pr",
    ),
    _verb(
        "assess_work_issue_duplicate",
        "find duplicate work on an issue: a linked open pull request, a conflicting branch, an active claim",
        roles=ALL_ROLES,
        effect="read",
        title="Find duplicate work on an issue",
        output=result({"issue_number": out.ISSUE, "phase": {"enum": ["pre_claim", "pre_pr"]},
                       "duplicate": out.BOOLEAN, "findings": out.array(out.obj({"kind": out.TEXT})),
                       "unchecked": out.STRINGS}),
        next_verbs=("get_issue_state", "allocate_next_work"),
        params=(
            _issue(),
            Param("phase", "choice", "when the assessment is made", default="pre_claim",
                  choices=("pre_claim", "pre_pr")),
        ),
    ),
    _verb(
        "claim_review",
        "claim the review of the issue's pull request: a review lease on it (status:review, nobody holds a lease)",
        roles=frozenset({"reviewer"}),
        gates=(PRECONDITION_NOT_PR_AUTHOR, PRECONDITION_NOT_IMPLEMENTER),
        artifacts=(PRECONDITION_PR_EXISTS, PRECONDITION_IN_REVIEW),
        effect="mutate",
        title="Claim a review",
        output=result({"issue_number": out.ISSUE, "lease": out.LEASE, "outbox": out.OUTBOX}),
        replay="a second claim while your review lease lives is refused conflict and changes nothing",
        idempotent=True,
        next_verbs=("submit_review", "heartbeat_lease"),
        params=(_issue(),),
        command="/claim-review",
    ),
    _verb(
        "submit_review",
        "record a verdict (approve or request_changes) on the pull request's current head; ends the review lease",
        roles=frozenset({"reviewer"}),
        gates=(PRECONDITION_OWNERSHIP, PRECONDITION_NOT_PR_AUTHOR, PRECONDITION_NOT_IMPLEMENTER),
        artifacts=(PRECONDITION_PR_EXISTS,),
        effect="mutate",
        title="Submit your review",
        output=result({"issue_number": out.ISSUE, "pull_number": out.ISSUE,
                       "verdict": {"enum": ["approve", "request_changes"]},
                       "review": out.obj({"id": out.INTEGER, "state": out.TEXT, "commit_id": out.SHA}),
                       "outbox": out.OUTBOX, "lease": out.LEASE},
                      {"author_lease": out.nullable(out.LEASE), "preempted": out.nullable(out.OBJECT),
                       "adopted": out.BOOLEAN, "auto_allocation": out.nullable(out.AUTO_ALLOCATION)}),
        replay="the recorded verdict is answered again (adopted: true); one review lease makes at most one Gitea"
        " review",
        idempotent=True,
        next_verbs=("get_issue_state", "get_runtime_context"),
        params=(
            _issue(),
            Param("verdict", "choice", "the review's verdict", required=True,
                  choices=("approve", "request_changes")),
            Param("body", "text", "what must change (required for request_changes)", max_length=2000),
        ),
    ),
    _verb(
        "merge_pull_request",
        "merge the approved pull request, pinned to exactly the approved commit",
        roles=frozenset({"merger"}),
        artifacts=(PRECONDITION_PR_EXISTS, PRECONDITION_PR_APPROVED),
        effect="mutate",
        title="Merge the approved pull request",
        output=result({"issue_number": out.ISSUE, "pull_number": out.ISSUE, "merged": out.BOOLEAN,
                       "merge_commit_sha": out.nullable(out.SHA), "approved_commit": out.nullable(out.SHA),
                       "outbox": out.OUTBOX},
                      {"gate": out.OBJECT, "adopted": out.BOOLEAN, "attempts": out.INTEGER,
                       "waited": out.array({**out.STRING, "description": "what a retry waited for"})}),
        replay="a merged pull request is adopted (adopted: true, one evidence comment); nothing is merged twice",
        idempotent=True,
        destructive=True,
        next_verbs=("get_issue_state",),
        params=(_issue(),),
        command="/merge",
    ),
    _verb(
        "read_issue",
        "read an issue of your repository: title, body, labels, assignees, milestone, its comments (paged; each with"
        " whether its author is trusted and whether it is foreman's evidence), its Canonical Issue State, linked pull"
        " requests and dependencies; a long body or comment is cut, with the argument that reads on",
        roles=ALL_ROLES,
        effect="read",
        title="Read an issue",
        output=result({"issue_number": out.ISSUE, "repository": out.TEXT}, {
            "title": out.STRING, "state": out.TEXT, "author": out.STRING, "created_at": out.nullable(out.STRING),
            "updated_at": out.nullable(out.STRING), "html_url": out.STRING, "labels": out.STRINGS,
            "assignees": out.STRINGS, "milestone": out.nullable(out.OBJECT), "body": out.STRING,
            "body_cut": out.nullable(out.obj({"read_rest": out.TEXT})),
            "comments": out.obj({"total": out.INTEGER, "items": out.array(out.obj(
                {"id": out.INTEGER, "author": out.STRING, "trusted": out.BOOLEAN, "evidence": out.BOOLEAN,
                 "body": out.STRING}, {"body_cut": out.nullable(out.OBJECT)}))}),
            "canonical_state": out.nullable(out.OBJECT),
            "pull_requests": out.array(out.obj({"number": out.ISSUE, "state": out.TEXT})),
            "dependencies": out.array(out.obj({"issue_number": out.ISSUE, "holds_back": out.BOOLEAN})),
            "unread": out.STRINGS, "note": out.TEXT}),
        next_verbs=("get_issue_state", "read_pull_request"),
        params=(
            _issue(),
            Param("page", "count", "the page of comments (1 = the first page in the chosen order)", default=1,
                  minimum=1, maximum=100_000),
            Param("per_page", "count", "comments a page (at most 50)", default=10, minimum=1, maximum=50),
            Param("newest_first", "boolean", "order the comments newest first (page 1: the latest)", default=False),
            Param("comment_id", "count", "read only this comment (its body from offset)", minimum=1),
            Param("offset", "count", "the character the body (or, with comment_id, that comment's body) starts at",
                  default=0),
            Param("repository", "repository", "the repository the issue is in, as owner/name (default: yours; an issue"
                  " of a repository foreman does not serve you is refused)"),
        ),
    ),
    _verb(
        "read_pull_request",
        "read an issue's pull request: title, body, head and base with their SHAs, mergeable, changed files, the"
        " unified diff (paged by file, bounded per call), reviews and whether foreman counts each, review comments"
        " and the head's combined commit status",
        roles=ALL_ROLES,
        effect="read",
        title="Read a pull request",
        output=result({"issue_number": out.ISSUE, "repository": out.TEXT}, {
            "pull_number": out.ISSUE, "title": out.STRING, "state": out.TEXT, "author": out.STRING,
            "html_url": out.STRING, "body": out.STRING, "body_cut": out.nullable(out.obj({"read_rest": out.TEXT})),
            "head": out.obj({"ref": out.STRING, "sha": out.STRING}),
            "base": out.obj({"ref": out.STRING, "sha": out.STRING}), "merge_base": out.STRING,
            "mergeable": out.BOOLEAN, "merged": out.BOOLEAN, "merge_commit_sha": out.nullable(out.SHA),
            "files": out.obj({"total": out.INTEGER, "complete": out.BOOLEAN, "items": out.array(out.obj(
                {"filename": out.STRING, "status": out.STRING, "additions": out.INTEGER,
                 "deletions": out.INTEGER}))}),
            "diff": out.obj({"page": out.INTEGER, "pages": out.INTEGER, "text": out.STRING,
                             "complete": out.BOOLEAN}),
            "reviews": out.array(out.obj({"id": out.INTEGER, "state": out.STRING, "counted": out.BOOLEAN})),
            "review_comments": out.array(out.OBJECT), "gate": out.OBJECT, "not_counted": out.array(out.OBJECT),
            "commit_status": out.nullable(out.OBJECT), "unread": out.STRINGS, "note": out.TEXT}),
        next_verbs=("read_issue", "get_issue_state"),
        params=(
            _issue("the issue whose pull request to read (or the pull request's own number)"),
            Param("file", "text", "only this file's diff (a filename from files[])", max_length=1000),
            Param("page", "count", "the page of the diff (with file: of that file's diff)", default=1, minimum=1,
                  maximum=100_000),
            Param("offset", "count", "the character the pull request's body starts at", default=0),
            Param("repository", "repository", "the repository the pull request is in, as owner/name (default: yours;"
                  " one of a repository foreman does not serve you is refused)"),
        ),
    ),
)

VERBS: Mapping[str, Verb] = MappingProxyType({v.name: v for v in _VERBS})
TOOLS: Mapping[str, Verb] = MappingProxyType({v.tool: v for v in _VERBS})
COMMANDS: Mapping[str, Verb] = MappingProxyType({v.command: v for v in _VERBS if v.command and v.executable})


def _check_table() -> None:
    if len(VERBS) != len(_VERBS) or len(TOOLS) != len(_VERBS):
        raise ValueError("verb names and MCP tool names must be unique")
    for verb in _VERBS:
        unknown = [n for n in verb.next_verbs if n not in VERBS]
        if unknown:
            raise ValueError(f"{verb.name}: next verbs {unknown} are not in the table")
    commands = [v.command for v in _VERBS if v.command]
    if len(set(commands)) != len(commands):
        raise ValueError("comment commands must be unique")
    for verb in _VERBS:
        if not verb.title or verb.output is None:
            raise ValueError(f"{verb.name}: declare its title and its result (title=..., output=result(...))")
        if verb.effect == "mutate" and not verb.replay:
            raise ValueError(f"{verb.name}: a write verb says in one line what a replay does (replay=...)")
        unworded = [p.key for p in verb.preconditions if not p.words]
        if unworded:
            raise ValueError(f"{verb.name}: gates {unworded} need words for the tool's description")
        jsonschema.Draft202012Validator.check_schema(verb.input_schema())
        jsonschema.Draft202012Validator.check_schema(verb.output_schema())
        for param in verb.params:
            validators(param)  # built (and checked) once, at import: no call pays for it


_check_table()


def mcp_tool_names(*, executable_only: bool = False) -> tuple[str, ...]:
    """Every verb's MCP tool name in table order (``executable_only``: the tools an MCP server offers)."""
    return tuple(v.tool for v in _VERBS if v.executable or not executable_only)


def evaluate(verb_name: str, context: GatewayContext) -> Decision:
    """Decide whether ``context.caller`` may run ``verb_name`` now (seed 001 rule).

    An unknown verb is refused as ``invalid_input`` naming the known verbs.
    """
    verb = VERBS.get(verb_name)
    if verb is None:
        known = ", ".join(VERBS)
        return Decision.reject(
            kind="invalid_input",
            message=f"unknown verb {verb_name!r}",
            remediate=f"use one of: {known}",
            exact_next_action="call gitea_get_runtime_context to see what you can do",
        )
    if not context.caller_roles:  # no role at all: told to ask an operator, never to call a tool it lacks
        return evaluate_preconditions((ON_ROSTER,), context)
    return evaluate_preconditions(verb.preconditions, context)


def render_verb_table_markdown() -> str:
    """The verb table for docs: one row per verb, preconditions in evaluation order with their kind."""
    lines = [
        "| verb | MCP tool | comment command | roles | effect | preconditions (in order) | next |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in _VERBS:
        roles = "any roster role" if v.roles == ALL_ROLES else ", ".join(sorted(v.roles))
        pre = "; ".join(f"`{p.key}` ({p.rejection_kind})" for p in v.preconditions)
        nxt = ", ".join(f"`{n}`" for n in v.next_verbs) or "-"
        tool = f"`{v.tool}`" if v.executable else f"`{v.tool}` (gateway only, not offered yet)"
        command = f"`{v.command}`" if v.command and v.executable else "-"
        lines.append(f"| `{v.name}` | {tool} | {command} | {roles} | {v.effect} | {pre} | {nxt} |")
    return "\n".join(lines) + "\n"


def render_params_markdown() -> str:
    """Every offered tool's arguments for docs: name, JSON type, required/default, meaning."""
    lines: list[str] = []
    for v in _VERBS:
        if not v.executable:
            continue
        lines.append(f"### `{v.tool}`\n\n{v.summary}.\n")
        if not v.params:
            lines.append("No arguments.\n")
            continue
        lines.append("| argument | JSON type | required / default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        for p in v.params:
            schema = p.schema()
            kind = schema.get("type") or " or ".join(str(a.get("type")) for a in schema.get("anyOf", []))
            if schema.get("type") == "array":
                kind = f"array of {schema['items'].get('type', 'object')}"
            need = "required" if p.required else "-"
            if p.default is not None:
                need = f"default `{_json_value(p.default)}`"
            lines.append(f"| `{p.name}` | {kind} | {need} | {p.description} |")
        lines.append("")
    return "\n".join(lines)


def _json_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


#: The values the tools table's example calls use, by argument kind (bot/core/verb_params.py).
_EXAMPLE_VALUES: dict[str, object] = {
    "issue_number": 42, "login": "author-1", "text": "done", "key": "k-1", "sha": "0" * 40, "fingerprint": "0" * 64,
    "boolean": True, "issue_numbers": [41], "repository": "org/repo",
    "commit_message": "Paint the widget blue\n\nThe issue asks for blue; widget.txt holds the colour.",
    "state": {"state": "in-progress", "who_is_next": "author", "next_action": "publish with gitea_publish_worktree",
              "next_prompt": "", "what_happened": "widget painted", "why": "the issue asks for it",
              "related_prs": [], "blockers": "none", "validation": "tests pass"},
}


def example_arguments(verb: Verb) -> dict[str, object]:
    """A valid call of ``verb``: its required arguments with example values (checked by ``check_arguments``)."""
    out: dict[str, object] = {}
    for param in verb.params:
        if param.required:
            out[param.name] = param.choices[0] if param.choices else _EXAMPLE_VALUES[param.kind]
    return out


def _example_value(name: str, schema: Mapping[str, Any]) -> str:
    if "const" in schema:
        return _json(schema["const"])
    if "enum" in schema:
        return _json(schema["enum"][0])
    if "anyOf" in schema:
        return _example_value(name, schema["anyOf"][0])
    kind = schema.get("type")
    if kind == "integer":
        return {"issue_number": "42", "pull_request": "7", "pull_number": "7"}.get(name, "1")
    if kind == "boolean":
        return "true"
    if kind == "object":
        return "{…}"
    if kind == "array":
        return "[…]"
    return '"…"'


def _json(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def example_answer(verb: Verb) -> str:
    """The keys every success of ``verb`` answers, with example values (from its declared result)."""
    schema = verb.output_schema()["anyOf"][0]
    parts = [f'"{key}": {_example_value(key, schema["properties"][key])}' for key in schema["required"]]
    return "{" + ", ".join(parts) + "}"


def render_tools_markdown() -> str:
    """Every offered tool in one table for docs: title, who may call it, effect (with its MCP hints), what a replay
    does, and an example call with the keys of its answer."""
    lines = [
        "| tool | title | who may call it | effect | replay | example call → answer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for v in _VERBS:
        if not v.executable:
            continue
        who, when = v.who_and_when()
        if when:
            who = f"{who}; when {'; '.join(when)}"
        hints = ["read-only"] if v.effect == "read" else ["writes"]
        if v.effect != "read" and v.idempotent:
            hints.append("idempotent")
        if v.effect != "read" and v.destructive:
            hints.append("destructive")
        replay = v.replay or "changes nothing"
        call = _json(example_arguments(v))
        cell = f"`{v.tool}` `{call}` → `{example_answer(v)}`".replace("|", "\\|")
        lines.append(f"| `{v.tool}` | {v.title} | {who} | {', '.join(hints)} | {replay} | {cell} |")
    return "\n".join(lines) + "\n"
