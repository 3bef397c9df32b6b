"""Comment commands: `/allocate [--dry-run] [--exclude 617,618] [--owner LOGIN]` on an issue, by a controller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gidgethub import routing, sansio

from bot.allocation import AllocationCall, AllocationOutcome, Allocator
from bot.config import Settings
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence, render_failure
from bot.worker import HandlerContext
from state.db import Database
from state.outbox import OutboxIntent, OutboxStore

router = routing.Router()

COMMAND = "/allocate"
USAGE = "/allocate [--dry-run] [--exclude 617,618] [--owner LOGIN]"


@dataclass(frozen=True, slots=True)
class AllocateCommand:
    dry_run: bool
    exclude: list[int] | None
    owner: str | None


class CommandError(ValueError):
    """A command line that cannot be read; the reply says how to write it."""


def parse_command(body: str) -> AllocateCommand | None:
    """The `/allocate` command on the comment's first non-blank line, or None if there is none.

    Plain whitespace splitting (never a shell); unknown flags and malformed numbers are errors.
    """
    lines = [line.strip() for line in body.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0].split()[0] != COMMAND:
        return None
    words = lines[0].split()[1:]
    dry_run, exclude, owner = False, None, None
    position = 0
    while position < len(words):
        word = words[position]
        if word == "--dry-run":
            dry_run = True
        elif word in ("--exclude", "--owner"):
            if position + 1 >= len(words):
                raise CommandError(f"{word} needs a value")
            value = words[position + 1]
            position += 1
            if word == "--owner":
                owner = value.lstrip("@")
            else:
                parts = [p for p in value.split(",") if p]
                if not parts or not all(p.lstrip("#").isdigit() and int(p.lstrip("#")) > 0 for p in parts):
                    raise CommandError(f"--exclude takes issue numbers separated by commas, got {value!r}")
                exclude = [int(p.lstrip("#")) for p in parts]
        else:
            raise CommandError(f"unknown argument {word!r}")
        position += 1
    return AllocateCommand(dry_run=dry_run, exclude=exclude, owner=owner)


def _default_owner(settings: Settings) -> str | None:
    authors = [login for login, roles in settings.roster.items() if "author" in roles]
    return authors[0] if len(authors) == 1 else None


def _reply_body(key: str, outcome: AllocationOutcome, command: AllocateCommand) -> str:
    doc = outcome.to_dict()
    if outcome.exit_code != 0 and outcome.refusal is not None:
        return render_failure(key=key, what="/allocate", envelope=outcome.refusal, evidence={"result": doc})
    if outcome.exit_code != 0 and outcome.decision is not None and hasattr(outcome.decision, "envelope"):
        envelope: Envelope = outcome.decision.envelope
        return render_failure(key=key, what="/allocate", envelope=envelope, evidence={"result": doc})
    verb = "Dry run" if command.dry_run else "Allocation"
    kind = doc.get("decision")
    if kind in ("select", "resume"):
        what = f"would lease #{doc['issue_number']}" if command.dry_run else f"#{doc['issue_number']} ({kind})"
    else:
        what = f"nothing to allocate ({doc.get('wait_reason', kind)})"
    summary = f"{verb}: {what}; fingerprint {doc.get('fingerprint')}; {len(doc.get('skipped', []))} skipped."
    evidence = {k: doc.get(k) for k in ("decision", "issue_number", "fingerprint", "skipped", "ranked", "lease")}
    return render_evidence(key=key, summary=summary, state=None, evidence=evidence)


@router.register("issue_comment", action="created")
async def on_allocate_command(event: sansio.Event, ctx: HandlerContext) -> None:
    data: dict[str, Any] = event.data
    comment, issue = data.get("comment") or {}, data.get("issue") or {}
    problem: str | None = None
    try:
        command = parse_command(str(comment.get("body") or ""))
    except CommandError as exc:
        command, problem = None, str(exc)
    if command is None and problem is None:
        return
    settings: Settings = ctx.deps["settings"]
    db: Database = ctx.deps["db"]
    service = ctx.deps.get("service")
    actor = str((comment.get("user") or {}).get("login") or "")
    number, comment_id = int(issue["number"]), int(comment["id"])
    key = f"command:{comment_id}:reply"
    owner = (command.owner or _default_owner(settings)) if command is not None else None
    if command is None or not owner:
        envelope = Envelope(
            error="invalid_input",
            message=problem or "no --owner given and the roster has no single author to default to",
            remediate=f"Write the command as {USAGE}.",
            exact_next_action=f"post a new comment: {USAGE}",
        )
        body = render_failure(key=key, what="/allocate", envelope=envelope, evidence={"comment": comment_id})
    else:
        allocator = Allocator(db, settings, ctx.deps.get("gitea"), bot_login=getattr(service, "bot_login", "") or "")
        outcome = await allocator.run(
            AllocationCall(
                actor=actor,
                owner=owner,
                exclude_issue_numbers=command.exclude,
                dry_run=command.dry_run,
                delivery_id=event.delivery_id,
            )
        )
        body = _reply_body(key, outcome, command)
        ctx.log.info("/allocate by %s on #%d: %s", actor, number, outcome.to_dict().get("decision"))
    await OutboxStore(db).add(OutboxIntent(key, number, "comment", {"body": body}, event.delivery_id))
    if service is not None:
        service.outbox_wakeup()
