"""Comment commands (`/allocate`, `/bootstrap`, `/lock`, `/release`, `/publish`, ...): verbs answered by a reply."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gidgethub import sansio

from bot.config import Settings
from bot.core.dispatch import OrderedRouter
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence, render_failure
from bot.core.verbs import COMMANDS, Verb
from bot.core.vocabulary import MAX_ISSUE_NUMBER, is_issue_number
from bot.verbs.runtime import VerbResult, caller_for
from bot.worker import HandlerContext
from state.outbox import OutboxIntent, OutboxStore
from state.reconcile import CommandClaims

router = OrderedRouter()

USAGE: dict[str, str] = {
    "/allocate": "/allocate [--dry-run] [--exclude 617,618 ...] [--owner LOGIN]",
    "/bootstrap": "/bootstrap [--expected-base SHA] [--key KEY]",
    "/lock": "/lock",
    "/heartbeat": "/heartbeat",
    "/release": "/release [REASON ...]",
    "/claim-review": "/claim-review",
    "/merge": "/merge",
    "/publish": "/publish MESSAGE ...",
    "/open-pr": "/open-pr",
    "/update-pr": "/update-pr [--style merge|rebase]",
}


@dataclass(frozen=True, slots=True)
class CommentCommand:
    """A parsed command: the verb it names and the tool arguments it carries (without ``issue_number``)."""

    word: str
    verb: Verb
    arguments: dict[str, Any] = field(default_factory=dict)


class CommandError(ValueError):
    """A command line that cannot be read; the reply says how to write it."""

    def __init__(self, word: str, message: str) -> None:
        super().__init__(message)
        self.word = word


_ISSUE_REF = re.compile(r"#?([0-9]{1,19})")


def _issue_numbers(word: str, value: str) -> list[int]:
    """Every element of ``617,#618`` or a refusal: never a silent subset (no empty or out-of-range elements)."""
    numbers: list[int] = []
    for part in value.split(","):
        found = _ISSUE_REF.fullmatch(part)
        number = int(found.group(1)) if found else 0
        if not is_issue_number(number):
            shown = part if len(part) <= 40 else f"{part[:20]}... ({len(part)} characters)"
            raise CommandError(
                word,
                f"--exclude takes issue numbers (1 to {MAX_ISSUE_NUMBER}) separated by commas; {shown!r} in "
                f"{value if len(value) <= 80 else value[:60] + '...'!r} is not one",
            )
        numbers.append(number)
    return numbers


def _options(
    word: str, words: list[str], flags: dict[str, str], values: dict[str, str], lists: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``flags``: switch → argument set to True; ``values``: option → argument taking the next word.

    An option in ``lists`` may be repeated (its values are collected in order); any other option given twice
    is refused, because keeping either value would silently drop the other.
    """
    arguments: dict[str, Any] = {}
    position = 0
    while position < len(words):
        item = words[position]
        if item in flags:
            arguments[flags[item]] = True
        elif item in values:
            if position + 1 >= len(words):
                raise CommandError(word, f"{item} needs a value")
            position += 1
            if item in lists:
                arguments.setdefault(values[item], []).append(words[position])
            elif values[item] in arguments:
                raise CommandError(word, f"{item} given more than once; give it once")
            else:
                arguments[values[item]] = words[position]
        else:
            raise CommandError(word, f"unknown argument {item!r}")
        position += 1
    return arguments


def _arguments(word: str, words: list[str]) -> dict[str, Any]:
    if word == "/allocate":
        found = _options(word, words, {"--dry-run": "dry_run"},
                         {"--exclude": "exclude_issue_numbers", "--owner": "owner"}, frozenset({"--exclude"}))
        if "exclude_issue_numbers" in found:
            found["exclude_issue_numbers"] = sorted(
                {number for value in found["exclude_issue_numbers"] for number in _issue_numbers(word, value)}
            )
        if "owner" in found:
            found["owner"] = found["owner"].lstrip("@")
        found["dry_run"] = bool(found.get("dry_run", False))  # a comment applies unless it says --dry-run
        return found
    if word == "/bootstrap":
        return _options(word, words, {}, {"--expected-base": "expected_base", "--key": "idempotency_key"})
    if word == "/update-pr":
        return _options(word, words, {}, {"--style": "style"})
    if word == "/release":
        if any(w.startswith("--") for w in words):
            raise CommandError(word, "the reason is plain words; /release takes no options")
        return {"reason": " ".join(words)} if words else {}
    if word == "/publish":
        if not words or any(w.startswith("--") for w in words):
            raise CommandError(word, "the commit message is plain words after /publish; it takes no options")
        return {"message": " ".join(words)}
    if words:
        raise CommandError(word, f"{word} takes no arguments")
    return {}


def parse_command(body: str) -> CommentCommand | None:
    """The command on the comment's first non-blank line, or None if that line is not a command.

    The command is the line's first word; its arguments are the rest of that line, split on whitespace (never a
    shell); unknown options and malformed values raise CommandError. Fail closed: ``--exclude`` may be repeated
    and every value counts; any other option given twice, or an empty or out-of-range element, is refused.
    The commands and their verbs are tabled in docs/mcp.md ("Comment commands").
    """
    lines = [line.strip() for line in body.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines:
        return None
    words = lines[0].split()
    verb = COMMANDS.get(words[0])
    if verb is None:
        return None
    return CommentCommand(word=words[0], verb=verb, arguments=_arguments(words[0], words[1:]))


def _reply_body(key: str, command: CommentCommand, result: VerbResult) -> str:
    doc = result.doc
    what = f"`{command.word}`"
    if result.refusal is not None:
        evidence = {} if doc == result.refusal.to_dict() else {"result": doc}
        return render_failure(key=key, what=what, envelope=result.refusal, evidence=evidence)
    if command.verb.name == "allocate_next_work":
        return _allocate_reply(key, command, doc)
    issue, lease = doc.get("issue_number"), doc.get("lease") or {}
    if command.verb.name == "heartbeat_lease":
        lead, summary = f"{what}: ", f"the lease on #{issue} now runs until {lease.get('expires_at')}."
    elif command.verb.name == "release_lease":
        lead, summary = f"{what}: ", f"the lease on #{issue} is released ({lease.get('end_reason')})."
    else:
        lead, summary = f"{what} ", f"done on #{issue}: {doc.get('status', 'ok')}."
    return render_evidence(key=key, summary=summary, state=None, evidence=doc, lead=lead)


def _allocate_reply(key: str, command: CommentCommand, doc: dict[str, Any]) -> str:
    dry_run = bool(command.arguments.get("dry_run"))
    verb = "Dry run" if dry_run else "Allocation"
    kind = doc.get("decision")
    if kind in ("select", "resume"):
        what = f"would lease #{doc['issue_number']}" if dry_run else f"#{doc['issue_number']} ({kind})"
    else:
        what = f"nothing to allocate ({doc.get('wait_reason', kind)})"
    summary = f"{verb}: {what}; fingerprint {doc.get('fingerprint')}; {len(doc.get('skipped', []))} skipped."
    evidence = {k: doc.get(k) for k in ("decision", "issue_number", "fingerprint", "skipped", "ranked", "lease")}
    return render_evidence(key=key, summary=summary, state=None, evidence=evidence)


def _is_configured_repo(data: dict[str, Any], settings: Settings) -> bool:
    full_name = str((data.get("repository") or {}).get("full_name") or "")
    return full_name.lower() == settings.repo_key


class BootstrapUnavailable(RuntimeError):
    """Gitea could not serve the command (or the bootstrap an `/allocate` ran) now: the delivery is retried."""


def _not_run(key: str, word: str, problem: CommandError | None, number: int, comment_id: int, *,
             on_pull: bool) -> str:
    """The reply to a command that runs no verb: written on a pull request (issue verbs act on the issue the comment
    is on; a pull request is not a work issue), or not understood."""
    if on_pull:
        envelope = Envelope(
            error="invalid_input",
            message=f"`{word}` was written on pull request #{number}; comment commands act on issues only",
            remediate="Write the command on the issue the pull request implements; nothing was run.",
            exact_next_action=f"post the command as a comment on the work issue: {USAGE.get(word, word)}",
        )
    else:
        assert problem is not None
        word = problem.word
        envelope = Envelope(
            error="invalid_input",
            message=str(problem),
            remediate=f"Write the command as {USAGE[word]}.",
            exact_next_action=f"post a new comment: {USAGE[word]}",
        )
    return render_failure(key=key, what=f"`{word}`", envelope=envelope, evidence={"comment": comment_id})


@router.register("issue_comment", action="created")
async def on_command(event: sansio.Event, ctx: HandlerContext) -> None:
    """Run a comment's command through the gateway and reply (through the outbox) with the result.

    Issue verbs act on the issue the comment is on, as the comment's author with its roster roles; anyone the
    gateway refuses gets the refusal as the reply. A command written on a pull request (the payload's issue has
    ``pull_request``) is refused with an ``invalid_input`` reply and runs no verb.
    """
    data: dict[str, Any] = event.data
    comment, issue = data.get("comment") or {}, data.get("issue") or {}
    try:
        command = parse_command(str(comment.get("body") or ""))
        problem: CommandError | None = None
    except CommandError as exc:
        command, problem = None, exc
    if command is None and problem is None:
        return
    settings, db = ctx.deps.settings, ctx.deps.db
    if not _is_configured_repo(data, settings):
        ctx.log.info("command on another repository ignored")
        return
    actor = str((comment.get("user") or {}).get("login") or "")
    number, comment_id = int(issue["number"]), int(comment["id"])
    key = f"command:{comment_id}:reply"
    # Once per comment, whatever brought it (the webhook, a late copy of it, Gitea's Replay, catch-up, a forced
    # `foreman replay`): the first delivery to claim the comment runs the command; its own retries keep the claim
    # until the command finished; after that, and for any other delivery, the claim is found here.
    claims, repo = CommandClaims(db), str(data["repository"]["full_name"])
    word = command.word if command is not None else problem.word if problem is not None else ""
    held = await claims.claim(repo, comment_id, word, event.delivery_id)
    if held is not None:
        ctx.log.info(
            "comment %d on #%d: its command already ran for delivery %s (%s); nothing to do", comment_id, number,
            held.delivery_id, f"finished {held.finished_at}" if held.finished_at else "not finished: that delivery"
            " runs it",
        )
        return
    on_pull = bool(issue.get("pull_request")) or data.get("is_pull") is True
    if on_pull or command is None:
        body = _not_run(key, word, problem, number, comment_id, on_pull=on_pull)
        if on_pull:
            ctx.log.info("%s by %s on pull request #%d refused: commands act on issues", word, actor, number)
    else:
        runtime = ctx.deps.door
        arguments = dict(command.arguments)
        if command.verb.issue_scoped:
            arguments["issue_number"] = number
        caller = caller_for(settings, actor, "comment")
        result = await runtime.call(command.verb.name, caller, arguments, delivery_id=event.delivery_id)
        if result.refusal is not None and result.refusal.error == "unavailable":
            # Gitea (or another dependency) could not answer now: no reply yet; the worker retries the delivery
            # with backoff, and the reply is posted once, with the real result.
            raise BootstrapUnavailable(f"{command.word}: {result.refusal.message}")
        body = _reply_body(key, command, result)
        ctx.log.info(
            "%s by %s on #%d: %s", command.word, actor, number, "ok" if result.ok else result.doc.get("error")
        )
    reply = OutboxIntent(key, number, "comment", {"body": body}, event.delivery_id, repo=settings.repo_key)
    bootstrap = result.doc.get("bootstrap") if command is not None and not on_pull and result.ok else None
    if isinstance(bootstrap, dict) and bootstrap.get("error") == "unavailable":
        # The lease stands but its server-side bootstrap could not reach Gitea now: failing the handler makes the
        # worker retry the delivery with backoff; the retry (the claim is not finished) resumes the lease and
        # resumes the bootstrap (the reply has a fixed key, so it is posted once).
        await OutboxStore(db).add(reply)
        raise BootstrapUnavailable(f"#{bootstrap.get('issue_number', number)}: {bootstrap.get('message')}")
    await claims.finish(repo, comment_id, event.delivery_id, reply)
